"""One OPC UA device cannot stop a node's streams: a real OPC UA server (the third-party
`asyncua` package, tests/python/opcua_server.py) feeding a node through `[[sources]] kind =
"opcua"`, watched by WebSocket subscribers (the third-party `websockets` package).

- A String or ByteString value of 65,536 bytes or more on one node: that point is refused
  (counted in `switchboard_source_refused_total{reason="oversized"}`) and marked bad with its
  last value; the session stays up and the other points keep streaming.
- A session lost again before its first notification after a reconnect: the points keep their
  last value, marked bad; no point ever carries `v: null`.

Every server is stopped by PID at teardown; the node's open files are compared with a baseline.
"""

from __future__ import annotations

import functools
import os
import time

import pytest

import sb
from sb import WS
from test_source_opcua import OpcServer, free_port

# `x` repeated: the values the test server gives Blob (String) and BlobBytes (ByteString).
SMALL_BLOB = "x" * 16


@pytest.fixture
def servers():
    started: list[OpcServer] = []

    def start(port: int, *extra: str) -> OpcServer:
        srv = OpcServer(port, extra).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


def node(start_server, tmp_path, opc: OpcServer, browse: str = "Objects/Plant") -> sb.Server:
    cfg = tmp_path / "switchboard.toml"
    cfg.write_text(f"""
[namespaces.pt]
client_publish = true
allow = {{ subscribe = "anonymous", publish = "anonymous" }}
write_source = "plc"

[[sources]]
kind = "opcua"
name = "plc"
url = "{opc.url}"
browse = "{browse}"
sampling_ms = 50
publishing_ms = 100
channel = "pt:{{name}}"
""")
    return start_server("--config", str(cfg))


def metric(srv: sb.Server, name: str, reason: str | None = None) -> float:
    """The OPC UA source's series `name` (without `switchboard_`); 0 when never counted."""
    labels = {"reason": reason} if reason else {}
    return sb.metric(srv, f"switchboard_{name}", source="plc", kind="opcua", **labels)


wait_until = functools.partial(sb.wait_until, limit=30.0, every=0.1)


def open_files(srv: sb.Server) -> int:
    return len(os.listdir(f"/proc/{srv.pid}/fd"))


def latest(srv: sb.Server, channel: str) -> dict | None:
    """The channel's last publication, read on a connection of its own."""
    with WS(srv.ws_url) as ws:
        got = ws.ok("subscribe", {"channels": [channel], "initial": True})["channels"][channel]
    return got["last"]["data"] if got.get("last") else None


def received(ws: WS, seconds: float) -> list:
    """The publications queued on `ws` and those arriving within `seconds`."""
    out = []
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            out.append(ws.recv(remaining))
        except TimeoutError:
            break
    return [m["pub"] for m in out if isinstance(m, dict) and "pub" in m]


def write(ws: WS, channel: str, value) -> None:
    reply = ws.request("publish", {"channel": channel, "data": {"v": value}}, timeout=15)
    assert reply.get("ok", {}).get("written"), reply


@pytest.mark.timeout(120)
def test_fault_opcua_oversized_value_marks_one_point_bad_and_the_session_stays(servers, start_server, tmp_path):
    opc = servers(free_port(), "--blob")
    srv = node(start_server, tmp_path, opc, browse="Objects/Plant/Line1")
    wait_until("the blob's first value", lambda: latest(srv, "pt:Blob") is not None)
    wait_until("the connection", lambda: metric(srv, "source_connected") == 1)
    baseline = open_files(srv)

    with WS(srv.ws_url) as watcher, WS(srv.ws_url) as writer:
        watcher.subscribe(["pt:Temp", "pt:Blob", "pt:BlobBytes", "pt:Mode"])
        write(writer, "pt:BlobSize", 70_000)
        # Each refused value marks its point bad once, with the last value it had.
        for channel in ("pt:Blob", "pt:BlobBytes"):
            marker = watcher.pubs(channel, 1, timeout=20)[0]["data"]
            assert marker["q"] == "bad" and marker["v"] is not None, marker
        assert latest(srv, "pt:Blob")["v"] == SMALL_BLOB
        wait_until("both values counted", lambda: metric(srv, "source_refused_total", "oversized") == 2)

        # The session stays up and the bystander points keep streaming good values.
        temps = watcher.pubs("pt:Temp", 10, timeout=20)
        assert all(p["data"]["q"] == "good" for p in temps)
        assert metric(srv, "source_reconnects_total") == 0
        assert metric(srv, "source_connected") == 1
        assert metric(srv, "source_decode_errors_total") == 0

        # A small value again: the point is good again.
        write(writer, "pt:BlobSize", 20)
        while True:
            p = watcher.pubs("pt:Blob", 1, timeout=20)[0]["data"]
            if p["q"] == "good":
                assert p["v"] == "x" * 20
                break
        # Nothing marked the other points bad, nothing carried a null value.
        rest = received(watcher, 1.0)
        assert all(p["data"]["v"] is not None for p in rest)
        assert not any(p["ch"] == "pt:Mode" for p in rest)
    assert metric(srv, "source_reconnects_total") == 0
    wait_until("open files back to the baseline", lambda: open_files(srv) <= baseline, limit=10)
    assert srv.alive()


@pytest.mark.timeout(240)
def test_fault_opcua_session_lost_twice_keeps_last_values_never_null(servers, start_server, tmp_path):
    port = free_port()
    opc = servers(port)
    srv = node(start_server, tmp_path, opc, browse="Objects/Plant/Line1")
    wait_until("every point", lambda: all(latest(srv, c) is not None for c in ("pt:Mode", "pt:Count", "pt:Temp")))
    wait_until("the connection", lambda: metric(srv, "source_connected") == 1)
    baseline = open_files(srv)

    with WS(srv.ws_url) as watcher:
        watcher.subscribe(["pt:Mode", "pt:Count", "pt:Temp"])
        opc.stop()
        marker = watcher.pubs("pt:Mode", 1, timeout=30)[0]["data"]
        assert (marker["v"], marker["q"]) == ("auto", "bad"), marker

        # A server that takes the session and the subscription and goes before its first
        # notification.
        mute = servers(port, "--mute")
        wait_until("the reconnect", lambda: metric(srv, "source_reconnects_total") == 1
                   and metric(srv, "source_connected") == 1, limit=60)
        mute.stop()
        wait_until("the second loss", lambda: metric(srv, "source_connected") == 0)
        for channel, value in (("pt:Mode", "auto"), ("pt:Count", 7)):
            last = latest(srv, channel)
            assert (last["v"], last["q"]) == (value, "bad"), (channel, last)
        assert latest(srv, "pt:Temp")["v"] is not None

        # The server back: good values again.
        servers(port)
        wait_until("good values", lambda: latest(srv, "pt:Mode")["q"] == "good", limit=60)
        seen = received(watcher, 1.0)
        assert seen and all(p["data"]["v"] is not None for p in seen), seen
    wait_until("open files back to the baseline", lambda: open_files(srv) <= baseline, limit=10)
    assert srv.alive()
