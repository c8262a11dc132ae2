"""The examples run as written against the real binary, through a node restart:

- every `examples/*/run.sh` (a node, a publisher and a subscriber; examples/README.md): it must
  exit 0, and its subscriber must have printed the second round — the values published after
  the restart — after the first; for the clients known here, in that client's own format;
- the Python blocks of `clients/python/README.md`, each saved to a file and run with this
  interpreter; only the node's address is changed (8700 → a spare port). The first block (the
  asyncio subscriber) runs across a node restart and must print the value published after it,
  marked as following a gap, without stopping — also in a fresh virtualenv where the package
  was installed the README's way (`pip install ./clients/python`, dependencies from the index); the README's word on client publishes to a point
  (403, and `room:` allowed) is checked with the client.

Processes are started and killed by their PID; every wait is bounded; nothing asserts how long
something took."""

from __future__ import annotations

import asyncio
import json
import pathlib
import queue
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

import sb
from switchboard_client import Client, ForbiddenError

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
README = REPO_ROOT / "clients" / "python" / "README.md"
WAIT = 20.0


def example_env(**extra: str) -> dict:
    """The runner's environment without `SWITCHBOARD_*` (a node reads those as its config)."""
    env = sb.server_env()
    env.update(extra)
    return env


# --------------------------------------------------------------------------------------------
# examples/*/run.sh


def subscriber_output(stdout: str) -> list[str]:
    """The lines a run.sh printed under `--- subscriber output:` (up to the next `---`)."""
    assert "--- subscriber output:" in stdout, stdout
    part = stdout.split("--- subscriber output:\n", 1)[1].split("\n---", 1)[0]
    return [line for line in part.splitlines() if line]


def check_python(lines: list[str]) -> None:
    first = lines.index("room:ops 1 {'text': 'first'}")
    assert any(line.startswith("pt:boiler.temp 1 {'v': 71.5,") for line in lines[:first + 1]), lines
    # After the restart: a new epoch; the room's gap is reported, then both values of round two,
    # each marked as following a gap.
    after = lines[first + 1:]
    assert any(line.startswith("room:ops: messages may have been lost (room:ops: gap after ")
               and "epoch changed" in line for line in after), lines
    assert "room:ops 1 {'text': 'second'}  <- values were missed before this one" in after, lines
    assert any(line.startswith("pt:boiler.temp 1 {'v': 72.25,")
               and line.endswith("<- values were missed before this one") for line in after), lines


def check_cli(lines: list[str]) -> None:
    pubs = [json.loads(line) for line in lines]
    seen = [(p["ch"], p["data"]) for p in pubs]
    first = seen.index(("room:ops", {"text": "first"}))
    assert ("pt:boiler.temp", {"v": 71.5, "q": "good"}) in seen[:first + 1], seen
    after = seen[first + 1:]
    assert ("room:ops", {"text": "second"}) in after, seen
    assert ("pt:boiler.temp", {"v": 72.25, "q": "good"}) in after, seen
    assert ("pt:boiler.temp", {"v": 71.5, "q": "good"}) not in after, "no stale value after the restart"


TS_PUB = re.compile(r"(\S+) (\d+) (\{.*\})")
TS_GAP = re.compile(r"(\S+): gap from ([0-9a-f]+):(\d+) to ([0-9a-f]+):(\d+)( \(epoch changed\))?")


def check_typescript(lines: list[str]) -> None:
    """`CHANNEL OFFSET JSON` per publication, `CHANNEL: gap from EPOCH:OFFSET to EPOCH:OFFSET
    (epoch changed)` per gap (examples/typescript/subscriber.mjs)."""
    assert "subscribed to pt:boiler.temp and room:ops" in lines, lines
    seen = []
    for line in lines:
        if m := TS_PUB.fullmatch(line):
            seen.append(("pub", m[1], int(m[2]), json.loads(m[3])))
        elif m := TS_GAP.fullmatch(line):
            assert m[2] != m[4] and m[6], f"a gap across the restart names two epochs: {line}"
            seen.append(("gap", m[1]))
        else:
            assert line.startswith("subscribed to "), f"unexpected line {line!r} in {lines}"
    first = seen.index(("pub", "room:ops", 1, {"text": "first"}))
    assert ("pub", "pt:boiler.temp", 1, {"v": 71.5, "q": "good"}) in seen[:first], seen
    # After the restart: a new epoch; each channel's gap is reported before its value of round
    # two, and nothing of round one comes again.
    after = seen[first + 1:]
    for ch, data in (("room:ops", {"text": "second"}), ("pt:boiler.temp", {"v": 72.25, "q": "good"})):
        assert ("gap", ch) in after and ("pub", ch, 1, data) in after, seen
        assert after.index(("gap", ch)) < after.index(("pub", ch, 1, data)), seen
    assert ("pub", "pt:boiler.temp", 1, {"v": 71.5, "q": "good"}) not in after, "no stale value after the restart"
    assert ("pub", "room:ops", 1, {"text": "first"}) not in after, "no message twice"


FORMAT_CHECKS = {"python": check_python, "cli": check_cli, "typescript": check_typescript}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script", sorted(EXAMPLES.glob("*/run.sh")), ids=lambda p: p.parent.name)
def test_examples_run_sh_subscriber_survives_a_node_restart(switchboard_bin, script):
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=110, cwd=REPO_ROOT,
                       env=example_env(SB=switchboard_bin, PORT=str(sb.free_port()), PYTHON=sys.executable))
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "restarting the node" in r.stdout
    lines = subscriber_output(r.stdout)
    text = "\n".join(lines)
    # The contract of every example (examples/README.md): round one, then round two.
    assert "first" in text and "second" in text.split("first", 1)[1], lines
    assert "71.5" in text and "72.25" in text.split("71.5", 1)[1], lines
    check = FORMAT_CHECKS.get(script.parent.name)
    if check is not None:
        check(lines)


def test_examples_every_client_folder_has_a_run_sh():
    folders = sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir())
    assert {"python", "cli", "typescript"} <= set(folders)
    assert [f for f in folders if not (EXAMPLES / f / "run.sh").is_file()] == []


# --------------------------------------------------------------------------------------------
# clients/python/README.md


def readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory) -> str:
    """The interpreter of a new virtualenv where `pip install ./clients/python` (a copy of it,
    so no build directory lands in the repository) put the package and what it declares."""
    d = tmp_path_factory.mktemp("fresh-venv")
    shutil.copytree(REPO_ROOT / "clients" / "python", d / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "venv", str(d / "venv")], check=True, timeout=300)
    python = str(d / "venv" / "bin" / "python")
    env = example_env()
    env.pop("PYTHONPATH", None)
    got = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "./python"],
                         cwd=d, capture_output=True, text=True, timeout=300, env=env)
    assert got.returncode == 0, got.stderr
    return python


class Script:
    """A README block run as a file, its stdout read line by line on a thread."""

    def __init__(self, code: str, port: int, tmp_path: pathlib.Path, name: str,
                 python: str = sys.executable) -> None:
        assert "127.0.0.1:8700" in code, "the block names the node's default address"
        path = tmp_path / name
        path.write_text(code.replace("127.0.0.1:8700", f"127.0.0.1:{port}"))
        self.stderr_path = tmp_path / (name + ".stderr")
        env = example_env()
        if python != sys.executable:
            env.pop("PYTHONPATH", None)  # only what that interpreter has installed
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen([python, str(path)], stdout=subprocess.PIPE, stderr=err,
                                         stdin=subprocess.DEVNULL, text=True, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def line(self, pred) -> str:
        """The next line for which `pred` holds (earlier ones are kept in `seen`)."""
        deadline = time.monotonic() + WAIT
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no such line; saw {self.seen}; stderr: {self.stderr()}"
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(line)
            if pred(line):
                return line

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait(self) -> int:
        return self.proc.wait(timeout=WAIT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def test_examples_python_readme_blocks_are_the_ones_tested_here():
    assert len(readme_blocks()) == 3, "a new Python block in the README gets a test here"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("venv", ["test", "fresh"])
def test_examples_python_readme_first_block_survives_a_node_restart(switchboard_bin, tmp_path, venv, request):
    python = request.getfixturevalue("fresh_python") if venv == "fresh" else sys.executable
    port = sb.free_port()
    node = sb.start_on_port(switchboard_bin, port, [], str(tmp_path / "a.log"))
    script = None
    try:
        script = Script(readme_blocks()[0], port, tmp_path, "watch.py", python)
        # The README says what it prints for this publication.
        sb.wait_until("the subscriber connected", lambda: sb.api_get(node, "/api/info").json()["connections"] >= 1,
                      WAIT)
        sb.api_publish(node, "pt:boiler.temp", {"v": 71.5, "q": "good"})
        script.line(lambda s: s == "pt:boiler.temp 1 {'v': 71.5, 'q': 'good'}")

        node.terminate()
        node.proc.wait(timeout=30)
        node = sb.start_on_port(switchboard_bin, port, [], str(tmp_path / "a2.log"))
        sb.api_publish(node, "pt:boiler.temp", {"v": 72.25, "q": "good"})
        script.line(lambda s: s == "pt:boiler.temp 1 {'v': 72.25, 'q': 'good'}  <- values were missed before this one")
        sb.api_publish(node, "pt:boiler.temp", {"v": 73, "q": "good"})
        script.line(lambda s: s == "pt:boiler.temp 2 {'v': 73, 'q': 'good'}")
        assert script.proc.poll() is None, f"the example stopped: {script.stderr()}"
        assert "Traceback" not in script.stderr()
    finally:
        if script is not None:
            script.kill()
        node.kill()


def test_examples_python_readme_http_publish_block_feeds_a_point(server, tmp_path):
    script = Script(readme_blocks()[1], server.port, tmp_path, "publish.py")
    assert script.wait() == 0, script.stderr()
    line = script.line(lambda s: s.startswith("{"))
    assert re.fullmatch(r"\{'offset': 1, 'epoch': '[0-9a-f]+'\}", line), line
    got = sb.api_get(server, "/api/channels/pt:boiler.temp").json()
    assert got["last"]["data"] == {"v": 71.5, "q": "good"}


def test_examples_python_readme_point_channels_refuse_client_publish(server):
    """What the README says a client gets for publishing to a point, and where it may publish."""

    async def main():
        async with Client(server.ws_url) as c:
            with pytest.raises(ForbiddenError) as e:
                await c.publish("pt:boiler.temp", {"v": 71.5})
            assert (e.value.code, e.value.message) == (403, "clients may not publish in this namespace")
            assert (await c.publish("room:ops", {"text": "hi"})).offset == 1

    asyncio.run(asyncio.wait_for(main(), 60))


def test_examples_python_readme_blocking_block(server, tmp_path):
    sb.api_publish(server, "pt:boiler.temp", {"v": 70, "q": "good"})
    script = Script(readme_blocks()[2], server.port, tmp_path, "blocking.py")
    try:
        history = script.line(lambda s: True)
        assert "channel='room:ops'" in history and "data={'text': 'hi'}" in history, history
        script.line(lambda s: s == "1 {'v': 70, 'q': 'good'}")
        sb.api_publish(server, "pt:boiler.temp", {"v": 71, "q": "good"})
        script.line(lambda s: s == "2 {'v': 71, 'q': 'good'}")
        assert script.proc.poll() is None, script.stderr()
    finally:
        script.kill()
