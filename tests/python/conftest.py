"""Fixtures: start the real `switchboard serve` binary on a free port and kill it afterwards.

- `server`: a server with default options. Give it extra command-line arguments with
  `@pytest.mark.parametrize("server", [["--max-connections", "3"]], indirect=True)`.
- `start_server(*args)`: a factory for tests that need several servers or to pick options at
  run time; every server it starts is killed (by PID) at teardown.
- `redis_url`: a real `redis-server` on a spare loopback port (no persistence), for nodes that
  share a broker; killed (by PID) at teardown.

The binary is `$SWITCHBOARD_BIN`, or `target/release/switchboard` under the repository root
(found from this file's path).
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import time

import pytest

import sb

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = os.environ.get("SWITCHBOARD_BIN") or str(REPO_ROOT / "target" / "release" / "switchboard")


@pytest.fixture(scope="session")
def switchboard_bin() -> str:
    if not os.path.isfile(BINARY) or not os.access(BINARY, os.X_OK):
        pytest.fail(f"switchboard binary not found at {BINARY} (set SWITCHBOARD_BIN or build it)")
    return BINARY


@pytest.fixture
def start_server(switchboard_bin, tmp_path):
    started: list[sb.Server] = []

    def start(*args, env: dict | None = None) -> sb.Server:
        log = tmp_path / f"server{len(started)}.stderr.log"
        srv = sb.start_server(switchboard_bin, list(args), str(log), env=env)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.kill()


@pytest.fixture
def server(request, start_server) -> sb.Server:
    args = getattr(request, "param", None) or []
    return start_server(*args)


@pytest.fixture
def redis_url(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def bystander(server):
    b = sb.Bystander(server)
    yield b
    b.close()


def pytest_runtest_makereport(item, call):
    # Attach the server's stderr to failing tests: it is where the server logs.
    if call.when == "call" and call.excinfo is not None:
        for name in ("server",):
            srv = item.funcargs.get(name) if hasattr(item, "funcargs") else None
            if isinstance(srv, sb.Server):
                item.add_report_section("call", "server stderr (tail)", srv.stderr_tail())
