"""A real `redis-server` for black-box tests: one server without persistence on a fixed
loopback port, so that it can be killed, paused and restarted empty where a node expects it
(by PID), and the `redis` fixture that starts one per test."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest


class Redis:
    """`durable`: an append-only file fsynced on every write, so that what the server
    acknowledged survives a kill -9 and a start in the same directory."""

    def __init__(self, tmp_path, durable: bool = False):
        self.durable = durable
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.dir = tmp_path
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.durable else "no", "--appendfsync", "always", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL (after SIGCONT, in case it is paused); what it held is gone."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)

    def signal(self, sig) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)


@pytest.fixture
def redis(tmp_path):
    r = Redis(tmp_path)
    r.start()
    yield r
    r.kill()


@pytest.fixture
def two_shards(tmp_path):
    """Two real redis-servers, each in its own directory: the shards of a node started with
    `--broker "<url0>,<url1>"`. Killed (by PID) at teardown."""
    shards = []
    for i in range(2):
        d = tmp_path / f"redis{i}"
        d.mkdir()
        shards.append(Redis(d))
        shards[-1].start()
    yield shards
    for r in shards:
        r.kill()
