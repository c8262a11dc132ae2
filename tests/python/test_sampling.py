"""Per-subscription sampling (docs/protocol.md, "Sampling"): `max_rate_hz` caps deliveries per
channel for one subscriber while the latest value always arrives, `deadband` drops numeric
values that moved less than the band, and bad options get a 400 naming the field. Driven with
Python `websockets` and urllib; a subscriber without options beside them gets everything."""

from __future__ import annotations

import time

from sb import WS, api_batch, api_publish, http, uniq
from sse_client import SSE
from test_poll import Poller


def pubs_of(msgs: list, ch: str) -> list:
    return [m["pub"] for m in msgs if "pub" in m and m["pub"]["ch"] == ch]


def publish_at(server, channels: list, hz: float, seconds: float) -> int:
    """Publishes every channel `hz` times a second for `seconds`; returns the last value."""
    n = int(hz * seconds)
    start = time.monotonic()
    for i in range(1, n + 1):
        api_batch(server, [{"channel": ch, "data": {"v": i, "q": "good"}} for ch in channels])
        delay = start + i / hz - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    return n


def test_sampling_max_rate_caps_deliveries_and_the_final_value_arrives(server):
    a, b = uniq("pt:fast-"), uniq("pt:fast-")
    with WS(server.ws_url) as slow, WS(server.ws_url) as full:
        slow.ok("subscribe", {"channels": [a, b], "max_rate_hz": 2})
        full.ok("subscribe", {"channels": [a]})
        started = time.monotonic()
        last = publish_at(server, [a, b], 50, 2.0)
        took = time.monotonic() - started
        time.sleep(0.7)  # longer than 1/F: the held final value must be out
        got = slow.drain(0.5)
        everything = full.drain(0.5)
    for ch in (a, b):
        values = [p["data"]["v"] for p in pubs_of(got, ch)]
        # At most F per second plus the first one, never out of order, ending on the final value.
        assert 2 <= len(values) <= int(2 * took) + 2, (ch, values, took)
        assert values == sorted(values) and values[-1] == last, (ch, values)
    # The subscriber without options was not sampled (conflation may merge a few under load).
    full_values = [p["data"]["v"] for p in pubs_of(everything, a)]
    assert full_values[-1] == last and len(full_values) > 10 * len(pubs_of(got, a)) // 2, len(full_values)


def test_sampling_deadband_drops_small_moves_but_not_the_first_value_or_quality_changes(server):
    ch, pct = uniq("pt:band-"), uniq("pt:pct-")
    with WS(server.ws_url) as ws:
        ws.ok("subscribe", {"channels": [ch], "deadband": {"abs": 0.5}})
        ws.ok("subscribe", {"channels": [pct], "deadband": {"pct": 10}})
        for v, q in [(10.0, "good"), (10.2, "good"), (10.4, "good"), (10.6, "good"), (10.7, "bad"),
                     (10.8, "bad"), (11.2, "bad"), (9.0, "good")]:
            api_publish(server, ch, {"v": v, "q": q})
        for v in [100, 105, 109, 111, 120, 130]:
            api_publish(server, pct, {"v": v})
        got = ws.drain(0.5)
    assert [(p["data"]["v"], p["data"]["q"]) for p in pubs_of(got, ch)] == [
        (10.0, "good"),  # the first value
        (10.6, "good"),  # moved 0.6 from 10.0
        (10.7, "bad"),  # quality changed
        (11.2, "bad"),  # moved 0.5 from 10.7
        (9.0, "good"),
    ]
    # 10 % of the last value sent: 100 → 111 (11) → 130 (19 ≥ 11.1); 120 moved only 9.
    assert [p["data"]["v"] for p in pubs_of(got, pct)] == [100, 111, 130]


def test_sampling_on_sse_and_long_polling(server):
    ch = uniq("pt:sse-")
    api_publish(server, ch, {"v": 0})
    sse = SSE(server.http_url + f"/sse?channels={ch}&max_rate_hz=2")
    try:
        assert sse.status == 200
        sse.next_event("subscribed")
        started = time.monotonic()
        last = publish_at(server, [ch], 40, 1.5)
        took = time.monotonic() - started
        values = []
        deadline = time.monotonic() + 3
        while not values or values[-1] != last:
            e = sse.next(max(0.01, deadline - time.monotonic()))
            assert e is not None
            if e.event == "message":
                values.append(e.json()["pub"]["data"]["v"])
        assert len(values) <= int(2 * took) + 2, (values, took)
    finally:
        sse.close()
    # Long-polling takes the WebSocket command bodies.
    p = Poller(server)
    try:
        r = p.request("subscribe", {"channels": [ch], "deadband": {"abs": 1000}})
        assert "epoch" in r["ok"]["channels"][ch], r
        api_publish(server, ch, {"v": last + 1})  # inside the band: not sent
        api_publish(server, ch, {"v": last + 5000})
        got = [m["data"]["v"] for m in p.pubs(1)]
        assert got == [last + 5000], got
    finally:
        p.close()


def test_sampling_bad_options_get_400_naming_the_field(server):
    text = uniq("room:text-")
    api_publish(server, text, {"v": "open"})
    with WS(server.ws_url) as ws:
        for body, field in [({"max_rate_hz": -1}, "max_rate_hz"), ({"max_rate_hz": 0}, "max_rate_hz"),
                            ({"deadband": {"abs": -0.1}}, "deadband.abs"), ({"deadband": {"pct": 200}}, "deadband.pct"),
                            ({"deadband": {"abs": 1, "pct": 1}}, "deadband"), ({"deadband": {"rel": 1}}, "rel"),
                            ({"sample_every": 3}, "sample_every")]:
            r = ws.request("subscribe", {"channels": [uniq("pt:x-")], **body})
            assert r.get("error", {}).get("code") == 400, (body, r)
            assert field in r["error"]["message"], (body, r)
        # A band on a channel whose values are not numeric is refused for that channel, and the
        # channel is not left half-subscribed: a plain subscribe of it works afterwards.
        r = ws.ok("subscribe", {"channels": [text], "deadband": {"abs": 1}})["channels"][text]
        assert r["error"]["code"] == 400 and "deadband" in r["error"]["message"], r
        assert "epoch" in ws.ok("subscribe", {"channels": [text]})["channels"][text]
    r = http("GET", server.http_url + f"/sse?channels={text}&max_rate_hz=-3")
    assert r.status == 400 and b"max_rate_hz" in r.body, r.body
