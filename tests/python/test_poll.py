"""Long-polling (`/poll`, SPEC §3, docs/protocol.md) with a client nobody on the project wrote:
`httpx`.

A session's polls return everything pending in one batch; commands go by POST with replies in
the polls, in order with the publications; `ack` makes a lost batch come again; slow pollers
get the latest value per point channel and 4008 past the bound; sessions expire; bad input gets
SPEC errors; authentication and limits apply as on a WebSocket."""

from __future__ import annotations

import json
import threading
import time

import httpx
import jwt
import pytest

import sb
from sb import api_batch, api_publish, uniq
from sse_client import SSE

SECRET = "poll-test-secret-0123456789abcdef0123456789abcdef"


class Poller:
    """A long-poll session driven with httpx."""

    def __init__(self, server, commands=None, headers: dict | None = None, query: str = ""):
        self.base = server.http_url
        self.http = httpx.Client(timeout=httpx.Timeout(60.0), trust_env=False)
        body = "\n".join(json.dumps(c) for c in commands or [])
        r = self.http.post(f"{self.base}/poll{query}", content=body, headers=headers or {})
        assert r.status_code == 200, r.text
        self.info = r.json()
        self.id = self.info["session"]
        self.seq = 0
        self.next_id = 100

    def poll(self, timeout: float | None = None, ack: int | None = None) -> dict:
        params = {"ack": self.seq if ack is None else ack}
        if timeout is not None:
            params["timeout"] = timeout
        r = self.http.get(f"{self.base}/poll/{self.id}", params=params)
        assert r.status_code == 200, r.text
        batch = r.json()
        self.seq = batch["seq"]
        return batch

    def send(self, *commands) -> httpx.Response:
        return self.http.post(f"{self.base}/poll/{self.id}", content="\n".join(json.dumps(c) for c in commands))

    def request(self, command: str, body: dict, timeout: float = 10.0):
        self.next_id += 1
        cid = self.next_id
        r = self.send({"id": cid, command: body})
        assert r.status_code == 202, r.text
        return self.reply(cid, timeout)

    def reply(self, cid: int, timeout: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.poll(timeout=1)["messages"]:
                if m.get("id") == cid:
                    return m
        raise TimeoutError(f"no reply to {cid}")

    def pubs(self, count: int, timeout: float = 10.0) -> list:
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            assert time.monotonic() < deadline, f"{len(out)} of {count} publications"
            out += [m["pub"] for m in self.poll(timeout=1)["messages"] if "pub" in m]
        return out

    def close(self) -> None:
        self.http.close()


@pytest.fixture
def poller(server):
    made = []

    def make(*a, **kw):
        p = Poller(server, *a, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def test_poll_open_subscribe_initial_and_live(server, poller):
    ch = uniq("poll.")
    api_publish(server, ch, "before")
    p = poller([{"id": 1, "subscribe": {"channels": [ch], "initial": True}}])
    assert len(p.id) == 32 and p.info["poll_timeout_s"] == 25
    batch = p.poll()
    [reply] = batch["messages"]
    r = reply["ok"]["channels"][ch]
    assert (r["offset"], r["last"]) == (1, {"ch": ch, "off": 1, "data": "before"})
    api_publish(server, ch, "after")
    assert p.pubs(1) == [{"ch": ch, "off": 2, "data": "after"}]


def test_poll_returns_everything_pending_in_one_batch(server, poller):
    ch = uniq("batch.")
    p = poller([{"id": 1, "subscribe": {"channels": [ch]}}])
    assert p.poll()["messages"][0]["id"] == 1
    api_batch(server, [{"channel": ch, "data": i} for i in range(50)])
    batch = p.poll()
    assert [m["pub"]["off"] for m in batch["messages"]] == list(range(1, 51))
    assert batch["seq"] == 2


def test_poll_is_held_until_a_publication_arrives(server, poller):
    ch = uniq("held.")
    p = poller([{"id": 1, "subscribe": {"channels": [ch]}}])
    p.poll()
    got = {}

    def wait():
        got["batch"] = p.poll(timeout=20)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.5)
    assert t.is_alive(), "the poll returned with nothing pending"
    api_publish(server, ch, "wake")
    t.join(timeout=20)
    assert not t.is_alive()
    assert got["batch"]["messages"] == [{"pub": {"ch": ch, "off": 1, "data": "wake"}}]


def test_poll_times_out_empty(start_server):
    srv = start_server(env={"SWITCHBOARD_POLL_TIMEOUT_S": "1"})
    p = Poller(srv)
    try:
        assert p.info["poll_timeout_s"] == 1
        batch = p.poll()
        assert batch == {"seq": 0, "messages": []}
    finally:
        p.close()


def test_poll_commands_replies_arrive_in_order_with_publications(server, poller):
    a, room = uniq("ord."), "room:" + uniq("ord.")
    p = poller()
    assert p.send({"id": 1, "subscribe": {"channels": [a, room]}},
                  {"id": 2, "publish": {"channel": room, "data": {"hi": 1}}},
                  {"id": 3, "ping": {"data": [1, 2]}}).status_code == 202
    msgs = []
    deadline = time.monotonic() + 10
    while not any(m.get("id") == 3 for m in msgs):
        assert time.monotonic() < deadline
        msgs += p.poll(timeout=1)["messages"]
    ids = [m.get("id") for m in msgs if "id" in m]
    assert ids == [1, 2, 3]
    sub_at = msgs.index(next(m for m in msgs if m.get("id") == 1))
    pub_at = msgs.index(next(m for m in msgs if "pub" in m))
    assert sub_at < pub_at, "the subscribe reply precedes the channel's publications"
    assert next(m for m in msgs if m.get("id") == 3)["ok"] == {"data": [1, 2]}
    assert next(m for m in msgs if m.get("id") == 2)["ok"]["offset"] == 1


def test_poll_ack_sends_a_lost_batch_again(server, poller):
    ch = uniq("ack.")
    p = poller([{"id": 1, "subscribe": {"channels": [ch]}}])
    p.poll()
    api_publish(server, ch, 1)
    first = p.poll()
    # The response "got lost": poll again acknowledging only the batch before it.
    again = p.poll(ack=first["seq"] - 1)
    assert again == first
    api_publish(server, ch, 2)
    nxt = p.poll(ack=first["seq"])
    assert nxt["seq"] == first["seq"] + 1
    assert [m["pub"]["off"] for m in nxt["messages"]] == [2]


def test_poll_ack_ahead_or_far_behind(server, poller):
    ch = uniq("ack2.")
    p = poller([{"id": 1, "subscribe": {"channels": [ch]}}])
    p.poll()
    r = p.http.get(f"{p.base}/poll/{p.id}", params={"ack": 99})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    for i in range(3):
        api_publish(server, ch, i)
        p.poll()
    # Two batches behind: the session cannot know what the client has; it must recover.
    batch = p.poll(ack=p.seq - 2)
    assert batch["messages"][-1]["disconnect"]["code"] == 4008
    assert p.http.get(f"{p.base}/poll/{p.id}").status_code == 404


def test_poll_slow_poller_gets_latest_point_values(server, poller):
    pt, ev = "pt:" + uniq("slow."), uniq("ev.")
    p = poller([{"id": 1, "subscribe": {"channels": [pt, ev]}}])
    p.poll()
    items = []
    for i in range(200):
        items.append({"channel": pt, "data": {"v": i}})
        items.append({"channel": ev, "data": i})
    api_batch(server, items)
    msgs = p.poll()["messages"]
    pts = [m["pub"] for m in msgs if m["pub"]["ch"] == pt]
    evs = [m["pub"]["data"] for m in msgs if m["pub"]["ch"] == ev]
    assert pts == [{"ch": pt, "off": 200, "data": {"v": 199}}], "one value per point channel: the latest"
    assert evs == list(range(200)), "queueing channels keep every publication"


def test_poll_session_past_the_bound_is_closed_with_4008(start_server):
    srv = start_server("--max-pending-bytes", "20000")
    ch = uniq("big.")
    p = Poller(srv, [{"id": 1, "subscribe": {"channels": [ch]}}])
    try:
        p.poll()
        api_batch(srv, [{"channel": ch, "data": "x" * 1000} for _ in range(100)])
        msgs = p.poll()["messages"]
        assert msgs[-1]["disconnect"]["code"] == 4008 and msgs[-1]["disconnect"]["reconnect"] is True
        assert len(msgs) < 30, "the backlog is dropped"
        r = p.http.get(f"{p.base}/poll/{p.id}")
        assert r.status_code == 404 and r.json()["error"]["code"] == 404
    finally:
        p.close()


def test_poll_sessions_expire_after_inactivity(start_server):
    srv = start_server(env={"SWITCHBOARD_POLL_SESSION_TTL_S": "1"})
    ch = uniq("exp.")
    p = Poller(srv, [{"id": 1, "subscribe": {"channels": [ch]}}])
    try:
        p.poll()
        assert sb.api_get(srv, "/api/info").json()["subscriptions"] == 1
        deadline = time.monotonic() + 15
        while sb.api_get(srv, "/api/info").json()["connections"] > 0:
            assert time.monotonic() < deadline, "the idle session did not expire"
            time.sleep(0.2)
        assert sb.api_get(srv, "/api/info").json()["subscriptions"] == 0
        r = p.http.get(f"{p.base}/poll/{p.id}")
        assert r.status_code == 404
    finally:
        p.close()


@pytest.mark.timeout(40)
def test_poll_sessions_are_not_closed_by_the_heartbeat_of_silent_connections(start_server):
    # The node closes a connection silent for three ping intervals; a session's liveness is
    # its own expiry instead: a poll held, a stream with nothing to send, or no request at all
    # for longer than that leave it open.
    srv = start_server("--ping-s", "1", env={"SWITCHBOARD_POLL_TIMEOUT_S": "5"})
    ch = uniq("beat.")
    held, streamed, quiet = (Poller(srv, [{"id": 1, "subscribe": {"channels": [ch]}}]) for _ in range(3))
    try:
        for p in (held, streamed, quiet):
            assert p.poll()["messages"][0]["id"] == 1
        with SSE(f"{srv.http_url}/sse?session={streamed.id}") as s:
            assert s.status == 200
            assert held.poll()["messages"] == [], "held for the whole 5 s timeout"
            time.sleep(0.5)  # the quiet session: 5.5 s without a request
            api_publish(srv, ch, {"x": 1})
            assert s.next(timeout=10).json() == {"pub": {"ch": ch, "off": 1, "data": {"x": 1}}}
        for p in (held, quiet):
            assert [m["pub"] for m in p.poll()["messages"]] == [{"ch": ch, "off": 1, "data": {"x": 1}}]
    finally:
        for p in (held, streamed, quiet):
            p.close()


def test_poll_delete_ends_the_session(server, poller):
    p = poller([{"id": 1, "subscribe": {"channels": [uniq("del.")]}}])
    p.poll()
    assert p.http.delete(f"{p.base}/poll/{p.id}").status_code == 204
    assert p.http.get(f"{p.base}/poll/{p.id}").status_code == 404
    assert p.http.delete(f"{p.base}/poll/{p.id}").status_code == 404


def test_poll_bad_input_gets_spec_errors(start_server):
    srv = start_server("--max-frame-bytes", "1000")
    p = Poller(srv)
    try:
        def err(r):
            return r.status_code, r.json()["error"]["code"]

        assert err(p.http.get(f"{p.base}/poll/{'0' * 32}")) == (404, 404)
        assert err(p.http.get(f"{p.base}/poll/{p.id}", params={"ack": "x"})) == (400, 400)
        assert err(p.http.get(f"{p.base}/poll/{p.id}", params={"timeout": "-1"})) == (400, 400)
        assert err(p.http.post(f"{p.base}/poll/{p.id}", content="{not json")) == (400, 400)
        assert err(p.http.post(f"{p.base}/poll/{p.id}", content="")) == (400, 400)
        assert err(p.http.post(f"{p.base}/poll/{p.id}", content=json.dumps({"id": 1, "ping": {"data": "x" * 2000}}))) == (413, 413)
        # The session survives bad requests; command errors come back as replies.
        bad = p.request("subscribe", {"channels": ["bad name", "fine"]})
        assert bad["ok"]["channels"]["bad name"]["error"]["code"] == 400
        assert "epoch" in bad["ok"]["channels"]["fine"]
        assert p.request("publish", {"channel": "nopub", "data": 1})["error"]["code"] == 403
        assert p.request("nosuch", {})["error"]["code"] == 404
        again = p.request("subscribe", {"channels": ["fine"]})
        assert again["ok"]["channels"]["fine"]["error"]["code"] == 409
        # A subscribe without id gets no reply; its failures come back with id 0.
        assert p.send({"subscribe": {"channels": ["also bad"]}}).status_code == 202
        msgs = p.poll(timeout=2)["messages"]
        assert msgs == [{"id": 0, "error": {"code": 400, "message": "some channels could not be subscribed"}}]
    finally:
        p.close()
    assert srv.alive()


def test_poll_authentication(start_server):
    srv = start_server("--jwt-secret", SECRET, env={"SWITCHBOARD_FIRST_MESSAGE_TIMEOUT_S": "1"})

    def tok(**claims):
        return jwt.encode({"sub": "bob", "exp": int(time.time()) + 600, **claims}, SECRET, algorithm="HS256")

    with httpx.Client(trust_env=False) as h:
        r = h.post(f"{srv.http_url}/poll", headers={"Authorization": "Bearer bad.bad.bad"})
        assert r.status_code == 401 and r.json()["error"]["code"] == 401
    ch = "room:" + uniq("auth.")
    # Credentials at open.
    p = Poller(srv, [{"id": 1, "subscribe": {"channels": [ch]}}], headers={"Authorization": "Bearer " + tok()})
    try:
        assert "epoch" in p.poll()["messages"][0]["ok"]["channels"][ch]
    finally:
        p.close()
    # Or a connect command, as on a WebSocket.
    p = Poller(srv, [{"id": 1, "connect": {"token": tok(channels=["room:*"])}}, {"id": 2, "subscribe": {"channels": [ch, "pt:x"]}}])
    try:
        msgs = p.poll()["messages"]
        assert msgs[0]["ok"]["user"] == "bob"
        assert msgs[1]["ok"]["channels"]["pt:x"]["error"]["code"] == 403
    finally:
        p.close()
    # Anonymous and silent: closed with 4001 after the first-message timeout.
    p = Poller(srv)
    try:
        deadline = time.monotonic() + 15
        bye = None
        while bye is None:
            assert time.monotonic() < deadline
            msgs = p.poll(timeout=1)["messages"]
            bye = next((m["disconnect"] for m in msgs if "disconnect" in m), None)
        assert bye["code"] == 4001 and bye["reconnect"] is False
    finally:
        p.close()


def test_poll_limits_apply(start_server):
    srv = start_server("--max-connections", "2")
    a, b = Poller(srv), Poller(srv)
    try:
        with httpx.Client(trust_env=False) as h:
            r = h.post(f"{srv.http_url}/poll")
            assert r.status_code == 429 and r.json()["error"]["code"] == 429
    finally:
        a.close()
        b.close()
    srv2 = start_server(env={"SWITCHBOARD_EXEMPT_LOOPBACK": "false", "SWITCHBOARD_MAX_CONNECTIONS_PER_IP": "1"})
    c = Poller(srv2)
    try:
        with httpx.Client(trust_env=False) as h:
            r = h.post(f"{srv2.http_url}/poll")
            assert r.status_code == 429
        ch = "room:" + uniq("rate.")
        c.request("subscribe", {"channels": [ch]})
        # The per-connection publish rate (100/s, bursts of 200) holds for poll sessions.
        cmds = [{"id": 1000 + i, "publish": {"channel": ch, "data": i}} for i in range(300)]
        assert c.send(*cmds).status_code == 202
        limited = []
        deadline = time.monotonic() + 10
        while not any(m.get("id") == 1299 for m in limited):
            assert time.monotonic() < deadline
            limited += [m for m in c.poll(timeout=1)["messages"] if "id" in m]
        assert any(m.get("error", {}).get("code") == 429 for m in limited)
    finally:
        c.close()


def test_poll_session_streamed_over_sse(server, poller):
    ch = uniq("attach.")
    p = poller()
    with SSE(f"{server.http_url}/sse?session={p.id}") as s:
        assert s.status == 200
        assert p.send({"id": 7, "subscribe": {"channels": [ch]}}).status_code == 202
        reply = s.next().json()
        assert reply["id"] == 7 and "epoch" in reply["ok"]["channels"][ch]
        api_publish(server, ch, {"x": 1})
        assert s.next().json() == {"pub": {"ch": ch, "off": 1, "data": {"x": 1}}}
        # A poll of a streamed session takes it over: the stream ends.
        batch = p.poll(timeout=1)
        assert batch["messages"] == []
        assert s.next(timeout=10) is None


def test_poll_open_with_an_empty_json_object_opens_a_session(server):
    """`POST /poll` with `{}` (what many HTTP clients send for a JSON POST) opens a session like
    an empty body."""
    with httpx.Client(timeout=10.0, trust_env=False) as http:
        for body in [{}, None]:
            r = http.post(f"{server.http_url}/poll", json=body) if body is not None else http.post(f"{server.http_url}/poll")
            assert r.status_code == 200, r.text
            session = r.json()["session"]
            assert isinstance(session, str) and session
            r = http.get(f"{server.http_url}/poll/{session}", params={"timeout": 0})
            assert r.status_code == 200, r.text
