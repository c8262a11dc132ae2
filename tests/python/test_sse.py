"""Server-Sent Events (`GET /sse`, SPEC §3, docs/protocol.md) with a client nobody on the
project wrote: `httpx` streaming, parsed by the event-stream rules of the HTML standard.

Publications, initial values, event ids carrying every channel's position, recovery with
`Last-Event-ID` (header and `lastEventId` query), heartbeats, conflation and the 4008 bound for
a reader that stops, shutdown, and bad input answered with SPEC errors."""

from __future__ import annotations

import time
import urllib.parse

import jwt
import pytest

import sb
from sb import api_batch, api_publish, http, uniq
from sse_client import SSE, RawSSE

SECRET = "sse-test-secret-0123456789abcdef0123456789abcdef"


def sse_url(server, channels, **params) -> str:
    q = {"channels": ",".join(channels), **params}
    return f"{server.http_url}/sse?{urllib.parse.urlencode(q)}"


def parse_id(event_id: str) -> dict:
    out = {}
    for part in event_id.split(";"):
        rest, off = part.rsplit(":", 1)
        ch, epoch = rest.rsplit("@", 1)
        out[ch] = (epoch, int(off))
    return out


def test_sse_publications_initial_values_and_ids(server):
    a, p = uniq("news."), "pt:" + uniq("boiler.")
    pa1 = api_publish(server, a, {"n": 1})
    api_publish(server, a, {"n": 2})
    pp = api_publish(server, p, {"v": 71.5, "q": "good"})
    with SSE(sse_url(server, [a, p], initial="true")) as s:
        assert s.status == 200
        assert s.headers["content-type"].startswith("text/event-stream")
        sub = s.next_event("subscribed").json()["subscribed"]["channels"]
        assert sub[a] == {"epoch": pa1["epoch"], "offset": 2, "complete": True}
        assert sub[p]["offset"] == 1 and sub[p]["epoch"] == pp["epoch"]
        (ea, first), (ep, second) = s.pubs(2)
        assert first == {"ch": a, "off": 2, "data": {"n": 2}}, "the initial value is the latest"
        assert second == {"ch": p, "off": 1, "data": {"v": 71.5, "q": "good"}}
        assert parse_id(ep.id) == {a: (pa1["epoch"], 2), p: (pp["epoch"], 1)}
        api_publish(server, a, {"n": 3})
        [(e3, live)] = s.pubs(1)
        assert live == {"ch": a, "off": 3, "data": {"n": 3}}
        assert parse_id(e3.id) == {a: (pa1["epoch"], 3), p: (pp["epoch"], 1)}
        assert s.parser.retry and s.parser.retry > 0


def test_sse_single_channel_ids_are_exactly_the_spec_form(server):
    ch = uniq("one.")
    with SSE(sse_url(server, [ch])) as s:
        s.next_event("subscribed")
        r = api_publish(server, ch, "x")
        [(e, p)] = s.pubs(1)
        assert e.id == f"{ch}@{r['epoch']}:{r['offset']}"
        assert p["data"] == "x"


def test_sse_without_initial_sends_only_new_publications(server):
    ch = uniq("fresh.")
    api_publish(server, ch, "old")
    with SSE(sse_url(server, [ch])) as s:
        s.next_event("subscribed")
        api_publish(server, ch, "new")
        [(_, p)] = s.pubs(1)
        assert (p["off"], p["data"]) == (2, "new")


@pytest.mark.parametrize("via", ["header", "query"])
def test_sse_last_event_id_recovers_what_every_channel_missed(server, via):
    a, b = uniq("rec.a."), uniq("rec.b.")
    with SSE(sse_url(server, [a, b])) as s:
        s.next_event("subscribed")
        api_publish(server, a, 1)
        api_publish(server, b, 1)
        (_, _), (last, _) = s.pubs(2)
    # Missed while disconnected: several on each channel, interleaved.
    for i in range(2, 6):
        api_publish(server, a, i)
        api_publish(server, b, i * 10)
    params, headers = {}, {}
    if via == "header":
        headers["Last-Event-ID"] = last.id
    else:
        params["lastEventId"] = last.id
    with SSE(sse_url(server, [a, b], **params), headers=headers) as s:
        sub = s.next_event("subscribed").json()["subscribed"]["channels"]
        assert sub[a]["complete"] and sub[b]["complete"]
        got = [(p["ch"], p["off"], p["data"]) for _, p in s.pubs(8)]
        assert [g for g in got if g[0] == a] == [(a, i, i) for i in range(2, 6)]
        assert [g for g in got if g[0] == b] == [(b, i, i * 10) for i in range(2, 6)]
        # Then live, exactly once.
        api_publish(server, b, "live")
        [(e, p)] = s.pubs(1)
        assert (p["ch"], p["off"]) == (b, 6)
        assert parse_id(e.id)[a][1] == 5 and parse_id(e.id)[b][1] == 6


def test_sse_recovery_past_history_says_incomplete_and_gives_the_latest_value(start_server):
    srv = start_server(env={"SWITCHBOARD_NAMESPACES__SHORT__HISTORY_SIZE": "2"})
    ch = "short:" + uniq("h.")
    first = api_publish(srv, ch, 0)
    for i in range(1, 10):
        api_publish(srv, ch, i)
    last_id = f"{ch}@{first['epoch']}:1"
    with SSE(sse_url(srv, [ch]), headers={"Last-Event-ID": last_id}) as s:
        sub = s.next_event("subscribed").json()["subscribed"]["channels"][ch]
        assert sub["complete"] is False
        # What history still holds, then nothing twice; it ends on the latest value.
        offs = []
        while not offs or offs[-1] < 10:
            [(_, p)] = s.pubs(1)
            offs.append(p["off"])
        assert offs == sorted(set(offs)) and offs[0] > 2
        assert (p["off"], p["data"]) == (10, 9)


def test_sse_heartbeat_comments_keep_an_idle_stream_alive(start_server):
    srv = start_server(env={"SWITCHBOARD_SSE_HEARTBEAT_S": "1"})
    with SSE(sse_url(srv, [uniq("idle.")])) as s:
        s.next_event("subscribed")
        pings = []
        deadline = time.monotonic() + 15
        while len(pings) < 2 and time.monotonic() < deadline:
            item = s.next(timeout=10, comments=True)
            assert item is not None
            if isinstance(item, tuple):
                pings.append(item[1])
        assert pings == ["ping", "ping"]


def test_sse_many_channels_ids_name_the_events_own_channel(server):
    chans = [uniq(f"m{i}.") for i in range(40)]
    with SSE(sse_url(server, chans)) as s:
        s.next_event("subscribed")
        r = api_publish(server, chans[7], "x")
        [(e, _)] = s.pubs(1)
        assert e.id == f"{chans[7]}@{r['epoch']}:1"


def test_sse_presence_events(server):
    room = "room:" + uniq("sse.")
    with SSE(sse_url(server, [room])) as s:
        s.next_event("subscribed")
        with sb.WS(server.ws_url) as w:
            w.subscribe([room])
            join = s.next_event("join").json()["join"]
            assert join["ch"] == room


@pytest.mark.timeout(120)
def test_sse_reader_that_stops_gets_latest_point_values_and_4008_on_overflow(start_server):
    srv = start_server("--max-pending-bytes", "200000")
    pts = ["pt:" + uniq("slow.") + f".{i}" for i in range(5)]
    path = "/sse?" + urllib.parse.urlencode({"channels": ",".join(pts)})
    raw = RawSSE("127.0.0.1", srv.port, path, rcvbuf=4096)
    try:
        raw.events(until=lambda ev: any(e.event == "subscribed" for e in ev))
        # The client stops reading while far more than the bound is published.
        pad = "p" * 200
        total = 20_000
        for start in range(0, total, 2000):
            api_batch(srv, [{"channel": pts[j % 5], "data": {"v": j, "pad": pad}} for j in range(start, start + 2000)])
        # Reading again: every channel ends on its final value, and the stream is still open.
        final = {c: total - 5 + i for i, c in enumerate(pts)}

        def reached(ev):
            last = {}
            for e in ev:
                if e.event == "message":
                    p = e.json()["pub"]
                    last[p["ch"]] = p["data"]["v"]
            return all(last.get(c) == v for c, v in final.items())

        events = raw.events(timeout=30, until=reached)
        assert reached(events), "final point values not delivered"
        assert not raw.ended, "a conflated stream must not be closed"
        received = sum(1 for e in events if e.event == "message")
        assert received < total / 2, f"{received} of {total}: nothing was conflated"
    finally:
        raw.close()

    # A queueing channel past the bound: the stream gets 4008 and ends.
    ev = uniq("queue.")
    raw = RawSSE("127.0.0.1", srv.port, "/sse?channels=" + ev, rcvbuf=4096)
    try:
        raw.events(until=lambda e: any(x.event == "subscribed" for x in e))
        big = "x" * 2000
        for start in range(0, 2000, 500):
            api_batch(srv, [{"channel": ev, "data": big} for _ in range(500)])
        events = raw.events(timeout=30, until=lambda e: any(x.event == "disconnect" for x in e))
        bye = [e for e in events if e.event == "disconnect"]
        assert bye and bye[0].json()["disconnect"]["code"] == 4008
        assert bye[0].json()["disconnect"]["reconnect"] is True
        raw.events(timeout=10)
        assert raw.ended, "the stream ends after the disconnect"
    finally:
        raw.close()
    assert srv.alive()


def test_sse_shutdown_ends_streams_with_4000(start_server):
    srv = start_server()
    s = SSE(sse_url(srv, [uniq("bye.")]))
    try:
        s.next_event("subscribed")
        srv.terminate()
        bye = s.next_event("disconnect", timeout=10).json()["disconnect"]
        assert bye["code"] == 4000 and bye["reconnect"] is True
        assert s.next(timeout=10) is None
    finally:
        s.close()


def test_sse_bad_input_gets_spec_errors(start_server):
    srv = start_server("--max-subscriptions", "3")

    def get(query: str, headers: dict | None = None):
        r = http("GET", f"{srv.http_url}/sse{query}", headers=headers)
        return r.status, (r.json()["error"] if r.status != 200 else None)

    assert get("")[0] == 400
    assert get("?channels=")[0] == 400
    status, err = get("?channels=" + urllib.parse.quote("bad name"))
    assert status == 400 and err["code"] == 400 and "bad name" in err["message"]
    status, err = get("?channels=a,b,c,d")
    assert status == 429 and err["code"] == 429
    status, err = get("?channels=a", {"Last-Event-ID": "not-an-id"})
    assert status == 400 and "Last-Event-ID" in err["message"]
    status, _ = get("?channels=a&lastEventId=a%40e%3Axyz")
    assert status == 400
    status, err = get("?channels=a", {"Origin": "http://evil.example"})
    assert status == 403
    assert srv.alive()


def test_sse_authentication_and_permissions(start_server):
    srv = start_server("--jwt-secret", SECRET)

    def tok(**claims):
        body = {"sub": "ann", "exp": int(time.time()) + 600, **claims}
        return jwt.encode(body, SECRET, algorithm="HS256")

    r = http("GET", f"{srv.http_url}/sse?channels=a")
    assert r.status == 401 and r.json()["error"]["code"] == 401
    r = http("GET", f"{srv.http_url}/sse?channels=a", headers={"Authorization": "Bearer nope.nope.nope"})
    assert r.status == 401
    r = http("GET", f"{srv.http_url}/sse?channels=secret:x&token=" + tok(channels=["room:*"]))
    assert r.status == 403 and r.json()["error"]["code"] == 403
    ch = "room:" + uniq("auth.")
    with SSE(f"{srv.http_url}/sse?channels={ch}", headers={"Authorization": "Bearer " + tok()}) as s:
        s.next_event("subscribed")
        api = http("POST", srv.http_url + "/api/publish", {"channel": ch, "data": 1},
                   headers={"Authorization": "Bearer " + tok(publish=["**"])})
        assert api.status == 200, api.body
        [(_, p)] = s.pubs(1)
        assert p["data"] == 1
    # A token that expires ends its stream with 4001.
    with SSE(f"{srv.http_url}/sse?channels={ch}&token=" + tok(exp=int(time.time()) + 2)) as s:
        s.next_event("subscribed")
        bye = s.next_event("disconnect", timeout=15).json()["disconnect"]
        assert bye["code"] == 4001 and bye["reconnect"] is False


def test_sse_connection_limits_apply(start_server):
    # A client that went away is noticed at the next write: the heartbeat at the latest.
    srv = start_server("--max-connections", "2", env={"SWITCHBOARD_SSE_HEARTBEAT_S": "1"})
    streams = [SSE(sse_url(srv, [uniq("c.")])) for _ in range(2)]
    try:
        for s in streams:
            s.next_event("subscribed")
        r = http("GET", sse_url(srv, [uniq("c.")]))
        assert r.status == 429 and r.json()["error"]["code"] == 429
        info = sb.api_get(srv, "/api/info").json()
        assert info["connections"] == 2
    finally:
        for s in streams:
            s.close()
    # Closed streams free their connections.
    deadline = time.monotonic() + 10
    while sb.api_get(srv, "/api/info").json()["connections"] > 0:
        assert time.monotonic() < deadline, "connections not released after the streams closed"
        time.sleep(0.1)


def test_sse_and_poll_basic_credentials_with_the_password_check_limit(start_server, switchboard_bin, tmp_path):
    import base64

    users = tmp_path / "users"
    sb.add_user(switchboard_bin, users, "ann", "correct-horse-battery")
    srv = start_server("--users", str(users), env={
        "SWITCHBOARD_EXEMPT_LOOPBACK": "false", "SWITCHBOARD_PASSWORD_CHECKS_PER_IP_PER_S": "1"})

    def basic(pw):
        return {"Authorization": "Basic " + base64.b64encode(f"ann:{pw}".encode()).decode()}

    ch = uniq("basic.")
    with SSE(sse_url(srv, [ch]), headers=basic("correct-horse-battery")) as s:
        assert s.status == 200
        s.next_event("subscribed")
    r = http("POST", srv.http_url + "/poll", headers=basic("correct-horse-battery"))
    assert r.status == 200, r.body
    # Wrong passwords cost an Argon2 check each: past the address's rate they get 429.
    statuses = [http("GET", sse_url(srv, [ch]), headers=basic(f"wrong-{i}")).status for i in range(6)]
    assert statuses[0] == 401 and 429 in statuses, statuses
    assert all(st in (401, 429) for st in statuses)
