#!/usr/bin/env python3
"""Reports import cycles between the modules of each crate under crates/, and between the Python
scripts under scripts/.

    scripts/check-cycles.py [--crate NAME]... [--root DIR]

Exit status 0 when nothing has a cycle, 1 when something has, 2 on a usage error. With --crate,
only the crates named are checked.

The graph, per crate (its src/ tree):
- A module is a file: src/a.rs and src/a/mod.rs are module `a`, src/a/b.rs is `a::b`, the crate
  root (lib.rs or main.rs) is `crate`. Inline `mod x { ... }` blocks belong to their file.
- `mod` declarations are containment, not edges. A reference between a module and one of its
  own ancestors or descendants (a scenario calling `super::conclude`, a `mod.rs` re-exporting
  its child) is containment too: a parent and its children are one room.
- Every other reference from module A to module B is an edge A -> B. References are the paths
  of `use` items (with their `{...}` groups expanded) and paths written in code, that start
  with `crate::`, `super::` or `self::`. A path names the longest prefix of it that is a module
  of the crate (`crate::node::ApiError` -> `node`).
- Code inside `#[cfg(test)]` items (the `mod tests` beside the code) is left out: tests may
  reach across the crate without shaping it. Comments and string literals are left out.
- A cycle is a strongly connected component of more than one module. Each is printed with
  the edges inside it and, for every edge, the first place that makes it.

Paths through re-exports at the crate root (`crate::CommonArgs`) name the root and so no edge;
macros and `#[path]` attributes are not followed.

The Python scripts under scripts/ are top-level modules that import one another by name once
their folder is on sys.path (`from bench_dashboards import Dashboards`). import-linter, which
checks the Python client's package in `make lint`, builds graphs of packages only and cannot read
them. Here a module is a file, and every `import x` / `from x import ...` of a sibling is an edge
wherever it stands (in a function, under `if TYPE_CHECKING:`): a deferred import is still a cycle.
"""

import argparse
import ast
import os
import re
import sys


def strip_code(text):
    """Returns text with comments, string and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 260]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}'), else a lifetime ('a) left as it is.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def item_end(code, start):
    """The end of the item starting at `start`: after its matching `}`, or its `;`."""
    i = start
    while i < len(code) and code[i] not in "{;":
        i += 1
    if i >= len(code) or code[i] == ";":
        return i + 1
    depth = 0
    while i < len(code):
        if code[i] == "{":
            depth += 1
        elif code[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(code)


def drop_test_items(code):
    """Blanks every item under `#[cfg(test)]` (newlines kept, so line numbers hold)."""
    pattern = re.compile(r"#\[cfg\(test\)\]")
    while True:
        m = pattern.search(code)
        if not m:
            return code
        end = item_end(code, m.end())
        code = code[:m.start()] + re.sub(r"[^\n]", " ", code[m.start():end]) + code[end:]


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    m = re.search(r"\{", tree)
    if not m:
        return [tree]
    prefix = tree[:m.start()]
    depth, parts, cur = 0, [], ""
    body = tree[m.end():tree.rfind("}")]
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p:
            out.extend(prefix + q for q in expand_use_tree(p))
    return out


PATH = re.compile(r"(?<![\w:])((?:crate|super|self)(?:::(?:super|[A-Za-z_]\w*))+)")
USE = re.compile(r"\buse\s+([^;]+);")


def references(code):
    """(line, path) for every crate-relative path in the (stripped) code."""
    refs = []
    for m in USE.finditer(code):
        line = code.count("\n", 0, m.start()) + 1
        for path in expand_use_tree(m.group(1)):
            path = re.sub(r"\bas\b.*$", "", path.replace("::as", " as")).strip()
            path = path.split(" ")[0]
            if re.match(r"(crate|super|self)(::|$)", path):
                refs.append((line, path))
    used = re.sub(r"\buse\s+[^;]+;", lambda m: re.sub(r"[^\n]", " ", m.group(0)), code)
    for m in PATH.finditer(used):
        refs.append((used.count("\n", 0, m.start()) + 1, m.group(1)))
    return refs


def module_of(rel):
    """src-relative file path -> module path tuple (None for files outside the tree)."""
    parts = rel.split(os.sep)
    if parts[0] in ("bin", "tests", "benches", "examples"):
        return None
    if parts == ["lib.rs"] or parts == ["main.rs"]:
        return ()
    last = parts[-1][:-3]
    parts = parts[:-1] if last == "mod" else parts[:-1] + [last]
    return tuple(parts)


def resolve(path, here, modules):
    """The module a path names, seen from module `here`; None when it leaves the crate."""
    segs = path.split("::")
    if segs[0] == "crate":
        base, rest = (), segs[1:]
    else:
        base = here
        # `self` and `super` count from the module (src/a/b.rs and src/a/b/mod.rs alike).
        rest = segs
        while rest and rest[0] in ("self", "super"):
            if rest[0] == "super":
                if not base:
                    return None
                base = base[:-1]
            rest = rest[1:]
    best = base
    cur = base
    for s in rest:
        cur = cur + (s,)
        if cur in modules:
            best = cur
        else:
            break
    return best


def related(a, b):
    return a[:len(b)] == b or b[:len(a)] == a


def scc(nodes, edges):
    """Tarjan's strongly connected components."""
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return comps


def name(m):
    return "::".join(m) if m else "crate"


def check_crate(crate_dir):
    """Returns (modules, edges {a: {b: (file, line)}}, cycles) for one crate."""
    src = os.path.join(crate_dir, "src")
    files = {}
    for dirpath, _, filenames in os.walk(src):
        for f in filenames:
            if f.endswith(".rs"):
                full = os.path.join(dirpath, f)
                m = module_of(os.path.relpath(full, src))
                if m is not None:
                    files[full] = m
    modules = set(files.values())
    edges = {}
    for full, here in sorted(files.items()):
        with open(full, encoding="utf-8") as fh:
            code = drop_test_items(strip_code(fh.read()))
        for line, path in references(code):
            target = resolve(path, here, modules)
            if target is None or related(here, target):
                continue
            edges.setdefault(here, {}).setdefault(target, (os.path.relpath(full), line))
    comps = [c for c in scc(modules, edges) if len(c) > 1]
    return modules, edges, comps


def check_scripts(script_dir):
    """Returns (modules, edges {a: {b: (file, line)}}, cycles) for a folder of Python scripts."""
    files = {os.path.join(script_dir, f): (f[:-3],) for f in os.listdir(script_dir) if f.endswith(".py")}
    modules = set(files.values())
    edges = {}
    for full, here in sorted(files.items()):
        with open(full, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), full)
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        for node in sorted(imports, key=lambda n: n.lineno):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                names = [node.module] if node.level == 0 and node.module else []
            for target in {(n.split(".")[0],) for n in names}:
                if target in modules and target != here:
                    edges.setdefault(here, {}).setdefault(target, (os.path.relpath(full), node.lineno))
    comps = [c for c in scc(modules, edges) if len(c) > 1]
    return modules, edges, comps


def report(label, modules, edges, comps):
    """Prints one graph's verdict; returns how many cycles it has."""
    if not comps:
        print(f"{label}: {len(modules)} modules, no cycles")
        return 0
    for comp in comps:
        members = set(comp)
        print(f"{label}: cycle between {', '.join(name(m) for m in comp)}")
        for a in comp:
            for b, (f, line) in sorted(edges.get(a, {}).items()):
                if b in members:
                    print(f"    {name(a)} -> {name(b)}  ({f}:{line})")
    return len(comps)


def main():
    ap = argparse.ArgumentParser(description="Reports import cycles between the modules of each crate and between the Python scripts.")
    ap.add_argument("--crate", action="append", default=[], help="only this crate (directory name under crates/); repeatable")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."), help="the workspace")
    args = ap.parse_args()
    crates_dir = os.path.join(args.root, "crates")
    all_crates = sorted(d for d in os.listdir(crates_dir) if os.path.isdir(os.path.join(crates_dir, d, "src")))
    for c in args.crate:
        if c not in all_crates:
            print(f"check-cycles: no crate {c!r} (have {', '.join(all_crates)})", file=sys.stderr)
            return 2
    os.chdir(args.root)
    found = 0
    for crate in args.crate or all_crates:
        found += report(crate, *check_crate(os.path.join("crates", crate)))
    if not args.crate:
        found += report("scripts (Python)", *check_scripts("scripts"))
    if found:
        print(f"{found} cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
