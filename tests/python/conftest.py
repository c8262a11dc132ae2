"""Fixtures: start the real `switchboard serve` binary on a free port and kill it afterwards.

- `server`: a server with default options. Give it extra command-line arguments with
  `@pytest.mark.parametrize("server", [["--max-connections", "3"]], indirect=True)`.
- `start_server(*args)`: a factory for tests that need several servers or to pick options at
  run time; every server it starts is killed (by PID) at teardown.

The binary is `$SWITCHBOARD_BIN`, or `target/release/switchboard` under the repository root
(found from this file's path).
"""

from __future__ import annotations

import os
import pathlib

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
