"""Graceful shutdown: SIGTERM → every client gets `{"disconnect": {"code": 4000, ...,
"reconnect": true}}` then a close frame 4000, and the process exits 0."""

from __future__ import annotations

import json
import subprocess

import sb
from sb import WS, RawWS, api_publish, uniq


def test_shutdown_sigterm_disconnects_every_client_4000_and_exits_0(server):
    ch = uniq("bye.")
    js = WS(server.ws_url)
    mp = WS(server.ws_url, subprotocol=sb.MSGPACK_PROTOCOL)
    idle = WS(server.ws_url)
    pt = WS(server.ws_url)
    clients = [js, mp, idle, pt]
    try:
        js.subscribe([ch])
        mp.subscribe([ch])
        pt.subscribe([uniq("pt:bye.")])
        api_publish(server, ch, "before")
        assert js.pubs(ch, 1)[0]["data"] == "before"
        assert mp.pubs(ch, 1)[0]["data"] == "before"
        assert idle.ping("x") == {"data": "x"}

        server.terminate()

        for name, c in zip(["json", "msgpack", "idle", "pt"], clients):
            closed = c.wait_closed(timeout=10)
            assert closed.code == 4000, (name, closed.code, closed.reason)
            discs = [m for m in closed.messages if "disconnect" in m]
            assert len(discs) == 1, (name, closed.messages)
            d = discs[0]["disconnect"]
            assert d["code"] == 4000, (name, d)
            assert d["reconnect"] is True, (name, d)
            assert isinstance(d["reason"], str)
            assert "disconnect" in closed.messages[-1], "disconnect must be the last message"

        try:
            rc = server.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise AssertionError("server did not exit within 10 s of SIGTERM")
        assert rc == 0
    finally:
        for c in clients:
            c.close()


def test_shutdown_sigterm_reaches_a_client_that_is_not_reading(server):
    """A client that stopped reading cannot delay shutdown forever; the process still exits 0."""
    ch = uniq("stuck.")
    raw = RawWS("127.0.0.1", server.port, rcvbuf=4096)
    try:
        raw.send_json({"id": 1, "subscribe": {"channels": [ch]}})
        pad = "z" * 4000
        for b in range(8):
            r = sb.http("POST", server.http_url + "/api/publish",
                        {"batch": [{"channel": ch, "data": {"pad": pad}} for _ in range(128)]})
            assert r.status == 200
        with WS(server.ws_url) as healthy:
            healthy.ping(1)
            server.terminate()
            closed = healthy.wait_closed(timeout=10)
            assert closed.code == 4000
        try:
            rc = server.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            raise AssertionError("server did not exit within 15 s of SIGTERM with a stuck client")
        assert rc == 0
    finally:
        raw.close()


def test_shutdown_sigterm_with_no_clients_exits_0(server):
    assert sb.api_get(server, "/healthz").status == 200
    server.terminate()
    assert server.proc.wait(timeout=10) == 0
