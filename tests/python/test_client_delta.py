"""The Python client package (clients/python) on delta subscriptions, filters and tags, against
the scripted node of test_client_package.py (no binary): Fossil deltas rebuilt across pushes in
JSON and MessagePack, a delta that cannot be applied (a huge declared size, a bad checksum)
recovered by resubscribing, a gap only where history no longer holds it; the client's own
delta decoder (`switchboard_client.fossil`) against deltas made by the Rust crate and the npm
package; filters passed through, their holes never reported as gaps; tags published and read."""

from __future__ import annotations

import asyncio
import base64
import json
import pathlib
import random
import shutil
import subprocess
import time

import pytest

from switchboard_client import Client, Gap, Position, Publication
from switchboard_client.fossil import DIGITS, DeltaError, apply, checksum, output_size
from switchboard_client.subscription import Entry
from test_client_package import WAIT, ScriptedNode, run, take

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "fossil-deltas.json"
NPM_PACKAGE = REPO / "web" / "node_modules" / "fossil-delta" / "fossil-delta.js"
MAX = 1 << 20


def b64(n: int) -> bytes:
    """`n` as the format's base-64 integer."""
    out = b""
    while True:
        out = DIGITS[n & 63:(n & 63) + 1] + out
        n >>= 6
        if not n:
            return out


def simple_delta(old: bytes, new: bytes) -> bytes:
    """A valid delta from `old` to `new`: copy the common prefix and suffix, insert the middle.
    (What a node sends is tested against the real encoders below.)"""
    p = 0
    while p < min(len(old), len(new)) and old[p] == new[p]:
        p += 1
    s = 0
    while s < min(len(old), len(new)) - p and old[-1 - s] == new[-1 - s]:
        s += 1
    mid = new[p:len(new) - s]
    out = b64(len(new)) + b"\n"
    if p:
        out += b64(p) + b"@0,"
    if mid:
        out += b64(len(mid)) + b":" + mid
    if s:
        out += b64(s) + b"@" + b64(len(old) - s) + b","
    return out + b64(checksum(new)) + b";"


def text(x: int) -> bytes:
    """The publication at offset `x`: a text that changes a little each time."""
    return json.dumps({"x": x, "name": "boiler 1", "unit": "°C", "history": list(range(10))},
                      separators=(",", ":"), ensure_ascii=False).encode()


def bad_checksum(d: bytes) -> bytes:
    """`d` with the last digit of its checksum changed."""
    return d[:-2] + (b"2" if d[-2:-1] == b"1" else b"1") + d[-1:]


HUGE = b"~~~~~\n0@0,0;"  # 12 bytes declaring 2^30 - 1


def plain(ch: str, off: int) -> dict:
    return {"ch": ch, "off": off, "data": json.loads(text(off))}


def shown(pubs: list) -> list:
    """Offsets of the publications, each checked to hold its text's data; `gap` for a Gap."""
    out = []
    for p in pubs:
        if isinstance(p, Gap):
            out.append("gap")
        else:
            assert p.data == json.loads(text(p.offset)), p
            out.append(p.offset)
    return out


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_client_delta_publications_are_rebuilt_and_a_failed_one_recovered(fmt):
    def push(ch: str, off: int, delta: bool, body: bytes) -> dict:
        # JSON carries the text or delta as a string, MessagePack as a binary.
        data = body.decode() if fmt == "json" else body
        return {"pub": {"ch": ch, "off": off, "data": data, "delta": delta}}

    def whole(off: int) -> dict:
        return push("room:d", off, False, text(off))

    def delta(off: int, body: bytes | None = None) -> dict:
        return push("room:d", off, True, body if body is not None else simple_delta(text(off - 1), text(off)))

    async def resubscribed(conn) -> dict:
        u = await conn.cmd()
        assert u == {"unsubscribe": {"channels": ["room:d"]}}, "the server still holds it: ended first"
        s = await conn.cmd()
        assert s["subscribe"]["channels"] == ["room:d"] and s["subscribe"]["delta"] == "fossil"
        return s

    async def main():
        async with ScriptedNode(fmt) as node:
            c = Client(node.url, format=fmt, connect_timeout=WAIT)
            conn = (await asyncio.gather(node.accept(), c.connect()))[0]
            async with c:
                t = asyncio.create_task(c.subscribe("room:d", initial=True, delta="fossil", gaps="yield"))
                s = await conn.cmd()
                assert s["subscribe"]["delta"] == "fossil"
                await conn.send({"id": s["id"], "ok": {"channels": {"room:d": {
                    "epoch": "e", "offset": 42, "last": plain("room:d", 42), "recovered": [], "complete": True}}}},
                    whole(43), delta(44), delta(45))
                sub = await t
                assert shown(await take(sub, 4)) == [42, 43, 44, 45]

                # A delta declaring a gigabyte is refused before anything is built; the push
                # after it (built on it) is dropped; history holds the hole: no gap.
                await conn.send(delta(46, HUGE), delta(47))
                s = await resubscribed(conn)
                assert s["subscribe"]["recover"] == {"room:d": {"epoch": "e", "offset": 45}}
                await conn.send({"id": s["id"], "ok": {"channels": {"room:d": {
                    "epoch": "e", "offset": 47, "last": None,
                    "recovered": [plain("room:d", 46), plain("room:d", 47)], "complete": True}}}},
                    whole(48), delta(49))
                got = await take(sub, 4)
                assert shown(got) == [46, 47, 48, 49]
                assert all(p.after_gap is None for p in got)
                assert (c.stats["delta_failures"], c.stats["gaps"]) == (1, 0)

                # A bad checksum, and history no longer reaching back: a gap, the latest value.
                await conn.send(delta(50, bad_checksum(simple_delta(text(49), text(50)))))
                s = await resubscribed(conn)
                assert s["subscribe"]["recover"] == {"room:d": {"epoch": "e", "offset": 49}}
                await conn.send({"id": s["id"], "ok": {"channels": {"room:d": {
                    "epoch": "e", "offset": 52, "last": plain("room:d", 52), "recovered": [], "complete": False}}}},
                    whole(53), delta(54))
                got = await take(sub, 4)
                assert shown(got) == ["gap", 52, 53, 54]
                assert (got[0].since, got[0].until) == (Position("e", 49), Position("e", 52))
                assert c.stats["delta_failures"] == 2
                assert sub.position() == ("e", 54)

    run(main())


def test_client_delta_applies_deltas_made_by_the_rust_crate_and_the_npm_package():
    cases = json.loads(FIXTURE.read_text())["cases"]
    assert len(cases) >= 5
    for case in cases:
        source, target = base64.b64decode(case["source"]), base64.b64decode(case["target"])
        for made_by in ("rust", "npm"):
            delta = base64.b64decode(case[made_by])
            assert output_size(delta) == len(target)
            assert apply(source, delta, MAX) == target, (case["name"], made_by)


@pytest.mark.skipif(shutil.which("node") is None or not NPM_PACKAGE.exists(),
                    reason="node and web/node_modules (make web-deps) make the deltas")
def test_client_delta_applies_deltas_the_npm_package_makes_now():
    """Many texts with random edits (inserts, removals, changes, moved blocks), their deltas
    made by the npm package the TypeScript SDK uses, applied here."""
    rng = random.Random(7)
    pairs = []
    for i in range(150):
        rows = [{"id": j, "v": rng.random(), "name": f"row {j} ✓"} for j in range(rng.randint(0, 60))]
        old = json.dumps({"rows": rows, "i": i}, ensure_ascii=False)
        for _ in range(rng.randint(1, 5)):
            k = rng.randrange(len(rows) + 1)
            op = rng.choice(["insert", "remove", "change", "move"])
            if op == "insert" or not rows:
                rows.insert(k, {"id": 1000 + k, "v": rng.random(), "name": "new"})
            elif op == "remove":
                rows.pop(min(k, len(rows) - 1))
            elif op == "change":
                rows[min(k, len(rows) - 1)]["v"] = rng.random()
            else:
                rows.append(rows.pop(min(k, len(rows) - 1)))
        pairs.append([old, json.dumps({"rows": rows, "i": i}, ensure_ascii=False)])
    script = (f"import {{ createDelta }} from {json.dumps(NPM_PACKAGE.as_uri())};\n"
              "let input = ''; for await (const chunk of process.stdin) input += chunk;\n"
              "const enc = (s) => new TextEncoder().encode(s);\n"
              "const out = JSON.parse(input).map(([a, b]) => Buffer.from(createDelta(enc(a), enc(b))).toString('base64'));\n"
              "process.stdout.write(JSON.stringify(out));\n")
    made = subprocess.run(["node", "--input-type=module", "-e", script], input=json.dumps(pairs),
                          capture_output=True, text=True, timeout=60, check=True)
    deltas = [base64.b64decode(d) for d in json.loads(made.stdout)]
    assert len(deltas) == len(pairs)
    copies = 0
    for (old, new), delta in zip(pairs, deltas):
        assert apply(old.encode(), delta, MAX) == new.encode()
        copies += delta.count(b"@")
    assert copies > len(pairs), "the deltas copy from the previous text, not only insert"


def test_client_delta_refuses_what_cannot_be_applied_never_failing_otherwise():
    base = text(1)
    good = simple_delta(base, text(2))
    assert apply(base, good, MAX) == text(2)
    # Declared too large: refused at once, whatever follows.
    started = time.monotonic()
    with pytest.raises(DeltaError, match="declares 1073741823 bytes, more than the 1048576 allowed"):
        apply(base, HUGE, MAX)
    with pytest.raises(DeltaError, match="more than the 16 allowed"):
        apply(base, good, 16)
    assert time.monotonic() - started < 5
    with pytest.raises(DeltaError, match="checksum"):
        apply(base, bad_checksum(good), MAX)
    # Every truncation, and other malformed deltas: a DeltaError, never another exception.
    bad = [good[:n] for n in range(len(good))] + [
        b"5\n5@99,0;", b"5\n9:abc", b"5\n3:abc2:de0;", b"2\n3:abc0;", b"3\n3?abc0;", b"5\n5@0",
        b"zzzzzzzzzzzzzzzz\n0;", b"5\nzzzzzzzzzzzz@0,0;", b"\xff\n0;", b"3\n3:\xff\xfe\xfd0;",
    ]
    for d in bad:
        with pytest.raises(DeltaError):
            apply(base, d, MAX)


def test_client_delta_entry_refuses_pushes_it_cannot_rebuild_and_forgets_its_text():
    e = Entry("a", None, recover=True, initial=False, start=None, sampling={"delta": "fossil"})  # type: ignore[arg-type]
    with pytest.raises(DeltaError, match="no previous publication"):
        e.rebuild({"ch": "a", "off": 1, "data": simple_delta(text(0), text(1)), "delta": True}, MAX)
    assert e.rebuild({"ch": "a", "off": 1, "data": text(1).decode(), "delta": False}, MAX) == json.loads(text(1))
    assert e.rebuild({"ch": "a", "off": 2, "data": simple_delta(text(1), text(2)), "delta": True}, MAX)["x"] == 2
    for bad, why in [(b"{not json", "not JSON"), (b"\xff\xfe", "not JSON"), (5, "neither text nor binary"),
                     (text(3), "more than the 16 allowed")]:
        with pytest.raises(DeltaError, match=why):
            e.rebuild({"ch": "a", "off": 3, "data": bad, "delta": False}, 16 if why.startswith("more") else MAX)
        assert e.text is None, "nothing is built on a text never delivered"
        e.text = text(2)


def test_client_delta_checksum_is_the_formats():
    # Big-endian words, the last padded with zeros, summed modulo 2^32.
    assert checksum(b"") == 0
    assert checksum(b"\x00\x00\x00\x01\x00\x00\x00\x02") == 3
    assert checksum(b"\x01") == 0x0100_0000
    assert checksum(b"\xff\xff\xff\xff\x00\x00\x00\x02") == 1


FILTER = {"op": "and", "nodes": [{"key": "kind", "cmp": "in", "vals": ["alarm", "event"]},
                                 {"op": "not", "nodes": [{"key": "site", "cmp": "eq", "val": "test"}]}]}


def test_client_filter_is_sent_and_its_holes_are_no_gap_but_complete_false_is():
    def pub(ch: str, off: int, kind: str) -> dict:
        return {"pub": {"ch": ch, "off": off, "data": off, "tags": {"kind": kind}}}

    def rec(ch: str, *offs: int) -> list:
        return [{"ch": ch, "off": o, "data": o, "tags": {"kind": "alarm"}} for o in offs]

    async def main():
        async with ScriptedNode("json") as node:
            c = Client(node.url, connect_timeout=WAIT, backoff_max=0.5)
            conn = (await asyncio.gather(node.accept(), c.connect()))[0]
            async with c:
                t = asyncio.gather(c.subscribe("room:f", filter=FILTER), c.subscribe("room:g"))
                cmds = [await conn.cmd(), await conn.cmd()]
                by = {cmd["subscribe"]["channels"][0]: cmd for cmd in cmds}
                assert by["room:f"]["subscribe"] == {"channels": ["room:f"], "initial": True, "filter": FILTER}
                assert "filter" not in by["room:g"]["subscribe"], "one command per set of options"
                for ch, cmd in by.items():
                    await conn.send({"id": cmd["id"], "ok": {"channels": {ch: {
                        "epoch": "e", "offset": 3, "last": None, "recovered": [], "complete": True}}}})
                f, g = await t
                await conn.send(pub("room:f", 5, "alarm"), pub("room:f", 9, "event"))
                got = await take(f, 2)
                assert [(p.offset, p.tags) for p in got] == [(5, {"kind": "alarm"}), (9, {"kind": "event"})]

                # Recovered with holes, the channel ahead of the last match: no gap.
                await conn.ws.close(1011, "gone")
                conn = await node.accept()
                cmds = {cmd["subscribe"]["channels"][0]: cmd for cmd in [await conn.cmd(), await conn.cmd()]}
                assert cmds["room:f"]["subscribe"]["recover"] == {"room:f": {"epoch": "e", "offset": 9}}
                assert cmds["room:f"]["subscribe"]["filter"] == FILTER
                await conn.send({"id": cmds["room:g"]["id"], "ok": {"channels": {"room:g": {
                    "epoch": "e", "offset": 3, "recovered": [], "complete": True}}}})
                await conn.send({"id": cmds["room:f"]["id"], "ok": {"channels": {"room:f": {
                    "epoch": "e", "offset": 20, "last": None, "recovered": rec("room:f", 12, 15), "complete": True}}}},
                    pub("room:f", 23, "alarm"))
                got = await take(f, 3)
                assert [p.offset for p in got] == [12, 15, 23]
                assert all(p.after_gap is None for p in got) and c.stats["gaps"] == 0

                # The server says history did not reach back: a gap, with no hole to see.
                await conn.ws.close(1011, "gone")
                conn = await node.accept()
                cmds = {cmd["subscribe"]["channels"][0]: cmd for cmd in [await conn.cmd(), await conn.cmd()]}
                await conn.send({"id": cmds["room:g"]["id"], "ok": {"channels": {"room:g": {
                    "epoch": "e", "offset": 3, "recovered": [], "complete": True}}}})
                await conn.send({"id": cmds["room:f"]["id"], "ok": {"channels": {"room:f": {
                    "epoch": "e", "offset": 24, "last": None, "recovered": rec("room:f", 24), "complete": False}}}})
                with pytest.raises(Gap) as gap:
                    await f.get(WAIT)
                assert (gap.value.since, gap.value.until) == (Position("e", 23), Position("e", 24))
                assert (await f.get(WAIT)).offset == 24
                assert g.pending == 0

    run(main())


def test_client_publishes_tags_and_reads_them_from_history():
    async def main():
        async with ScriptedNode("msgpack") as node:
            c = Client(node.url, format="msgpack", connect_timeout=WAIT)
            conn = (await asyncio.gather(node.accept(), c.connect()))[0]
            async with c:
                t = asyncio.create_task(c.publish("room:t", {"v": 1}, tags={"kind": "alarm"}))
                cmd = await conn.cmd()
                assert cmd["publish"] == {"channel": "room:t", "data": {"v": 1}, "tags": {"kind": "alarm"}}
                await conn.send({"id": cmd["id"], "ok": {"offset": 1, "epoch": "e"}})
                assert (await t).offset == 1
                t = asyncio.create_task(c.publish("room:t", 2))
                cmd = await conn.cmd()
                assert cmd["publish"] == {"channel": "room:t", "data": 2}
                await conn.send({"id": cmd["id"], "ok": {"offset": 2, "epoch": "e"}})
                await t
                h = asyncio.create_task(c.history("room:t"))
                cmd = await conn.cmd()
                await conn.send({"id": cmd["id"], "ok": {"publications": [
                    {"ch": "room:t", "off": 1, "data": {"v": 1}, "tags": {"kind": "alarm"}},
                    {"ch": "room:t", "off": 2, "data": 2}], "epoch": "e", "offset": 2}})
                assert [p.tags for p in await h] == [{"kind": "alarm"}, None]
                assert Publication("a", 1, None).tags is None

    run(main())
