"""Long polls on a kept-alive connection, a poll after the other.

A `GET /poll/{session}` is parsed and answered by the HTTP stack, whether it opened its
connection or came after other requests on it. Polls on a connection they opened must say
exactly what polls after other requests say, keep the connection open, answer pipelined
requests in order, apply the same refusals, and leave nothing behind when their clients vanish
mid-poll. Driven with the standard library's `http.client` and raw sockets (clients nobody here
wrote); what the node holds is read from /proc."""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import time

import httpx

import sb
from sb import api_publish, uniq


def fds(srv) -> int:
    return len(os.listdir(f"/proc/{srv.pid}/fd"))


def open_session(srv, commands=()) -> str:
    body = "\n".join(json.dumps(c) for c in commands)
    r = httpx.post(f"{srv.http_url}/poll", content=body, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()["session"]


def read_response(sock: socket.socket, buf: bytearray) -> tuple[int, dict, bytes]:
    """One `Content-Length` response from `sock` (`buf` holds what was read past it)."""
    sock.settimeout(30)
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        assert data, "connection closed before a response"
        buf += data
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert "transfer-encoding" not in headers
    n = int(headers["content-length"])
    while len(rest) < n:
        data = sock.recv(65536)
        assert data, "connection closed inside a body"
        rest += data
    buf[:] = rest[n:]
    return status, headers, rest[:n]


def get(path: str, port: int, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n".encode()


def test_polls_on_their_own_connection_say_what_polls_through_the_http_stack_say(server):
    ch = uniq("own.")
    sid = open_session(server, [{"id": 1, "subscribe": {"channels": [ch]}}])
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", f"/poll/{sid}?ack=0")
    first = conn.getresponse()
    batch = json.loads(first.read())
    assert first.status == 200 and batch["seq"] == 1
    assert batch["messages"][0]["id"] == 1 and "ok" in batch["messages"][0]
    sock = conn.sock
    got, seq = [], batch["seq"]
    for i in range(20):
        api_publish(server, ch, {"n": i})
        conn.request("GET", f"/poll/{sid}?ack={seq}")
        r = conn.getresponse()
        body = r.read()
        assert r.status == 200, body
        # The same connection, kept alive by the node.
        assert conn.sock is sock and r.getheader("connection") is None
        b = json.loads(body)
        seq = b["seq"]
        got += [m["pub"]["data"]["n"] for m in b["messages"]]
    assert got == list(range(20))

    # The same poll through the HTTP stack (a connection that served another request first)
    # has the same status, headers and body.
    with httpx.Client(trust_env=False) as h:
        assert h.get(f"{server.http_url}/healthz").status_code == 200
        via_stack = h.get(f"{server.http_url}/poll/{sid}", params={"ack": seq, "timeout": 0})
    conn.request("GET", f"/poll/{sid}?ack={seq}&timeout=0")
    own = conn.getresponse()
    own_body = own.read()
    assert (own.status, own_body) == (via_stack.status_code, via_stack.content)
    names = lambda hs: sorted(k.lower() for k in hs if k.lower() != "date")
    assert names(own.headers.keys()) == names(via_stack.headers.keys())
    assert own.getheader("content-type") == via_stack.headers["content-type"]
    assert own.getheader("date")
    conn.close()


def own_poller(srv, ch: str) -> tuple[str, socket.socket, bytearray, int]:
    """A session subscribed to `ch` and a connection its first poll opened: the session, the
    socket, what was read past the answer, and the batch number it answered."""
    sid = open_session(srv, [{"id": 1, "subscribe": {"channels": [ch]}}])
    s = socket.create_connection(("127.0.0.1", srv.port))
    buf = bytearray()
    s.sendall(get(f"/poll/{sid}?ack=0&timeout=0", srv.port))
    return sid, s, buf, json.loads(read_response(s, buf)[2])["seq"]


def held(sock: socket.socket, sid: str, port: int, ack: int, timeout: float = 25) -> None:
    """Sends a poll that nothing pending answers, and gives the node time to hold it."""
    sock.sendall(get(f"/poll/{sid}?ack={ack}&timeout={timeout}", port))
    time.sleep(0.3)


def test_a_held_poll_is_answered_when_a_publication_comes_as_through_the_http_stack(server):
    ch = uniq("held.")
    sid, s, buf, seq = own_poller(server, ch)
    with httpx.Client(trust_env=False) as h:
        stack = h.get(f"{server.http_url}/poll/{sid}", params={"ack": seq, "timeout": 0})
    for i in range(10):
        held(s, sid, server.port, seq)
        api_publish(server, ch, {"n": i})
        status, headers, body = read_response(s, buf)
        b = json.loads(body)
        assert status == 200 and b["seq"] == seq + 1, body
        assert [m["pub"]["data"] for m in b["messages"]] == [{"n": i}]
        assert sorted(k for k in headers if k != "date") == sorted(k for k in stack.headers if k != "date")
        assert headers["content-type"] == "application/json" and headers["date"]
        seq, last = b["seq"], body
    # The last answer got lost: acking the batch before it gets the same bytes again.
    s.sendall(get(f"/poll/{sid}?ack={seq - 1}", server.port))
    assert read_response(s, buf)[2] == last
    # A held poll whose time is up gets an empty batch of the same number.
    s.sendall(get(f"/poll/{sid}?ack={seq}&timeout=0.4", server.port))
    assert json.loads(read_response(s, buf)[2]) == {"seq": seq, "messages": []}
    # A poll on another connection while one is held here: a publication that answered the
    # held poll first leaves this connection open; otherwise the held poll gets 409.
    held(s, sid, server.port, seq)
    api_publish(server, ch, "elsewhere")
    b = json.loads(read_response(s, buf)[2])
    assert [m["pub"]["data"] for m in b["messages"]] == ["elsewhere"]
    with httpx.Client(trust_env=False) as h:
        other = h.get(f"{server.http_url}/poll/{sid}", params={"ack": seq + 1, "timeout": 0})
        assert other.status_code == 200 and other.json() == {"seq": seq + 1, "messages": []}
        held(s, sid, server.port, seq + 1)
        # Should the held poll come after the other one, the next other poll supersedes it.
        for _ in range(3):
            assert h.get(f"{server.http_url}/poll/{sid}", params={"ack": seq + 1, "timeout": 0}).status_code == 200
            if select.select([s], [], [], 2)[0]:
                break
    status, _, body = read_response(s, buf)
    assert status == 409 and json.loads(body)["error"]["code"] == 409
    s.close()


def test_a_held_poll_of_a_session_closed_past_its_bound_gets_the_4008(start_server):
    srv = start_server("--max-pending-bytes", "20000")
    ch = uniq("bound.")
    sid, s, buf, seq = own_poller(srv, ch)
    held(s, sid, srv.port, seq)
    sb.api_batch(srv, [{"channel": ch, "data": "x" * 1000} for _ in range(100)])
    pubs, bye = [], None
    for _ in range(3):
        b = json.loads(read_response(s, buf)[2])
        pubs += [m["pub"]["off"] for m in b["messages"] if "pub" in m]
        bye = next((m["disconnect"] for m in b["messages"] if "disconnect" in m), None)
        if bye:
            break
        s.sendall(get(f"/poll/{sid}?ack={b['seq']}", srv.port))
    assert bye and bye["code"] == 4008 and bye["reconnect"] is True
    assert pubs == list(range(1, len(pubs) + 1)) and len(pubs) < 30, "in order, the backlog dropped"
    s.sendall(get(f"/poll/{sid}?ack=0", srv.port))
    assert read_response(s, buf)[0] == 404
    s.close()


def test_a_kept_alive_poll_connection_answers_pipelined_requests_in_order_and_hands_others_on(server):
    ch = uniq("pipe.")
    sid = open_session(server, [{"id": 1, "subscribe": {"channels": [ch]}}])
    api_publish(server, ch, "a")
    s = socket.create_connection(("127.0.0.1", server.port))
    buf = bytearray()
    command = json.dumps({"id": 7, "publish": {"channel": ch, "data": "from-poll"}}).encode()
    # Two polls, a command (the HTTP stack's), then polls again (now through the stack), all
    # written at once.
    s.sendall(
        get(f"/poll/{sid}?ack=0&timeout=0", server.port)
        + get(f"/poll/{sid}?ack=1&timeout=0", server.port)
        + f"POST /poll/{sid} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
          f"Content-Length: {len(command)}\r\n\r\n".encode() + command
        + get(f"/poll/{sid}?ack=1", server.port)
    )
    st1, _, b1 = read_response(s, buf)
    st2, _, b2 = read_response(s, buf)
    st3, _, b3 = read_response(s, buf)
    st4, _, b4 = read_response(s, buf)
    assert (st1, st2, st3, st4) == (200, 200, 202, 200), (b1, b2, b3, b4)
    first = json.loads(b1)
    assert first["seq"] == 1
    assert [m.get("id") for m in first["messages"]][0] == 1
    assert [m["pub"]["data"] for m in first["messages"] if "pub" in m] == ["a"]
    assert json.loads(b2) == {"seq": 1, "messages": []}
    last = json.loads(b4)
    assert last["seq"] == 2
    assert {m.get("id") for m in last["messages"]} >= {7}
    # The stack keeps serving the connection.
    s.sendall(get("/healthz", server.port))
    assert read_response(s, buf)[2] == b"ok\n"
    s.close()


def test_polls_on_a_kept_alive_connection_get_the_same_refusals(server):
    sid = open_session(server)
    s = socket.create_connection(("127.0.0.1", server.port))
    buf = bytearray()
    s.sendall(get(f"/poll/{sid}?ack=0&timeout=0", server.port))
    assert read_response(s, buf)[0] == 200
    # A foreign Host is refused 403 (DNS rebinding), as every route refuses it, each time.
    for _ in range(2):
        s.sendall(f"GET /poll/{sid}?ack=0&timeout=0 HTTP/1.1\r\nHost: rebound.example\r\n\r\n".encode())
        status, _, body = read_response(s, buf)
        assert status == 403 and json.loads(body)["error"]["code"] == 403
    # Bad numbers and unknown sessions get SPEC errors; the connection goes on.
    s.sendall(get(f"/poll/{sid}?ack=x", server.port))
    status, _, body = read_response(s, buf)
    assert status == 400 and "ack" in json.loads(body)["error"]["message"]
    s.sendall(get(f"/poll/{sid}?ack=0&timeout=-1", server.port))
    assert read_response(s, buf)[0] == 400
    s.sendall(get("/poll/" + "0" * 32 + "?ack=0", server.port))
    status, _, body = read_response(s, buf)
    assert status == 404 and json.loads(body)["error"]["code"] == 404
    # A browser's CORS headers, as through the stack, for a poll that repeats the last one's
    # headers as for the first with them, whichever session it polls.
    origin = f"Origin: http://127.0.0.1:{server.port}\r\n"
    other = open_session(server)
    for poll_of in (sid, sid, other, other):
        s.sendall(get(f"/poll/{poll_of}?ack=0&timeout=0", server.port, origin))
        status, headers, body = read_response(s, buf)
        assert status == 200 and headers.get("access-control-allow-origin") == f"http://127.0.0.1:{server.port}"
        assert json.loads(body)["messages"] == []
    s.sendall(get(f"/poll/{other}?ack=0&timeout=0", server.port))
    status, headers, _ = read_response(s, buf)
    assert status == 200 and "access-control-allow-origin" not in headers
    # With the same headers, a session the node does not have.
    s.sendall(get("/poll/" + "1" * 32 + "?ack=0", server.port))
    assert read_response(s, buf)[0] == 404
    # `Connection: close` is honoured: the answer comes and the connection ends.
    s.sendall(get(f"/poll/{sid}?ack=0&timeout=0", server.port, "Connection: close\r\n"))
    assert read_response(s, buf)[0] == 200
    s.settimeout(10)
    assert s.recv(1) == b""
    s.close()
    # Another kind of request with the headers of the polls before it goes to the HTTP stack.
    s = socket.create_connection(("127.0.0.1", server.port))
    for _ in range(2):
        s.sendall(get(f"/poll/{sid}?ack=0&timeout=0", server.port))
        assert read_response(s, buf)[0] == 200
    s.sendall(get("/metrics", server.port))
    status, _, body = read_response(s, buf)
    assert status == 200 and b"switchboard_" in body
    s.close()


def test_a_poller_that_vanishes_mid_poll_leaves_nothing_behind(start_server):
    srv = start_server()
    ch = uniq("gone.")
    base = fds(srv)
    sids = [open_session(srv, [{"id": 1, "subscribe": {"channels": [ch]}}]) for _ in range(20)]
    # A session holds no descriptor; the connections that opened them close as the node sees
    # their clients go.
    sb.wait_until(f"descriptors back to {base} after opening sessions", lambda: fds(srv) <= base, 5)
    socks = []
    for sid in sids:
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(get(f"/poll/{sid}?ack=0&timeout=0", srv.port))
        buf = bytearray()
        assert json.loads(read_response(s, buf)[2])["seq"] == 1
        # Held: nothing is pending at seq 1.
        s.sendall(get(f"/poll/{sid}?ack=1", srv.port))
        socks.append(s)
    sb.wait_until(f"one descriptor per held poll over {base}", lambda: fds(srv) == base + 20, 5)
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    # The node lets every connection go long before the polls' 25 s would end them.
    sb.wait_until(f"descriptors back to {base}", lambda: fds(srv) <= base, 5)
    # Every session is whole: a publication reaches its next poll.
    api_publish(srv, ch, "after")
    with httpx.Client(trust_env=False) as h:
        for sid in sids:
            r = h.get(f"{srv.http_url}/poll/{sid}", params={"ack": 1, "timeout": 5})
            assert r.status_code == 200
            assert [m["pub"]["data"] for m in r.json()["messages"] if "pub" in m] == ["after"]


def test_a_session_answered_only_by_held_polls_outlives_its_ttl_and_takes_commands(start_server):
    # A held poll's answer writes nothing to the session store but renews its lease when due,
    # and the sweep renews it while the session lives: the record must outlast the session's
    # idle time limit however long the session runs, or a command's save would find it gone.
    srv = start_server(env={"SWITCHBOARD_POLL_SESSION_TTL_S": "4"})
    ch = "room:" + uniq("lease.")  # clients may publish in `room:`
    sid, s, buf, seq = own_poller(srv, ch)
    started, n = time.monotonic(), 0
    while time.monotonic() - started < 10:
        held(s, sid, srv.port, seq, timeout=5)
        api_publish(srv, ch, {"n": n})
        b = json.loads(read_response(s, buf)[2])
        assert b["seq"] == seq + 1 and [m["pub"]["data"] for m in b["messages"]] == [{"n": n}]
        seq, n = b["seq"], n + 1
    # Idle for half its time limit, then a command: the session takes it, and its reply comes
    # with the next publication in the next poll.
    time.sleep(2)
    cmd = json.dumps({"id": 9, "publish": {"channel": ch, "data": "cmd"}})
    r = httpx.post(f"{srv.http_url}/poll/{sid}", content=cmd, trust_env=False)
    assert r.status_code == 202, r.text
    got, replies = [], []
    for _ in range(3):
        s.sendall(get(f"/poll/{sid}?ack={seq}&timeout=2", srv.port))
        status, _, body = read_response(s, buf)
        assert status == 200, body
        b = json.loads(body)
        seq = b["seq"]
        got += [m["pub"]["data"] for m in b["messages"] if "pub" in m]
        replies += [m["id"] for m in b["messages"] if "id" in m]
        if "cmd" in got and 9 in replies:
            break
    assert got == ["cmd"] and replies == [9]
    s.close()


def test_a_poll_that_continues_a_held_one_waits_its_own_time(server):
    # A poller's next poll, sent as soon as an answer came, is held on where the last one was:
    # its time runs from when it came, not from when the poll it continues came.
    ch = uniq("again.")
    sid, s, buf, seq = own_poller(server, ch)
    s.sendall(get(f"/poll/{sid}?ack={seq}&timeout=1.5", server.port))
    time.sleep(1.0)
    api_publish(server, ch, "first")
    b = json.loads(read_response(s, buf)[2])
    assert b["seq"] == seq + 1 and [m["pub"]["data"] for m in b["messages"]] == ["first"]
    seq = b["seq"]
    s.sendall(get(f"/poll/{sid}?ack={seq}&timeout=1.5", server.port))
    # Past the first poll's time, within this one's: the publication is this poll's answer.
    time.sleep(1.0)
    api_publish(server, ch, "second")
    b = json.loads(read_response(s, buf)[2])
    assert b["seq"] == seq + 1 and [m["pub"]["data"] for m in b["messages"]] == ["second"], b
    seq = b["seq"]
    # Nothing comes: the poll's time runs out and it gets an empty batch of the same number.
    s.sendall(get(f"/poll/{sid}?ack={seq}&timeout=1.5", server.port))
    assert json.loads(read_response(s, buf)[2]) == {"seq": seq, "messages": []}
    # The connection goes on.
    s.sendall(get(f"/poll/{sid}?ack={seq}&timeout=0", server.port))
    assert json.loads(read_response(s, buf)[2]) == {"seq": seq, "messages": []}
    s.close()


def test_a_poll_from_elsewhere_acking_the_batch_before_a_held_answer_gets_that_answer_again(server):
    # The answer the fan-out wrote into a held poll's connection got lost: a poll on another
    # connection that acks the batch before it is sent that answer again, whatever the
    # session's earlier polls on the first connection were.
    ch = uniq("resend.")
    sid, s, buf, seq = own_poller(server, ch)
    held(s, sid, server.port, seq, timeout=20)
    api_publish(server, ch, "a")
    seq = json.loads(read_response(s, buf)[2])["seq"]
    # Another timeout: not the poll sent again, so it is read and held anew.
    held(s, sid, server.port, seq, timeout=25)
    api_publish(server, ch, "b")
    last = json.loads(read_response(s, buf)[2])
    assert last["seq"] == seq + 1 and [m["pub"]["data"] for m in last["messages"]] == ["b"], last
    with httpx.Client(trust_env=False) as h:
        again = h.get(f"{server.http_url}/poll/{sid}", params={"ack": seq, "timeout": 0})
    assert again.status_code == 200 and again.json() == last, again.text
    s.close()
