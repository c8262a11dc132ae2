"""Fault isolation (docs/security.md, "Threat model"; docs/operations.md, "Supervised tasks"):
nothing one client sends, and no panic in the work done for one client, stops anybody else's
stream.

Two kinds of proof, with Python `websockets` and urllib as the clients:
- client numbers have floors: the rates that used to overflow the node's clocks are refused
  with 400 naming the field on every transport, and sampled clients that leave release their
  sockets at once;
- failpoints (a build with the `failpoints` feature, `$SWITCHBOARD_FAILPOINTS_BIN`, which
  `make test` builds; `PUT /api/failpoints/{name}`) inject panics in one subscriber's delivery,
  in one session's command handling, in the Redis link's reader and in the simulator: the
  victim is closed with 4008 (or, for the Redis link, its channel ends with an `unsubscribed`
  push) and recovers exactly, bystanders receive every publication with
  exact offsets, supervised tasks restart and are counted, and the node's open files,
  connections, subscriptions and presence are back at their baseline.
"""

from __future__ import annotations

import os
import pathlib
import re
import time
import urllib.parse

import pytest

import sb
from sb import WS, api_get, api_publish, http, uniq
from mqtt_kit import Mosquitto, Publisher
from test_poll import Poller
from test_source_mqtt import flowing, source_config

FAILPOINTS_BIN = os.environ.get("SWITCHBOARD_FAILPOINTS_BIN") or str(
    pathlib.Path(__file__).resolve().parents[2] / "target" / "debug" / "switchboard-failpoints")


# --------------------------------------------------------------------------------------------
# What a node holds, read from outside
# --------------------------------------------------------------------------------------------


def fds(srv: sb.Server) -> int:
    return len(os.listdir(f"/proc/{srv.pid}/fd"))


def info(srv: sb.Server) -> dict:
    return api_get(srv, "/api/info").json()


def settle(read, want, timeout: float = 15.0):
    """Polls `read()` until it returns `want` (state the node reaches by itself)."""
    deadline = time.monotonic() + timeout
    got = read()
    while got != want and time.monotonic() < deadline:
        time.sleep(0.1)
        got = read()
    return got


def baseline(srv: sb.Server) -> tuple:
    i = info(srv)
    return quiet_fds(srv), i["connections"], i["subscriptions"], i["channels"]


def quiet_fds(srv: sb.Server) -> int:
    """The node's open files once the socket of the request just made has closed: the same
    count three reads in a row, 100 ms apart (within 3 s)."""
    deadline = time.monotonic() + 3.0
    reads = [fds(srv)]
    while len(reads) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        n = fds(srv)
        reads = reads + [n] if n == reads[-1] else [n]
    return reads[-1]


def at_baseline(srv: sb.Server, base: tuple) -> None:
    got = settle(lambda: baseline(srv), base)
    assert got == base, f"(fds, connections, subscriptions, channels) {got} != baseline {base}"


def conn_id(ws: WS) -> str:
    """The node's id of this connection: the suffix of the client id `connect` answers."""
    client = ws.ok("connect", {})["client"]
    return client.rsplit("-", 1)[1]


def failpoint(srv: sb.Server, name: str, actions: str) -> None:
    r = http("PUT", f"{srv.http_url}/api/failpoints/{name}", raw=actions.encode())
    assert r.status == 204, (r.status, r.text)


# --------------------------------------------------------------------------------------------
# Floors on client numbers (the release binary)
# --------------------------------------------------------------------------------------------

TINY_RATES = [1e-19, 1e-30, 1e-300, 5e-324, 1e-9, 0.0099]


def test_faults_tiny_rates_are_refused_400_on_every_transport(server, bystander):
    base = baseline(server)
    ch = uniq("pt:floor.")
    with WS(server.ws_url) as ws:
        for hz in TINY_RATES:
            reply = ws.request("subscribe", {"channels": [ch], "max_rate_hz": hz})
            assert reply["error"]["code"] == 400 and "max_rate_hz" in reply["error"]["message"], reply
        # The floor itself is accepted, and publications still reach this subscriber.
        ws.subscribe([ch], max_rate_hz=0.01)
        api_publish(server, ch, {"v": 1, "q": "good"})
        assert ws.pubs(ch, 1)[0]["data"]["v"] == 1
    for hz in TINY_RATES:
        q = urllib.parse.urlencode({"channels": ch, "max_rate_hz": repr(hz)})
        r = http("GET", f"{server.http_url}/sse?{q}")
        assert r.status == 400 and "max_rate_hz" in r.text, (hz, r.status, r.text)
    poller = Poller(server)
    reply = poller.request("subscribe", {"channels": [ch], "max_rate_hz": 1e-19})
    assert reply["error"]["code"] == 400 and "max_rate_hz" in reply["error"]["message"], reply
    poller.http.delete(f"{server.http_url}/poll/{poller.id}")
    poller.http.close()
    # The next publication on the channel (where the tiny rates would have armed their
    # timers) reaches everybody, and the node is whole.
    api_publish(server, ch, {"v": 2, "q": "good"})
    bystander.check(5)
    at_baseline(server, base)


def test_faults_sampled_clients_that_leave_release_their_sockets_at_once(server, bystander):
    """A held value's timer (100 s at the slowest rate) holds no socket: clients that leave
    with a value held give their files back right away."""
    ch = uniq("pt:held.")
    api_publish(server, ch, {"v": 0, "q": "good"})
    base = baseline(server)
    clients = [WS(server.ws_url) for _ in range(60)]
    for ws in clients:
        ws.subscribe([ch], max_rate_hz=0.01)
    # The first value goes out; the second is held behind a 100 s timer for every client.
    api_publish(server, ch, {"v": 1, "q": "good"})
    for ws in clients:
        assert ws.pubs(ch, 1)[0]["data"]["v"] == 1
    api_publish(server, ch, {"v": 2, "q": "good"})
    bystander.check(2)
    # The clients' sockets are open now (the baseline's own HTTP sockets may come and go).
    assert fds(server) >= base[0] + len(clients) - 2
    for ws in clients:
        ws.close()
    at_baseline(server, base)
    bystander.check(2)


# --------------------------------------------------------------------------------------------
# Injected panics (the failpoints build)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fault_server(start_server, tmp_path):
    if not os.access(FAILPOINTS_BIN, os.X_OK):
        pytest.fail(f"failpoints build not found at {FAILPOINTS_BIN} (make failpoints-build)")

    def start(*args) -> sb.Server:
        log = tmp_path / f"fault{time.monotonic_ns()}.stderr.log"
        # Panics are logged as one line; a backtrace resolved in a debug build takes seconds.
        srv = sb.start_server(FAILPOINTS_BIN, list(args), str(log), startup_timeout=30,
                              env={"RUST_BACKTRACE": "0"})
        started.append(srv)
        return srv

    started: list[sb.Server] = []
    yield start
    for srv in started:
        srv.kill()


def test_faults_release_build_has_no_failpoints(server):
    r = http("PUT", f"{server.http_url}/api/failpoints/hub.deliver", raw=b"return")
    assert r.status == 404, (r.status, r.text)


def test_faults_panic_delivering_to_one_subscriber_closes_only_it(fault_server):
    srv = fault_server()
    ch = uniq("room:fan.")
    bystanders = [WS(srv.ws_url) for _ in range(3)]
    for b in bystanders:
        b.subscribe([ch])
    base = baseline(srv)
    victim = WS(srv.ws_url)
    start = victim.subscribe([ch])["channels"][ch]
    epoch, seen = start["epoch"], start["offset"]
    first = api_publish(srv, ch, {"n": 0})["offset"]
    assert victim.pubs(ch, 1)[0]["off"] == first
    seen = first
    failpoint(srv, "hub.deliver", f"return({conn_id(victim)})")
    offsets = [api_publish(srv, ch, {"n": i})["offset"] for i in range(1, 21)]
    assert offsets == list(range(first + 1, first + 21)), "every publish answered in order"
    failpoint(srv, "hub.deliver", "off")
    for b in bystanders:
        got = [p["off"] for p in b.pubs(ch, 21)]
        assert got == [first] + offsets
    closed = victim.wait_closed()
    assert closed.code == 4008, closed
    assert sb.metric(srv, "switchboard_panics_isolated_total", site="fanout") >= 1
    # The victim reconnects and recovers exactly what it missed.
    with WS(srv.ws_url) as again:
        r = again.subscribe([ch], recover={ch: {"epoch": epoch, "offset": seen}})["channels"][ch]
        assert r["complete"] is True
        assert [p["off"] for p in r["recovered"]] == offsets
    victim.close()
    at_baseline(srv, base)
    for b in bystanders:
        b.close()


def test_faults_panic_in_one_session_leaves_nothing_behind(fault_server):
    srv = fault_server()
    room = uniq("room:sess.")
    watcher = WS(srv.ws_url)
    watcher.subscribe([room])
    base = baseline(srv)
    victim = WS(srv.ws_url)
    vid = conn_id(victim)
    victim.subscribe([room, uniq("room:other.")])
    joined = watcher.recv_where(lambda m: "join" in m)
    assert joined["join"]["ch"] == room
    members = api_get(srv, f"/api/presence/{sb.ch_path(room)}").json()
    assert len(members["clients"]) == 2, members
    failpoint(srv, "session.command", f"return({vid})")
    victim.send({"id": 99, "ping": {}})
    closed = victim.wait_closed()
    assert closed.code == 4008, closed
    failpoint(srv, "session.command", "off")
    # Its presence leaves, its subscriptions and its connection are gone; the watcher streams.
    left = watcher.recv_where(lambda m: "leave" in m)
    assert left["leave"]["ch"] == room
    members = settle(lambda: len(api_get(srv, f"/api/presence/{sb.ch_path(room)}").json()["clients"]), 1)
    assert members == 1
    assert sb.metric(srv, "switchboard_panics_isolated_total", site="session") >= 1
    victim.close()
    at_baseline(srv, base)
    o = api_publish(srv, room, {"after": True})["offset"]
    assert watcher.pubs(room, 1)[0]["off"] == o
    watcher.close()


def test_faults_simulator_panic_restarts_it_and_is_counted(fault_server):
    srv = fault_server("--simulate", "4@20")
    assert sb.metric(srv, "switchboard_task_restarts_total", task="simulator") == 0
    with WS(srv.ws_url) as ws:
        start = ws.subscribe(["pt:sim.0"])["channels"]["pt:sim.0"]["offset"]
        before = [p["off"] for p in ws.pubs("pt:sim.0", 10)]
        failpoint(srv, "simulator.tick", "1*return")
        after = [p["off"] for p in ws.pubs("pt:sim.0", 30, timeout=20)]
    offs = before + after
    # One stream going on: offsets only grow (a point channel may conflate under load, so a
    # skipped offset is allowed; a repeat or a step back is not).
    assert offs[0] > start and all(b > a for a, b in zip(offs, offs[1:])), offs
    assert sb.metric(srv, "switchboard_task_restarts_total", task="simulator") == 1
    assert srv.alive()


def test_faults_redis_link_panic_restarts_it_and_its_clients_recover(fault_server, redis_url):
    srv = fault_server("--broker", redis_url)
    hit, other = uniq("room:link."), uniq("room:calm.")
    victim = WS(srv.ws_url)
    start = victim.subscribe([hit])["channels"][hit]
    calm = WS(srv.ws_url)
    calm_off = calm.subscribe([other])["channels"][other]["offset"]
    first = api_publish(srv, hit, {"n": 0})["offset"]
    assert victim.pubs(hit, 1)[0]["off"] == first
    failpoint(srv, "redis.link.deliver", f"1*return({hit})")
    offsets = [api_publish(srv, hit, {"n": i})["offset"] for i in range(1, 6)]
    # The link's reader panicked on the publication: the task restarts (counted) and the
    # channel's subscribers are told to recover (an `unsubscribed` push, 4008), not left
    # silently behind; they subscribe it again on the same connection.
    assert settle(lambda: sb.metric(srv, "switchboard_task_restarts_total", task="redis-link"), 1) == 1
    told = victim.recv_where(lambda m: "unsubscribed" in m or "pub" in m, timeout=20)
    assert told == {"unsubscribed": {"ch": hit, "code": 4008, "resubscribe": True,
                                     "reason": told["unsubscribed"]["reason"]}}, told
    r = victim.subscribe([hit], recover={hit: {"epoch": start["epoch"], "offset": first}})["channels"][hit]
    assert r["complete"] is True
    assert [p["off"] for p in r["recovered"]] == offsets
    later = api_publish(srv, hit, {"n": "live"})["offset"]
    assert victim.pubs(hit, 1)[0]["off"] == later
    # A channel the panic did not touch streams on with exact offsets (or, when the link could
    # not prove it missed nothing, is told the same way).
    got = []
    for i in range(5):
        o = api_publish(srv, other, {"i": i})["offset"]
        got.append(o)
    seen = []
    while len(seen) < 5:
        m = calm.recv_where(lambda m: "pub" in m or "unsubscribed" in m, timeout=20)
        if "unsubscribed" in m:
            assert m["unsubscribed"]["ch"] == other, m
            break
        seen.append(m["pub"]["off"])
    else:
        assert seen == got == list(range(calm_off + 1, calm_off + 6))
    assert victim.closed is None and calm.closed is None
    victim.close()
    calm.close()


def test_faults_source_decode_panic_refuses_that_message_only(fault_server, tmp_path):
    """A panic decoding one device's messages refuses those messages (counted as decode) while
    the source stays connected and every other topic keeps flowing (mosquitto, and a
    hand-written MQTT 3.1.1 publisher)."""
    mq = Mosquitto(tmp_path).start()
    pub = None
    try:
        srv = fault_server("--config", source_config(tmp_path, mq))
        flowing(srv, mq)
        u = uniq()
        poison, calm = f"plant/{u}/poison", f"plant/{u}/calm"
        ch = {t: "pt:" + t.replace("/", ".") for t in (poison, calm)}
        pub = Publisher(mq.port, uniq("pub-"))
        reconnects = sb.metric(srv, "switchboard_source_reconnects_total", source="plant", kind="mqtt")
        refused = sb.metric(srv, "switchboard_source_refused_total", source="plant", kind="mqtt", reason="decode")
        with WS(srv.ws_url) as ws:
            ws.subscribe(list(ch.values()))
            failpoint(srv, "source.decode", f"return({poison})")
            for i in range(5):
                pub.publish(poison, str(i))
                pub.publish(calm, str(i))
            # Point channels conflate (latest value wins), so the last value is what must arrive.
            got = settle(lambda: ws.pubs(ch[calm], 1)[0]["data"]["v"], 4)
            assert got == 4
            assert api_get(srv, f"/api/channels/{sb.ch_path(ch[calm])}").json()["offset"] == 5
            failpoint(srv, "source.decode", "off")
            pub.publish(poison, "10")
            first = ws.pubs(ch[poison], 1)[0]
            assert (first["off"], first["data"]["v"]) == (1, 10), "the refused messages never reached the channel"
        assert sb.metric(srv, "switchboard_source_refused_total", source="plant", kind="mqtt",
                      reason="decode") == refused + 5
        assert sb.metric(srv, "switchboard_panics_isolated_total", site="source-decode") == 5
        assert sb.metric(srv, "switchboard_source_reconnects_total", source="plant", kind="mqtt") == reconnects
        assert sb.metric(srv, "switchboard_source_connected", source="plant", kind="mqtt") == 1
        assert sb.metric(srv, "switchboard_task_restarts_total", task="source") == 0
    finally:
        if pub is not None:
            pub.close()
        mq.stop()


def test_faults_metrics_list_every_supervised_task(server):
    text = api_get(server, "/metrics").text
    tasks = set(re.findall(r'switchboard_task_restarts_total\{task="([^"]+)"\}', text))
    assert {"channel-sweeper", "heartbeats", "poll-sweeper", "poll-notices"} <= tasks, tasks
