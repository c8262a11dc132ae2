"""The application's hooks (`[proxy]`, SPEC §6a) against the real binary and a Python hook
backend (backend_kit.HookBackend): the connect hook with server-side subscriptions, the
subscribe and publish hooks of opted-in namespaces, and hooks that fail — garbage, a 5xx,
too slow, nobody listening — which refuse and never let anything through."""

from __future__ import annotations

import http.client as httpclient
import json
import socket
import time

import pytest

import sb
from backend_kit import HookBackend
from sb import http, uniq
from test_auth import API_KEY, AuthWS


def config(tmp_path, backend_url: str, timeout_ms: int = 500) -> str:
    path = tmp_path / "hooks.toml"
    path.write_text(f"""
[proxy]
connect_url = "{backend_url}/connect"
subscribe_url = "{backend_url}/subscribe"
publish_url = "{backend_url}/publish"
timeout_ms = {timeout_ms}
headers = ["cookie", "X-Session"]

[namespaces.app]
proxy_subscribe = true
proxy_publish = true
client_publish = true
""")
    return str(path)


@pytest.fixture
def backend():
    b = HookBackend()
    yield b
    b.close()


@pytest.fixture
def node(start_server, backend, tmp_path):
    return start_server("--config", config(tmp_path, backend.url("")), "--api-key", API_KEY)


def connected(node, backend, user="ann", channels=None, data=None) -> tuple[AuthWS, dict]:
    result = {"user": user}
    if channels is not None:
        result["channels"] = channels
    backend.answers["connect"] = {"result": result}
    ws = AuthWS(node.ws_url, headers={"Cookie": "sid=42", "X-Session": "s-1", "X-Other": "not passed"})
    reply = ws.ok("connect", {"data": data} if data is not None else {})
    return ws, reply


def publish(node, channel, data):
    r = http("POST", node.http_url + "/api/publish", {"channel": channel, "data": data},
             headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status == 200, (r.status, r.body)


def test_hooks_connect_accepts_as_the_user_with_server_side_subscriptions(node, backend):
    ch = "room:" + uniq()
    ws, reply = connected(node, backend, user="ann", channels=[ch], data={"app": "v1"})
    assert reply["user"] == "ann", reply
    pushed = ws.recv_where(lambda m: "subscribed" in m)["subscribed"]
    assert set(pushed["channels"]) == {ch} and "offset" in pushed["channels"][ch], pushed
    (call,) = backend.calls_of("connect")
    assert call["transport"] == "websocket" and call["encoding"] == "json", call
    assert call["headers"] == {"cookie": "sid=42", "x-session": "s-1"}, call["headers"]
    assert call["data"] == {"app": "v1"} and call["client"], call
    publish(node, ch, {"v": 1})
    assert ws.pubs(ch, 1)[0]["data"] == {"v": 1}
    ws.close()


def test_hooks_connect_refusals_close_with_the_hooks_code(node, backend):
    backend.answers["connect"] = {"error": {"code": 4003, "message": "banned here"}}
    ws = AuthWS(node.ws_url)
    ws.send({"id": 1, "connect": {}})
    closed = ws.wait_closed(timeout=10)
    assert (closed.code, closed.reason) == (4003, "banned here"), (closed.code, closed.reason)
    # A code outside 4000-4999 closes with 4003.
    backend.answers["connect"] = {"error": {"code": 7, "message": "no"}}
    ws = AuthWS(node.ws_url)
    ws.send({"id": 1, "subscribe": {"channels": ["room:x"]}})
    assert ws.wait_closed(timeout=10).code == 4003


@pytest.mark.parametrize("answer,code", [("garbage", 4502), ("no-verdict", 4502), ("5xx", 4503), ("slow", 4503),
                                         ({"result": {"user": ""}}, 4502), ({"result": {"nobody": 1}}, 4502)])
def test_hooks_connect_failures_refuse(node, backend, answer, code):
    backend.answers["connect"] = answer
    ws = AuthWS(node.ws_url)
    ws.send({"id": 1, "connect": {}})
    closed = ws.wait_closed(timeout=10)
    assert closed.code == code, (closed.code, closed.reason)
    assert "backend" in closed.reason, closed.reason


def test_hooks_nobody_listening_refuses_with_4503(start_server, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    node = start_server("--config", config(tmp_path, dead), "--api-key", API_KEY)
    ws = AuthWS(node.ws_url)
    ws.send({"id": 1, "connect": {}})
    assert ws.wait_closed(timeout=10).code == 4503


def test_hooks_subscribe_decides_opted_in_namespaces_only(node, backend):
    ws, _ = connected(node, backend)
    ok, no, plain = "app:" + uniq(), "app:" + uniq(), "room:" + uniq()

    def decide(req):
        if req["channel"] == no:
            return {"error": {"code": 404, "message": "no such room for you"}}
        return {"result": {}}

    backend.answers["subscribe"] = decide
    got = ws.subscribe([ok, no, plain])["channels"]
    assert "offset" in got[ok] and "offset" in got[plain], got
    assert got[no]["error"] == {"code": 404, "message": "no such room for you"}, got
    asked = backend.calls_of("subscribe")
    assert sorted(c["channel"] for c in asked) == sorted([ok, no]), asked
    assert all(c["user"] == "ann" and c["client"] for c in asked), asked
    for answer, status in [("garbage", 502), ("5xx", 503), ("slow", 503)]:
        backend.answers["subscribe"] = answer
        ch = "app:" + uniq()
        err = ws.subscribe([ch])["channels"][ch]["error"]
        assert err["code"] == status, (answer, err)
    ws.close()


def test_hooks_publish_allows_replaces_and_refuses(node, backend):
    ws, _ = connected(node, backend)
    ch = "app:" + uniq()
    backend.answers["subscribe"] = {"result": {}}
    ws.subscribe([ch])
    backend.answers["publish"] = lambda req: {"result": {"data": {"checked": req["data"], "by": req["user"]}}}
    ws.ok("publish", {"channel": ch, "data": {"v": 1}})
    assert ws.pubs(ch, 1)[0]["data"] == {"checked": {"v": 1}, "by": "ann"}
    backend.answers["publish"] = {"result": {}}
    ws.ok("publish", {"channel": ch, "data": {"v": 2}})
    assert ws.pubs(ch, 1)[0]["data"] == {"v": 2}
    backend.answers["publish"] = {"error": {"code": 409, "message": "stale version"}}
    assert ws.request("publish", {"channel": ch, "data": {"v": 3}})["error"] == {"code": 409, "message": "stale version"}
    for answer, status in [("garbage", 502), ("slow", 503), ({"result": {"data": 1, "x": 2}}, None)]:
        backend.answers["publish"] = answer
        r = ws.request("publish", {"channel": ch, "data": {"v": 4}})
        if status is None:
            assert "ok" in r, r  # unknown fields beside data are ignored
        else:
            assert r["error"]["code"] == status, (answer, r)
    ws.close()


def test_hooks_reuse_connections_and_are_measured(node, backend):
    ws, _ = connected(node, backend)
    backend.answers["subscribe"] = {"result": {}}
    for _ in range(20):
        ws.subscribe(["app:" + uniq()])
    calls = len(backend.calls)
    assert len(backend.connections) < calls / 4, (len(backend.connections), calls)
    text = http("GET", node.http_url + "/metrics").body.decode()
    for line in ['switchboard_hook_calls_total{hook="subscribe"}', 'switchboard_hook_errors_total{hook="connect"}',
                 'switchboard_hook_duration_seconds_bucket{hook="subscribe",le="+Inf"}']:
        assert line in text, line
    ws.close()


def test_hooks_connect_works_for_sse(node, backend):
    ch = "room:" + uniq()
    backend.answers["connect"] = {"result": {"user": "sam"}}
    conn = httpclient.HTTPConnection("127.0.0.1", node.port, timeout=10)
    conn.request("GET", f"/sse?channels={ch}", headers={"Cookie": "sid=7"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    seen = b""
    while b"event: subscribed" not in seen:
        line = resp.readline()
        assert line, seen
        seen += line
    publish(node, ch, {"v": 5})
    while b'"data":{"v": 5}' not in seen:  # the data verbatim, as published
        line = resp.readline()
        assert line, seen
        seen += line
    (call,) = backend.calls_of("connect")
    assert call["transport"] == "sse" and call["headers"] == {"cookie": "sid=7"}, call
    conn.close()
    backend.answers["connect"] = {"error": {"code": 401, "message": "log in first"}}
    r = http("GET", node.http_url + f"/sse?channels={ch}")
    assert r.status == 401 and b"log in first" in r.body, (r.status, r.body)


def test_hooks_connect_works_for_long_polling(node, backend):
    ch = "room:" + uniq()
    backend.answers["connect"] = {"result": {"user": "pol", "channels": [ch]}}
    opened = http("POST", node.http_url + "/poll", raw=json.dumps({"id": 1, "connect": {"data": {"p": 1}}}).encode(),
                  headers={"Cookie": "sid=9"})
    assert opened.status == 200, (opened.status, opened.body)
    session = opened.json()["session"]
    got = []
    seq = None

    def poll():
        nonlocal seq
        q = f"?timeout=2" + (f"&ack={seq}" if seq is not None else "")
        r = http("GET", node.http_url + f"/poll/{session}{q}")
        assert r.status == 200, (r.status, r.body)
        seq = r.json()["seq"]
        got.extend(r.json()["messages"])
        return any("subscribed" in m for m in got) and any(m.get("id") == 1 for m in got)

    sb.wait_until("the hook's subscription and the connect reply", poll, 10)
    (reply,) = [m for m in got if m.get("id") == 1]
    assert reply["ok"]["user"] == "pol", reply
    (call,) = backend.calls_of("connect")
    assert call["transport"] == "poll" and call["data"] == {"p": 1} and call["headers"] == {"cookie": "sid=9"}, call
    # A refused session is closed: its disconnect comes in the next poll.
    backend.answers["connect"] = {"error": {"code": 4003, "message": "not you"}}
    opened = http("POST", node.http_url + "/poll", raw=b'{"id": 1, "connect": {}}')
    session, got, seq = opened.json()["session"], [], None
    r = http("GET", node.http_url + f"/poll/{session}?timeout=2")
    discs = [m["disconnect"] for m in r.json()["messages"] if "disconnect" in m] if r.status == 200 else []
    assert discs and discs[0]["code"] == 4003 and discs[0]["reason"] == "not you", (r.status, r.body)


def test_hooks_connect_expire_at_closes_with_4001_unless_refreshed(node, backend):
    backend.answers["connect"] = {"result": {"user": "tim", "expire_at": int(time.time()) + 2}}
    ws = AuthWS(node.ws_url)
    assert ws.ok("connect", {})["user"] == "tim"
    closed = ws.wait_closed(timeout=15)
    assert (closed.code, closed.reason) == (4001, "connection expired"), (closed.code, closed.reason)
