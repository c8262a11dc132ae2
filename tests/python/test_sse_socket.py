"""Event streams on a fresh connection and after other requests on a kept-alive one.

Every request is parsed by the HTTP stack and every stream is its chunked response body,
whether the stream opened its connection or came after another request on it. Both must say the
same thing, pass the same checks, and leave nothing behind when their clients vanish. Driven
with `httpx` (a client nobody here wrote) and raw sockets; what the node holds is read from
`/metrics` and /proc."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
import urllib.parse

import httpx
import jwt

import sb
from sb import api_publish, uniq
from sse_client import SSE, RawSSE, _Parser


def sse_path(channels, **params) -> str:
    return "/sse?" + urllib.parse.urlencode({"channels": ",".join(channels), **params})


def fds(srv) -> int:
    return len(os.listdir(f"/proc/{srv.pid}/fd"))


def wait_for(cond, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout} s")


def kept_alive_stream(srv, path: str):
    """A stream requested on a connection that first served another request."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n\r\n".encode())
    got = b""
    while not got.endswith(b"ok\n"):
        got += s.recv(4096)
    assert got.startswith(b"HTTP/1.1 200")
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nAccept: text/event-stream\r\n\r\n".encode())
    raw = RawSSE.__new__(RawSSE)
    raw.sock, raw.buf, raw.parser, raw.headers_done, raw.chunked, raw.ended, raw._raw = (
        s, b"", _Parser(), False, False, False, b"")
    return raw


def head_of(raw: RawSSE) -> bytes:
    raw.sock.settimeout(10)
    while b"\r\n\r\n" not in raw._raw:
        data = raw.sock.recv(65536)
        assert data, "closed before the response head"
        raw._raw += data
    return raw._raw.partition(b"\r\n\r\n")[0].lower()


def assert_framing(own: RawSSE, kept: RawSSE) -> None:
    """A stream on a fresh connection and one after another request on a kept-alive connection
    are both chunked event streams with the same head."""
    own_head, kept_head = head_of(own), head_of(kept)
    assert own_head.startswith(b"http/1.1 200") and kept_head.startswith(b"http/1.1 200")
    for h in (own_head, kept_head):
        assert b"transfer-encoding: chunked" in h and b"connection: close" not in h, h
        assert b"content-type: text/event-stream" in h and b"cache-control: no-cache" in h


def test_sse_socket_own_connection_and_kept_alive_streams_say_the_same(server):
    ch, other = uniq("news."), uniq("news.")
    first = api_publish(server, ch, {"n": 1})
    own = RawSSE("127.0.0.1", server.port, sse_path([ch, other], initial="true"))
    kept = kept_alive_stream(server, sse_path([ch, other], initial="true"))
    try:
        assert_framing(own, kept)
        for raw in (own, kept):
            raw.events(until=lambda evs: sum(e.event == "message" for e in evs) >= 1)
        api_publish(server, ch, {"n": 2})
        api_publish(server, other, {"n": 3})
        seen = []
        for raw in (own, kept):
            evs = raw.events(until=lambda evs: sum(e.event == "message" for e in evs) >= 3)
            seen.append([(e.event, e.id, e.data) for e in evs])
            assert evs[0].event == "subscribed"
            assert [json.loads(e.data)["pub"]["off"] for e in evs if e.event == "message"] == [1, 2, 1]
            assert raw.parser.retry == 1000
        assert seen[0] == seen[1], "both ways of serving a stream give the same events and ids"
        assert seen[0][-1][1] == f"{ch}@{first['epoch']}:2;{other}@{seen[0][-1][1].rsplit('@', 1)[1]}"
    finally:
        own.close()
        kept.close()


def test_sse_socket_refusals_are_complete_http_responses(start_server):
    secret = "sse-socket-secret-0123456789abcdef0123456789"
    srv = start_server("--jwt-secret", secret)
    token = jwt.encode({"sub": "ann", "exp": int(time.time()) + 600, "channels": ["room:*"]}, secret, algorithm="HS256")
    cases = ((sse_path([uniq("a.")]), 401), (sse_path(["secret:x"], token=token), 403),
             ("/sse?channels=bad%20name&token=" + token, 400), ("/sse?nothing=1&token=" + token, 400))
    for path, status in cases:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nOrigin: http://127.0.0.1:{srv.port}\r\n"
                      "Connection: close\r\n\r\n".encode())
            got = b""
            while True:
                data = s.recv(65536)
                if not data:
                    break
                got += data
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(f"HTTP/1.1 {status}".encode()), (path, head)
        length = int(next(ln.split(b":")[1] for ln in head.lower().split(b"\r\n") if ln.startswith(b"content-length")))
        assert len(body) == length and json.loads(body)["error"]["code"] == status, (path, body)


def test_sse_socket_clients_that_vanish_leave_nothing_behind(server):
    """Streams whose clients stop reading and then reset, close, or half-close while the node
    holds events for them: the node lets each go — connections, descriptors and subscriptions
    back where they were — and a bystander's stream carries on."""
    bystander_ch = uniq("bystander.")
    with SSE(f"{server.http_url}{sse_path([bystander_ch])}") as bystander:
        bystander.next_event("subscribed")
        wait_for(lambda: sb.metric(server, "switchboard_connections") >= 1, what="the bystander counted")
        base_conns, base_fds = sb.metric(server, "switchboard_connections"), fds(server)
        base_subs = sb.metric(server, "switchboard_subscriptions")
        for round_, how in enumerate(("reset", "close", "half-close")):
            ch = uniq("flood.")
            victims = [RawSSE("127.0.0.1", server.port, sse_path([ch]), rcvbuf=4096) for _ in range(5)]
            for v in victims:
                assert any(e.event == "subscribed" for e in v.events(until=lambda evs: evs))
            for i in range(30):
                api_publish(server, ch, "x" * 20_000 + str(i))
            for v in victims:
                if how == "reset":
                    v.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    v.sock.close()
                elif how == "close":
                    v.sock.close()
                else:
                    v.sock.shutdown(socket.SHUT_WR)
            api_publish(server, bystander_ch, round_)
            [(_, p)] = bystander.pubs(1, timeout=10)
            assert p["data"] == round_
            if how == "half-close":
                for v in victims:
                    v.sock.settimeout(10)
                    while v.sock.recv(65536):
                        pass
                    v.close()
            wait_for(lambda: sb.metric(server, "switchboard_connections") == base_conns, what=f"{how}: connections")
            wait_for(lambda: sb.metric(server, "switchboard_subscriptions") == base_subs, what=f"{how}: subscriptions")
            wait_for(lambda: fds(server) <= base_fds, what=f"{how}: descriptors")


def test_sse_socket_session_streams_own_their_connection_and_say_what_a_kept_alive_one_says(server):
    """`GET /sse?session=` on a fresh connection and after another request on a kept-alive
    connection: both chunked, both carry the same messages. A later stream supersedes one (its
    body ends), a client that vanishes leaves its session to be polled, and the node's
    descriptors come back."""
    ch = uniq("sess.")
    base_fds = fds(server)
    http = httpx.Client(base_url=server.http_url, timeout=10, trust_env=False)
    ids = [http.post("/poll").json()["session"] for _ in range(2)]
    own = RawSSE("127.0.0.1", server.port, f"/sse?session={ids[0]}")
    kept = kept_alive_stream(server, f"/sse?session={ids[1]}")
    assert_framing(own, kept)
    for sid in ids:
        r = http.post(f"/poll/{sid}", content=json.dumps({"id": 7, "subscribe": {"channels": [ch]}}))
        assert r.status_code == 202, r.text
    for raw in (own, kept):
        [reply] = raw.events(until=lambda evs: len(evs) >= 1)
        assert json.loads(reply.data)["id"] == 7, reply
    for i in range(3):
        api_publish(server, ch, {"n": i})
    seen = []
    for raw in (own, kept):
        evs = raw.events(until=lambda evs: len(evs) >= 4)
        assert raw.parser.retry == 1000
        seen.append([(e.event, e.id, json.loads(e.data)) for e in evs])
    assert seen[0] == seen[1], "both ways of serving a session's stream give the same events"
    assert [m["pub"]["off"] for _, _, m in seen[0][1:]] == [1, 2, 3], seen[0]
    # A second stream of the session supersedes the first: its body ends.
    again = RawSSE("127.0.0.1", server.port, f"/sse?session={ids[0]}")
    assert head_of(again).startswith(b"http/1.1 200")
    own.events(timeout=10, until=lambda evs: False)
    assert own.ended, "the superseded stream ends"
    api_publish(server, ch, {"n": 3})
    assert json.loads(again.events(until=lambda evs: len(evs) >= 1)[-1].data)["pub"]["off"] == 4
    # Its client vanishes (reset): the session is still there to be polled, nothing skipped.
    again.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    again.sock.close()
    assert http.get(f"/poll/{ids[0]}", params={"timeout": 0}).status_code == 200
    api_publish(server, ch, {"n": 4})
    batch = http.get(f"/poll/{ids[0]}", params={"timeout": 5}).json()
    assert [m["pub"]["off"] for m in batch["messages"] if "pub" in m] == [5], batch
    for raw in (own, kept):
        raw.close()
    for sid in ids:
        assert http.delete(f"/poll/{sid}").status_code == 204
    http.close()
    wait_for(lambda: fds(server) <= base_fds, what="descriptors back")
