"""Hostile input, second round (docs/security.md, "Threat model"): DNS rebinding, reply buffering,
poll sessions after their close or their token's expiry, presence amplification, TLS
subscribers that reset with records pending. Each case runs against the real binary
with a bystander — a healthy subscriber on its own channel that must keep receiving every
publication, complete and in order — and checks the SPEC code the attacker gets."""

from __future__ import annotations

import json
import socket
import time

import pytest

import sb
from sb import WS, api_publish, http, uniq


def raw_request(server: sb.Server, head: str, body: bytes = b"", timeout: float = 5.0) -> tuple[int, bytes]:
    """Sends one request as written (`head` without its blank line) and returns the status and
    the rest of the response (read until the server closes or `timeout`)."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    try:
        s.sendall(head.encode() + b"\r\n\r\n" + body)
        data = b""
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in data and time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        status = int(data.split(b" ", 2)[1])
        s.settimeout(0.5)
        try:
            while len(data) < 65536:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (socket.timeout, OSError):
            pass
        return status, data
    finally:
        s.close()


# ------------------------------------------------------------------------------- DNS rebinding


def _foreign_host_requests(server: sb.Server, host: str) -> dict:
    ch = uniq("room:rebind-")
    body = json.dumps({"channel": ch, "data": 1}).encode()
    return {
        "publish": (
            f"POST /api/publish HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close",
            body,
        ),
        "listing": (f"GET /api/channels HTTP/1.1\r\nHost: {host}\r\nConnection: close", b""),
        "ws": (
            f"GET /ws HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13",
            b"",
        ),
        "sse": (f"GET /sse?channels={ch} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\nConnection: close",
                b""),
        "poll": (f"POST /poll HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close", b""),
        "dashboard": (f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close", b""),
    }


def test_hostile_dns_rebinding_foreign_host_is_refused_403(server, bystander):
    """Regression: with no origin allow-list an `Origin` equal to `Host` was accepted and `Host`
    never checked, so a page on a name rebound to 127.0.0.1 could publish (and read) on a
    loopback node. A node without an allow-list answers only to its own address names."""
    for host in [f"evil.test:{server.port}", "evil.test", f"localhost.evil.test:{server.port}"]:
        for what, (head, body) in _foreign_host_requests(server, host).items():
            status, resp = raw_request(server, head, body)
            assert status == 403, (host, what, status, resp[:300])
            if what != "ws":
                assert b"host not allowed" in resp, (what, resp[:300])
    # Nothing was published by the refused request.
    assert http("GET", server.http_url + "/api/channels?prefix=room:rebind-").json()["channels"] == []
    # Health, readiness and metrics carry no channel data and stay open to any name.
    for path in ["/healthz", "/readyz", "/metrics"]:
        status, _ = raw_request(server, f"GET {path} HTTP/1.1\r\nHost: evil.test\r\nConnection: close")
        assert status == 200, path
    bystander.check()


def test_hostile_dns_rebinding_own_names_are_accepted(server, bystander):
    ch = uniq("room:own-")
    body = json.dumps({"channel": ch, "data": 1}).encode()
    for host in [f"127.0.0.1:{server.port}", f"localhost:{server.port}", "LOCALHOST.", f"[::1]:{server.port}",
                 "127.0.0.2", "app.localhost"]:
        status, resp = raw_request(
            server,
            f"POST /api/publish HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close",
            body,
        )
        assert status == 200, (host, resp[:300])
    # HTTP/1.0 without a Host header: not a browser, accepted (docs/security.md).
    status, resp = raw_request(server, "GET /api/info HTTP/1.0")
    assert status == 200, resp[:300]
    # WebSocket handshake with the node's own name.
    status, resp = raw_request(
        server,
        f"GET /ws HTTP/1.1\r\nHost: localhost:{server.port}\r\nOrigin: http://localhost:{server.port}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13",
    )
    assert status == 101, resp[:300]
    bystander.check()


def test_hostile_dns_rebinding_configured_host_names(start_server):
    srv = start_server(env={"SWITCHBOARD_AUTH__HOSTS": "gw.example.test, other.example.test"})
    b = sb.Bystander(srv)
    try:
        for host, want in [("gw.example.test:8700", 200), ("OTHER.example.test", 200), ("evil.test", 403),
                           (f"127.0.0.1:{srv.port}", 200)]:
            status, resp = raw_request(srv, f"GET /api/channels HTTP/1.1\r\nHost: {host}\r\nConnection: close")
            assert status == want, (host, resp[:300])
        b.check()
    finally:
        b.close()


# ------------------------------------------------------------------------------ reply buffering


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_hostile_pipelined_history_without_reading_is_closed_4008_with_bounded_memory(server, bystander):
    """Regression: replies, pongs and presence frames bypassed `max_pending_bytes` and the read
    loop kept reading while the outbox was blocked, so a client pipelining `history` (100
    publications of 60 KB each: 6 MB per reply) without reading made the node queue without
    bound. Everything queued counts; the client is closed 4008 and stops being read."""
    import threading

    ch = uniq("big.")
    blob = "x" * 60_000
    for i in range(100):
        api_publish(server, ch, {"i": i, "blob": blob})
    before = rss_kb(server.pid)
    raw = sb.RawWS("127.0.0.1", server.port)
    sent = [0]

    def pipeline():
        try:
            for i in range(3000):
                raw.send_json({"id": i + 1, "history": {"channel": ch, "limit": 100}})
                sent[0] += 1
        except OSError:
            pass  # closed by the server, or stuck: it stopped reading (back-pressure)

    t = threading.Thread(target=pipeline, daemon=True)
    t.start()
    peak = before
    # Read within the server's close grace (3 s) so its close frame is not lost to a reset.
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        peak = max(peak, rss_kb(server.pid))
        time.sleep(0.05)
    growth_mb = (peak - before) / 1024
    assert growth_mb < 200, f"RSS grew {growth_mb:.0f} MB ({sent[0]} commands sent)"
    raw.sock.settimeout(10)
    code, _why = raw.read_until_close(lambda m: None, timeout=20)
    assert code == 4008, (code, _why)
    metrics = http("GET", server.http_url + "/metrics").text
    assert any(line.startswith("switchboard_slow_consumer_disconnects_total 1") for line in metrics.splitlines())
    raw.close()
    t.join(timeout=15)
    bystander.check()
    # The node still answers history to a client that reads: page by page (`more`), each
    # reply within the bound (docs/protocol.md, "Reply bound").
    with WS(server.ws_url) as ws:
        got, since = [], None
        for _ in range(100):
            body = {"channel": ch, "limit": 100, **({"since": since} if since else {})}
            h = ws.ok("history", body)
            got += [p["off"] for p in h["publications"]]
            if not h["more"]:
                break
            since = {"epoch": h["epoch"], "offset": got[-1]}
        assert len(got) == 100 and got == sorted(set(got))
    bystander.check()


# ------------------------------------------------------------------ poll sessions after a close


def test_hostile_poll_session_closed_4008_is_released_for_good(start_server):
    """Regression: after a 4008 (or 4001) close with no poll waiting, the sweeper released the
    session but left it live, so a later `POST /poll/{id}` subscribed and joined presence again
    and nothing ever released that: a ghost presence member. Now the POST gets 404, the
    presence list holds only real members, and the next poll still gets the disconnect."""
    from test_poll import Poller

    srv = start_server(env={"SWITCHBOARD_MAX_PENDING_BYTES": "16384"})
    b = sb.Bystander(srv)
    room = uniq("room:ghost-")
    watcher = WS(srv.ws_url)
    try:
        watcher.subscribe([room])
        me = watcher.ok("presence", {"channel": room})["clients"][0]["client"]
        watcher.drain()
        p = Poller(srv)
        assert p.request("subscribe", {"channels": [room]})["ok"]["channels"][room]["offset"] == 0
        joined = watcher.recv_where(lambda m: "join" in m and m["join"]["client"] != me)
        member = joined["join"]["client"]
        # Nobody polls while 40 KB arrive: past the bound, the session closes 4008.
        for i in range(40):
            api_publish(srv, room, {"i": i, "pad": "x" * 1000})
        left = watcher.recv_where(lambda m: "leave" in m, timeout=10)
        assert left["leave"]["client"] == member
        r = p.send({"id": 1, "subscribe": {"channels": [room]}})
        assert r.status_code == 404, r.text
        r = p.send({"id": 2, "subscribe": {"channels": [uniq("room:other-")]}})
        assert r.status_code == 404, r.text
        time.sleep(1.5)
        clients = http("GET", srv.http_url + f"/api/presence/{room}").json()["clients"]
        assert [c["client"] for c in clients] == [me], clients
        assert not any("join" in m for m in watcher.drain()), "a ghost joined"
        # The next poll still learns why, and the one after gets 404.
        r = p.http.get(f"{p.base}/poll/{p.id}", params={"timeout": 1})
        assert r.status_code == 200, r.text
        discs = [m["disconnect"] for m in r.json()["messages"] if "disconnect" in m]
        assert discs and discs[0]["code"] == 4008, r.text
        assert p.http.get(f"{p.base}/poll/{p.id}", params={"timeout": 1}).status_code == 404
        p.close()
        b.check()
    finally:
        watcher.close()
        b.close()



# ------------------------------------------------------------------------ presence amplification


def test_hostile_presence_churn_gets_429_and_members_see_bounded_events(start_server):
    """Regression: subscribe/unsubscribe of a presence channel were not rate-limited, so one
    frame alternating them sent join/leave events × members. Joins are limited per connection
    (`limits.presence_changes_per_connection_per_s`; leaves follow joins): the rest get 429."""
    srv = start_server(env={"SWITCHBOARD_EXEMPT_LOOPBACK": "false",
                            "SWITCHBOARD_PRESENCE_CHANGES_PER_CONNECTION_PER_S": "5"})
    b = sb.Bystander(srv)
    room = uniq("room:churn-")
    member = WS(srv.ws_url)
    attacker = WS(srv.ws_url)
    try:
        member.subscribe([room])
        member.drain()
        n = 200
        cmds = []
        for i in range(n):
            cmds.append(json.dumps({"id": 2 * i + 1, "subscribe": {"channels": [room]}}))
            cmds.append(json.dumps({"id": 2 * i + 2, "unsubscribe": {"channels": [room]}}))
        attacker.send_raw("\n".join(cmds))
        replies = {}
        deadline = time.monotonic() + 15
        while len(replies) < 2 * n and time.monotonic() < deadline:
            m = attacker.recv_where(lambda m: "id" in m, timeout=10)
            replies[m["id"]] = m
        subs = [replies[2 * i + 1] for i in range(n)]
        limited = [r for r in subs if r["ok"]["channels"][room].get("error", {}).get("code") == 429]
        joined = [r for r in subs if "error" not in r["ok"]["channels"][room]]
        assert len(limited) > n // 2, f"{len(limited)} of {n} subscribes limited"
        assert 1 <= len(joined) <= 30, len(joined)
        events = [m for m in member.drain(quiet=1.0) if "join" in m or "leave" in m]
        assert len(events) <= 2 * len(joined) and len(events) <= 60, len(events)
        # The member and its stream are fine, and a later join (after the rate refilled) works.
        b.check()
        time.sleep(1.0)
        ok = attacker.ok("subscribe", {"channels": [room]})["channels"][room]
        assert "error" not in ok, ok
    finally:
        attacker.close()
        member.close()
        b.close()


# ------------------------------------------------------------ poll takeover with an expired token

TAKEOVER_SECRET = "hostile-takeover-secret-0123456789abcdef0123456789"
TAKEOVER_KEY = "hostile-takeover-api-key-0123456789"


def _takeover_token(sub: str, exp: int) -> str:
    import jwt

    return jwt.encode({"sub": sub, "exp": exp}, TAKEOVER_SECRET, algorithm="HS256")


def _key_request(method: str, url: str, body=None) -> sb.HttpResponse:
    r = http(method, url, body, headers={"Authorization": f"Bearer {TAKEOVER_KEY}"})
    assert r.status == 200, (method, url, r.status, r.body)
    return r


@pytest.mark.parametrize("holder_goes", ["kill9", "shutdown"])
def test_hostile_poll_takeover_with_an_expired_token_runs_nothing_and_ends_4001(start_server, redis_url, holder_goes):
    """Regression: a long-poll session whose node went away (killed, or stopped: its record
    stays in Redis for another node) was taken over by the next request at another node and
    resubscribed, its queued commands run, with the stored token even when that had expired
    meanwhile: the client kept receiving (recovered publications, a presence join) and could
    publish past its `exp`. Now a takeover checks the expiry first: nothing is resubscribed,
    queued commands are dropped, the next poll answers exactly the 4001 disconnect (no
    reconnect) and the session is gone. A watcher on the channel (another connection, at the
    node that takes over) sees no publication and no join from the expired client and keeps
    receiving everything else."""
    from test_poll import Poller

    args = ("--broker", redis_url, "--jwt-secret", TAKEOVER_SECRET, "--api-key", TAKEOVER_KEY)
    a = start_server(*args, env={"SWITCHBOARD_NODE_ID": "node-a"})
    b = start_server(*args, env={"SWITCHBOARD_NODE_ID": "node-b"})
    room = uniq("room:takeover-")  # the room namespace: clients publish, presence is on
    watcher = WS(b.ws_url + "?token=" + _takeover_token("watcher", int(time.time()) + 600))
    p = None
    try:
        watcher.subscribe([room])
        watcher.drain()
        exp = int(time.time()) + 3
        p = Poller(a, [{"id": 1, "subscribe": {"channels": [room]}}],
                   headers={"Authorization": "Bearer " + _takeover_token("mallory", exp)})
        assert p.poll(timeout=5)["messages"][0]["ok"]["channels"][room]["offset"] == 0
        # While the token is valid, the session publishes (and the watcher sees it join).
        assert p.request("publish", {"channel": room, "data": "valid"})["ok"]["offset"] == 1
        assert watcher.pubs(room, 1) == [{"ch": room, "off": 1, "data": "valid"}]
        assert any("join" in m for m in watcher.drain()), "the session joined the room's presence"
        # Its node goes away before the token expires.
        if holder_goes == "kill9":
            a.kill()
        else:
            a.terminate()
            a.proc.wait(timeout=10)
        assert time.time() < exp, "too slow: the token expired before its node went away"
        time.sleep(max(0.0, exp + 1 - time.time()))

        # Published while nobody held the session: a resubscribe would recover it.
        after = _key_request("POST", b.http_url + "/api/publish", {"channel": room, "data": "after expiry"})
        assert after.json()["offset"] == 2
        assert watcher.pubs(room, 1) == [{"ch": room, "off": 2, "data": "after expiry"}]

        cmd = json.dumps({"id": 7, "publish": {"channel": room, "data": "expired"}})
        r = p.http.post(f"{b.http_url}/poll/{p.id}", content=cmd)
        if holder_goes == "kill9":
            # The record still names the dead node: the commands are queued for its holder.
            assert r.status_code == 202, r.text
        else:
            # Nobody holds it: this node takes it over at once, finds the token expired and
            # ends the session before the commands could run.
            assert r.status_code == 404 and r.json()["error"]["message"] == "unknown or expired session", r.text
        r = p.http.get(f"{b.http_url}/poll/{p.id}", params={"ack": p.seq, "timeout": 5})
        assert r.status_code == 200, r.text
        assert r.json() == {"seq": p.seq + 1, "messages": [
            {"disconnect": {"code": 4001, "reason": "token expired", "reconnect": False}}]}, r.text
        # The session is gone for good.
        assert p.http.get(f"{b.http_url}/poll/{p.id}", params={"timeout": 1}).status_code == 404
        assert p.http.post(f"{b.http_url}/poll/{p.id}", content=cmd).status_code == 404

        # Nothing ran on the expired token's behalf: no publication, no join at the watcher,
        # and the channel's history holds only the others' publications.
        seen = watcher.drain(quiet=1.5)
        assert not [m for m in seen if "pub" in m or "join" in m], seen
        later = _key_request("POST", b.http_url + "/api/publish", {"channel": room, "data": "later"})
        assert later.json()["offset"] == 3
        assert watcher.pubs(room, 1) == [{"ch": room, "off": 3, "data": "later"}]
        history = _key_request("GET", f"{b.http_url}/api/channels/{sb.ch_path(room)}/history").json()
        assert [x["data"] for x in history["publications"]] == ["valid", "after expiry", "later"], history
    finally:
        watcher.close()
        if p is not None:
            p.close()


# ------------------------------------------------------------------------------ TLS resets


def test_hostile2_tls_subscribers_reset_with_records_pending_leave_the_node_serving(switchboard_bin, tmp_path):
    """A TLS subscriber that stops reading and then resets its connection while the node still
    has records for it: the node's socket stays writable and takes nothing more. The node must
    let it go and keep serving everyone else — new TLS clients included — instead of retrying
    the write in a loop (which held a worker thread and with it the whole node)."""
    import ssl
    import struct

    ca, cert, key = sb.make_test_ca(tmp_path)
    port = sb.free_port()
    srv = sb.start_on_port(switchboard_bin, port, ["--tls-cert", str(cert), "--tls-key", str(key)],
                           str(tmp_path / "tls-node.log"))
    ctx = ssl.create_default_context(cafile=str(ca))

    def healthy() -> bool:
        try:
            with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                                 server_hostname="127.0.0.1") as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                return s.recv(100).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def publish(ch: str, data) -> None:
        body = json.dumps({"channel": ch, "data": data}).encode()
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                             server_hostname="127.0.0.1") as s:
            s.sendall(f"POST /api/publish HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
                      f"Content-Type: application/json\r\nConnection: close\r\n\r\n".encode() + body)
            assert s.recv(100).startswith(b"HTTP/1.1 200")

    try:
        bystander_ch = uniq("room:tls-bystander-")
        # Raw too: websockets' sync client reads and writes one `ssl.SSLSocket` from two threads,
        # which CPython's ssl module does not make safe (a TLS 1.3 session ticket arriving while
        # it sends its upgrade request sometimes loses the request).
        bystander = sb.RawWS("127.0.0.1", port, timeout=10, tls=ctx)
        try:
            bystander.send_json({"id": 1, "subscribe": {"channels": [bystander_ch]}})
            assert json.loads(bystander.recv_message(10)[1].split(b"\n")[0])["id"] == 1
            for round_ in range(3):
                ch = uniq("room:tls-reset-")
                # Raw connections: no reader thread, so resetting one cannot race a new socket for
                # its file descriptor.
                victims = []
                for _ in range(4):
                    v = sb.RawWS("127.0.0.1", port, rcvbuf=4096, tls=ctx)
                    v.send_json({"id": 1, "subscribe": {"channels": [ch]}})
                    assert json.loads(v.recv_message()[1])["id"] == 1
                    victims.append(v)
                # The victims read nothing more: their buffers and the node's fill up.
                for i in range(40):
                    publish(ch, "x" * 30_000 + str(i))
                for v in victims:
                    v.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    v.sock.close()
                publish(bystander_ch, round_)
                got = []
                while not any("pub" in m for m in got):  # a heartbeat ping may come first
                    got += [json.loads(line) for line in bystander.recv_message(10)[1].split(b"\n") if line]
                assert [m["pub"]["data"] for m in got if "pub" in m] == [round_], got
                deadline = time.monotonic() + 10
                while not healthy():
                    assert time.monotonic() < deadline, "the TLS node stopped answering after the resets"
                    time.sleep(0.2)
        finally:
            bystander.sock.close()
    finally:
        srv.kill()
