"""Trend history on open (docs/protocol.md, "Trends"): point channels keep an hour of
one-second buckets of min/max/last/count; `GET /api/channels/{ch}/trend` and the `trend` option
of subscribe return them, so a plot opens full and continues live without a gap or duplicate.
Driven with httpx and Python `websockets`."""

from __future__ import annotations

import time

import httpx

from sb import WS, api_batch, api_publish, ch_path, uniq


def test_trend_reads_buckets_and_subscribe_opens_full_then_continues_live(server):
    ch = uniq("pt:tr-")
    c = httpx.Client(base_url=server.http_url, timeout=10, trust_env=False)
    sent = []
    for i in range(12):
        v = float(i % 5) - 1.5
        api_publish(server, ch, {"v": v, "q": "good"})
        sent.append(v)
        time.sleep(0.1)
    api_publish(server, ch, {"v": "not a number"})  # left out of the trend
    body = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": 60}).json()
    assert body["step_s"] == 1
    buckets = body["buckets"]
    assert 1 <= len(buckets) <= 3 and sum(b["n"] for b in buckets) == 12, buckets
    assert all(b["t"] % 1000 == 0 for b in buckets) and [b["t"] for b in buckets] == sorted(b["t"] for b in buckets)
    assert min(b["min"] for b in buckets) == min(sent) and max(b["max"] for b in buckets) == max(sent)
    assert buckets[-1]["last"] == sent[-1]
    # Coarser buckets merge the stored ones.
    coarse = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": 60, "step_s": 60}).json()
    assert coarse["step_s"] == 60 and sum(b["n"] for b in coarse["buckets"]) == 12, coarse
    # A step between multiples of the stored one (1 s by default) is rounded up, and said so.
    odd = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": 60, "step_s": 7}).json()
    assert odd["step_s"] == 7 and sum(b["n"] for b in odd["buckets"]) == 12, odd
    # Subscribe with a trend: the reply holds the buckets; what follows arrives live, once.
    with WS(server.ws_url) as ws:
        r = ws.ok("subscribe", {"channels": [ch], "initial": True, "trend": {"window_s": 60}})["channels"][ch]
        assert sum(b["n"] for b in r["trend"]["buckets"]) == 12 and r["trend"]["step_s"] == 1
        assert r["last"]["data"] == {"v": "not a number"}
        api_publish(server, ch, {"v": 42})
        live = ws.pubs(ch, 1)
        assert live[0]["data"] == {"v": 42} and live[0]["off"] == r["offset"] + 1
        assert [m for m in ws.drain(0.3) if "pub" in m] == []
    after = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": 60}).json()["buckets"]
    assert sum(b["n"] for b in after) == 13 and after[-1]["last"] == 42
    c.close()


def test_a_window_of_whole_steps_covers_its_start_even_when_it_falls_inside_a_bucket(server):
    # Values on both sides of a minute boundary M, each at its own time; the window
    # [M - 30 s, M + 30 s] is one step of 60 s, and must hold all three.
    ch = uniq("pt:tw-")
    now = int(time.time() * 1000)
    m = now - now % 60_000 - 120_000
    api_batch(server, [{"channel": ch, "data": {"v": v, "t": t}} for v, t in [(1, m - 2000), (2, m - 1000), (3, m + 500)]])
    c = httpx.Client(base_url=server.http_url, timeout=10, trust_env=False)
    params = {"window_s": 60, "step_s": 60, "until_ms": m + 30_000}
    body = c.get(f"/api/channels/{ch_path(ch)}/trend", params=params).json()
    assert body["step_s"] == 60, body
    assert [(b["t"], b["n"], b["min"], b["max"]) for b in body["buckets"]] == [(m - 60_000, 2, 1, 2), (m, 1, 3, 3)], body
    # The stored 1 s buckets of the same window: all three, none before its start's bucket.
    fine = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": 60, "until_ms": m + 30_000}).json()
    assert [b["t"] for b in fine["buckets"]] == [m - 2000, m - 1000, m], fine
    c.close()


def test_trend_bad_queries_and_channels_without_a_trend(server):
    c = httpx.Client(base_url=server.http_url, timeout=10, trust_env=False)
    ch, room = uniq("pt:tb-"), uniq("room:tb-")
    api_publish(server, ch, {"v": 1})
    api_publish(server, room, {"text": "hi"})
    for params, field in [({"window_s": 0}, "window_s"), ({"window_s": 10**9}, "window_s"),
                          ({"window_s": 60, "step_s": 0}, "step_s"), ({"window_s": 60, "step_s": 120}, "step_s")]:
        r = c.get(f"/api/channels/{ch_path(ch)}/trend", params=params)
        assert r.status_code == 400 and field in r.text, (params, r.text)
    assert c.get(f"/api/channels/{ch_path(uniq('pt:never-'))}/trend").status_code == 404
    r = c.get(f"/api/channels/{ch_path(room)}/trend")
    assert r.status_code == 404 and "keeps no trend" in r.text, r.text
    with WS(server.ws_url) as ws:
        r = ws.ok("subscribe", {"channels": [room], "trend": {"window_s": 60}})["channels"][room]
        assert r["error"]["code"] == 404, r
        r = ws.request("subscribe", {"channels": [ch], "trend": {"window": 60}})
        assert r["error"]["code"] == 400 and "window" in r["error"]["message"], r
    c.close()


def test_trend_step_is_rounded_up_to_the_stored_step(start_server):
    # A namespace storing 5 s buckets: a client asking for 7 s buckets gets 10 s ones, told so
    # in the reply, over HTTP and in the subscribe reply.
    srv = start_server(env={"SWITCHBOARD_NAMESPACES__PT__TREND_STEP_S": "5"})
    c = httpx.Client(base_url=srv.http_url, timeout=10, trust_env=False)
    ch = uniq("pt:step-")
    for v in range(3):
        api_publish(srv, ch, {"v": v})
    r = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": 60, "step_s": 7}).json()
    assert r["step_s"] == 10 and sum(b["n"] for b in r["buckets"]) == 3, r
    assert all(b["t"] % 10_000 == 0 for b in r["buckets"]), r
    with WS(srv.ws_url) as ws:
        got = ws.ok("subscribe", {"channels": [ch], "trend": {"window_s": 60, "step_s": 3}})["channels"][ch]
        assert got["trend"]["step_s"] == 5 and sum(b["n"] for b in got["trend"]["buckets"]) == 3, got
    assert c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": 4, "step_s": 3}).status_code == 400
    c.close()


def _redis(tmp_path):
    """A real redis-server on a spare loopback port (stopped by PID by the caller)."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"redis://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not start")


def test_trend_survives_a_node_restart_with_redis_and_continues_across_a_reconnect(start_server, tmp_path):
    # A client follows a point's trend on node A; A is killed; publications continue through
    # node B; the client reconnects to B with its position and the trend option: the trend
    # holds every value from before and during the outage (B serves what A filed), the
    # missed publications are recovered once, and live values follow — no gap, no duplicate.
    redis, url = _redis(tmp_path)
    try:
        # Point channels keep no history by default (the latest value is their recovery);
        # this node keeps some, so that the missed publications can be replayed.
        env = {"SWITCHBOARD_NAMESPACES__PT__HISTORY_SIZE": "100"}
        a = start_server("--broker", url, env=env)
        b = start_server("--broker", url, env=env)
        ch = uniq("pt:rtr-")
        for v in range(5):
            api_publish(a, ch, {"v": v})
        with WS(a.ws_url) as ws:
            r = ws.ok("subscribe", {"channels": [ch], "trend": {"window_s": 60}})["channels"][ch]
            assert sum(x["n"] for x in r["trend"]["buckets"]) == 5, r
            api_publish(a, ch, {"v": 5})
            seen = ws.pubs(ch, 1)
            pos = {"epoch": r["epoch"], "offset": seen[-1]["off"]}
        a.kill()
        for v in (6, 7):
            api_publish(b, ch, {"v": v})
        with WS(b.ws_url) as ws:
            r = ws.ok("subscribe", {"channels": [ch], "recover": {ch: pos}, "trend": {"window_s": 60}})["channels"][ch]
            assert r["complete"] is True and r["epoch"] == pos["epoch"], r
            assert [p["data"]["v"] for p in r["recovered"]] == [6, 7], r
            assert sum(x["n"] for x in r["trend"]["buckets"]) == 8 and r["trend"]["buckets"][-1]["last"] == 7, r
            api_publish(b, ch, {"v": 8})
            live = ws.pubs(ch, 1)
            assert live[0]["data"] == {"v": 8} and live[0]["off"] == r["offset"] + 1, (live, r)
            assert [m for m in ws.drain(0.3) if "pub" in m] == []
    finally:
        redis.kill()
        redis.wait()
