"""`switchboard bench echo --protocol json-echo` against an echo server nobody on the project
wrote (Python `websockets`, tests/python/echo_server.py): the bench's report must agree with
what the server itself saw."""

from __future__ import annotations

import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """One stdout line of `proc`, waiting at most `timeout` seconds."""
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no complete line within {timeout} s (got {line!r})")
        r, _, _ = select.select([fd], [], [], min(remaining, 0.2))
        if r:
            chunk = os.read(fd, 1)
            if not chunk:
                raise AssertionError(f"stdout closed (got {line!r})")
            line += chunk
    return line.decode().strip()


@pytest.fixture
def echo_server():
    proc = subprocess.Popen([sys.executable, str(HERE / "echo_server.py")], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        first = read_line(proc, 10)
        assert first.startswith("port "), first
        yield proc, int(first.split()[1])
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()


def stop_and_count(proc: subprocess.Popen) -> tuple[int, int]:
    """SIGTERM the echo server; returns the (pings, connections) it reports."""
    os.kill(proc.pid, signal.SIGTERM)
    last = read_line(proc, 10)
    proc.wait(timeout=10)
    words = last.split()
    assert words[0] == "pings" and words[2] == "connections", last
    return int(words[1]), int(words[3])


def test_bench_echo_json_echo_against_a_python_echo_server(switchboard_bin, echo_server, tmp_path):
    proc, port = echo_server
    out = tmp_path / "echo"
    run = subprocess.run(
        [switchboard_bin, "bench", "echo", "--protocol", "json-echo",
         "--target", f"ws://127.0.0.1:{port}/", "--conns", "20", "--rate", "5", "--duration", "3",
         "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    r = json.loads((out / "result.json").read_text())
    assert r["scenario"] == "echo" and r["pass"] is True, r
    assert r["connections"] == {"target": 20, "established": 20, "failed": 0}
    m = r["messages"]
    # 20 connections × 5/s for at least the 3 s phase.
    assert m["sent"] >= 20 * 5 * 3, m
    assert m["received"] == m["expected"] == m["sent"], m
    assert m["lost"] == 0 and m["duplicated"] == 0, m
    lat = r["latency_ms"]
    for k in ("p50", "p90", "p99", "p999", "max", "mean"):
        assert isinstance(lat[k], (int, float)) and lat[k] > 0, lat
    assert lat["p50"] <= lat["p99"] <= lat["max"], lat
    assert r["params"]["protocol"] == "json-echo"
    for name in ("result.csv", "latency.svg"):
        assert (out / name).is_file(), name
    # The server's own count agrees with the report: every ping the bench sent arrived, over
    # exactly the connections it opened.
    pings, connections = stop_and_count(proc)
    assert (pings, connections) == (m["sent"], 20)


def test_bench_echo_json_echo_reports_unanswered_pings_as_lost(switchboard_bin, tmp_path):
    """A server that accepts WebSocket connections but never answers: nothing may pass."""
    silent = subprocess.Popen(
        [sys.executable, "-c",
         "import asyncio\n"
         "from websockets.asyncio.server import serve\n"
         "async def h(ws):\n"
         "    async for _ in ws: pass\n"
         "async def main():\n"
         "    async with serve(h, '127.0.0.1', 0) as s:\n"
         "        print('port', s.sockets[0].getsockname()[1], flush=True)\n"
         "        await asyncio.sleep(120)\n"
         "asyncio.run(main())\n"],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        port = int(read_line(silent, 10).split()[1])
        out = tmp_path / "silent"
        run = subprocess.run(
            [switchboard_bin, "bench", "echo", "--protocol", "json-echo",
             "--target", f"ws://127.0.0.1:{port}/", "--conns", "3", "--rate", "5", "--duration", "1",
             "--drain", "0.5", "--out", str(out), "--quiet"],
            capture_output=True, text=True, timeout=120,
        )
        assert run.returncode == 1, run.stdout + run.stderr
        r = json.loads((out / "result.json").read_text())
        assert r["pass"] is False
        m = r["messages"]
        assert m["sent"] > 0 and m["received"] == 0 and m["lost"] == m["sent"], m
    finally:
        os.kill(silent.pid, signal.SIGKILL)
        silent.wait(timeout=10)
        silent.stdout.close()
