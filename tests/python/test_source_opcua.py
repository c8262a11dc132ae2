"""The OPC UA source end to end: a real OPC UA server (the third-party `asyncua` package,
tests/python/opcua_server.py) on a spare loopback port, a node configured with
`[[sources]] kind = "opcua"`, WebSocket subscribers, and write-back through a namespace's
`write_source`. Every server is stopped by PID at teardown.
"""

from __future__ import annotations

import os
import pathlib
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

import sb
from sb import WS

HERE = pathlib.Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OpcServer:
    """opcua_server.py on `port`; `extra` are its options (`--blob`, `--mute`)."""

    def __init__(self, port: int, extra: tuple = ()):
        self.port = port
        self.extra = list(extra)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"opc.tcp://127.0.0.1:{self.port}/switchboard/"

    def start(self) -> "OpcServer":
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "opcua_server.py"), "--port", str(self.port), *self.extra],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            preexec_fn=sb._die_with_parent,
        )
        fd = self.proc.stdout.fileno()
        line = b""
        deadline = time.monotonic() + 30
        while not line.endswith(b"\n"):
            assert time.monotonic() < deadline and self.proc.poll() is None, "opcua_server.py did not start"
            r, _, _ = select.select([fd], [], [], 0.2)
            if r:
                chunk = os.read(fd, 1)
                assert chunk, "opcua_server.py closed stdout"
                line += chunk
        assert line.startswith(b"ready "), line
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def opc():
    srv = OpcServer(free_port()).start()
    yield srv
    srv.stop()


def node_with_source(start_server, tmp_path, opc: OpcServer) -> sb.Server:
    """A node whose `pt` namespace is fed by the OPC UA source `plc` and writes back to it;
    `ro` is fed by a second source over the same server whose writes nobody may publish."""
    cfg = tmp_path / "switchboard.toml"
    cfg.write_text(f"""
[namespaces.pt]
client_publish = true
allow = {{ subscribe = "anonymous", publish = "anonymous" }}
write_source = "plc"

[namespaces.ro]
client_publish = true
allow = {{ subscribe = "anonymous", publish = "authenticated" }}
write_source = "plc-ro"

[[sources]]
kind = "opcua"
name = "plc"
url = "{opc.url}"
browse = "Objects/Plant"
sampling_ms = 50
publishing_ms = 100
channel = "pt:plant.{{name}}"

[[sources]]
kind = "opcua"
name = "plc-ro"
url = "{opc.url}"
nodes = ["ns=2;s=Line1.Setpoint"]
channel = "ro:{{name}}"
""")
    return start_server("--config", str(cfg))


def last(srv: sb.Server, channel: str, timeout: float = 20.0):
    """The channel's latest value once the source has published one (read on a connection of
    its own, so the caller's subscriptions stay as they are)."""
    deadline = time.monotonic() + timeout
    with WS(srv.ws_url) as ws:
        while True:
            got = ws.ok("subscribe", {"channels": [channel], "initial": True})["channels"][channel]
            if got.get("last") is not None:
                return got["last"]["data"]
            assert time.monotonic() < deadline, f"nothing published on {channel}"
            ws.ok("unsubscribe", {"channels": [channel]})
            time.sleep(0.2)


def wait_value(srv: sb.Server, channel: str, value, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while last(srv, channel)["v"] != value:
        assert time.monotonic() < deadline, f"{channel} never became {value!r}"
        time.sleep(0.2)


def test_source_opcua_values_reach_subscribers_with_timestamps_and_quality(opc, start_server, tmp_path):
    srv = node_with_source(start_server, tmp_path, opc)
    level = last(srv, "pt:plant.Line1.Level")
    assert (level["v"], level["q"]) == (42.5, "uncertain"), level
    assert abs(level["t"] - time.time() * 1000) < 60_000, level
    assert last(srv, "pt:plant.Line1.Mode")["v"] == "auto"
    with WS(srv.ws_url) as ws:
        ws.subscribe(["pt:plant.Line1.Temp"])
        pubs = ws.pubs("pt:plant.Line1.Temp", 5, timeout=20)
    now = time.time() * 1000
    for p in pubs:
        assert p["data"]["q"] == "good"
        assert 14.9 <= p["data"]["v"] <= 25.1
        assert now - 30_000 <= p["data"]["t"] <= now + 1000
    assert len({p["data"]["t"] for p in pubs}) == 5, "each value keeps its own source timestamp"


def test_source_opcua_server_restart_shows_bad_then_resumes(opc, start_server, tmp_path):
    srv = node_with_source(start_server, tmp_path, opc)
    with WS(srv.ws_url) as ws:
        last(srv, "pt:plant.Line1.Mode")
        ws.subscribe(["pt:plant.Line1.Mode", "pt:plant.Line1.Temp"])
        opc.stop()
        bad = ws.pubs("pt:plant.Line1.Mode", 1, timeout=20)[0]["data"]
        assert bad["q"] == "bad" and bad["v"] == "auto"
        # A write while the server is down: 503, answered at once, nothing queued for later.
        reply = ws.request("publish", {"channel": "pt:plant.Line1.Setpoint", "data": {"v": 1.0}})
        assert reply["error"]["code"] == 503, reply
        opc.start()
        deadline = time.monotonic() + 40
        while True:
            p = ws.pubs("pt:plant.Line1.Temp", 1, timeout=max(0.1, deadline - time.monotonic()))[0]["data"]
            if p["q"] == "good":
                break
        assert srv.alive()


def test_source_opcua_write_back_accepted_refused_and_not_permitted(opc, start_server, tmp_path):
    srv = node_with_source(start_server, tmp_path, opc)
    with WS(srv.ws_url) as ws:
        assert last(srv, "pt:plant.Line1.Setpoint")["v"] == 50.0
        last(srv, "pt:plant.Line1.Serial")
        ws.subscribe(["pt:plant.Line1.Setpoint"])

        # A setpoint widget's publish: the device accepts it and the new value comes back.
        reply = ws.request("publish", {"channel": "pt:plant.Line1.Setpoint", "data": {"v": 61.5, "t": 1}})
        assert reply.get("ok") == {"written": True, "source": "plc"}, reply
        deadline = time.monotonic() + 10
        while True:
            p = ws.pubs("pt:plant.Line1.Setpoint", 1, timeout=max(0.1, deadline - time.monotonic()))[0]["data"]
            if p["v"] == 61.5:
                break

        # A read-only variable: 502 with the device's status.
        reply = ws.request("publish", {"channel": "pt:plant.Line1.Serial", "data": {"v": "SN-9"}})
        assert reply["error"]["code"] == 502, reply
        assert "BadUserAccessDenied" in reply["error"]["message"] or "BadNotWritable" in reply["error"]["message"]
        # Over HTTP too; an Int32 node takes a whole number.
        r = sb.http("POST", srv.http_url + "/api/publish", {"channel": "pt:plant.Line1.Count", "data": 12})
        assert r.status == 200 and r.json() == {"written": True, "source": "plc"}, r.body
        wait_value(srv, "pt:plant.Line1.Count", 12)

        # No permission to publish in `ro` (authenticated users only): refused before any
        # write, the value stays.
        wait_value(srv, "ro:Line1.Setpoint", 61.5)
        reply = ws.request("publish", {"channel": "ro:Line1.Setpoint", "data": {"v": 1.0}})
        assert reply["error"]["code"] == 401, reply
        time.sleep(1.0)
        assert last(srv, "pt:plant.Line1.Setpoint")["v"] == 61.5
