"""Server-side filters (docs/protocol.md, "Filters"): publications carry `tags`, a subscribe
carries `filter`, and a subscriber is sent exactly the publications its filter matches, in
order — live, and recovered after a reconnect — while a subscriber without filter gets them all.
Tags come with every publish form (HTTP single and batch, WebSocket `publish`) and with the
publication everywhere it appears. A bad filter or bad tags get 400 naming the field.

Python `websockets` (through sb.WS) is the subscriber; a real node on the memory broker and on a
real redis-server.
"""

from __future__ import annotations

import pytest

import sb
from sb import WS, api_batch, api_get, ch_path, http, uniq

# Alarm-like events of two sites: the subscriber wants the north site's, severity 3 or more,
# except maintenance ones.
FILTER = {"op": "and", "nodes": [
    {"key": "site", "cmp": "eq", "val": "north"},
    {"key": "severity", "cmp": "gte", "val": "3"},
    {"op": "not", "nodes": [{"key": "kind", "cmp": "in", "vals": ["maintenance", "test"]}]},
]}


def event(i: int) -> dict:
    """The i-th event: its data and tags (sites, severities and kinds cycling differently)."""
    tags = {"site": ["north", "south"][i % 2], "severity": str(i % 5)}
    if i % 7 == 0:
        tags["kind"] = "maintenance"
    return {"data": {"n": i}, "tags": tags}


def matches(i: int) -> bool:
    t = event(i)["tags"]
    return t["site"] == "north" and float(t["severity"]) >= 3 and t.get("kind") not in ("maintenance", "test")


def publish_http(srv: sb.Server, ch: str, items: list[int]) -> None:
    """Publishes in order, by HTTP single publishes and batches of two, in turn."""
    at = 0
    while at < len(items):
        if at % 3 == 0:
            r = http("POST", srv.http_url + "/api/publish", {"channel": ch, **event(items[at])})
            assert r.status == 200, r.body
            at += 1
        else:
            for r in api_batch(srv, [{"channel": ch, **event(i)} for i in items[at:at + 2]]):
                assert "offset" in r, r
            at += 2


def numbers(pubs: list[dict]) -> list[int]:
    return [p["data"]["n"] for p in pubs]


@pytest.mark.parametrize("broker", ["memory", "redis"])
def test_a_filtered_subscriber_gets_exactly_the_matching_publications_live_and_recovered(
        start_server, redis_url, broker):
    srv = start_server(*(["--broker", redis_url] if broker == "redis" else []))
    ch = f"room:{uniq('ev')}"
    with WS(srv.ws_url) as filtered, WS(srv.ws_url) as everything:
        ok = filtered.ok("subscribe", {"channels": [ch], "filter": FILTER})
        start = ok["channels"][ch]
        everything.subscribe([ch])
        # One at a time, in order: HTTP single and batch alternate; every fifth by WebSocket.
        sent = list(range(1, 41))
        for i in sent:
            if i % 5 == 0:
                everything.ok("publish", {"channel": ch, **event(i)})
            else:
                publish_http(srv, ch, [i])
        all_pubs = everything.pubs(ch, len(sent), timeout=20)
        assert numbers(all_pubs) == sent, "a subscriber without filter gets every one"
        assert all(p["tags"] == event(p["data"]["n"])["tags"] for p in all_pubs), "tags come with them"
        wanted = [i for i in sent if matches(i)]
        got = filtered.pubs(ch, len(wanted), timeout=20)
        assert numbers(got) == wanted, "exactly the matching ones, in order"
        assert all(matches(p["data"]["n"]) for p in got)
        # Nothing else comes: a ping's answer comes after anything queued before it.
        filtered.ping()
        assert not [m for m in filtered.drain(0.3) if "pub" in m], "a non-matching publication was sent"
        last_seen = {"epoch": start["epoch"], "offset": got[-1]["off"]}

    # Reconnect with recovery: what was missed, filtered the same way.
    publish_http(srv, ch, list(range(41, 81)))
    with WS(srv.ws_url) as again:
        ok = again.ok("subscribe", {"channels": [ch], "filter": FILTER, "recover": {ch: last_seen}})
        r = ok["channels"][ch]
        assert r["complete"] is True, r
        assert numbers(r["recovered"]) == [i for i in range(41, 81) if matches(i)], r["recovered"]
        assert all("tags" in p for p in r["recovered"])
        # And live again.
        publish_http(srv, ch, list(range(81, 101)))
        wanted = [i for i in range(81, 101) if matches(i)]
        assert numbers(again.pubs(ch, len(wanted), timeout=20)) == wanted

    # History (HTTP) is the channel's, unfiltered, with tags.
    h = api_get(srv, f"/api/channels/{ch_path(ch)}/history?limit=10").json()["publications"]
    assert [(p["data"]["n"], p["tags"]) for p in h] == [(i, event(i)["tags"]) for i in range(91, 101)]
    # `initial` gives the last value only if it matches.
    with WS(srv.ws_url) as late:
        last = late.ok("subscribe", {"channels": [ch], "filter": FILTER, "initial": True})["channels"][ch]["last"]
        assert last is None or matches(last["data"]["n"]), last
        assert (last is not None) == matches(100)


def test_bad_filters_and_tags_are_refused_naming_the_field(server):
    ch = f"room:{uniq('ev')}"
    with WS(server.ws_url) as ws:
        cases = [
            ({"key": "a", "cmp": "like", "val": "1"}, "filter.cmp"),
            ({"op": "and", "nodes": [{"key": "a", "cmp": "gt", "val": "high"}]}, "filter.nodes[0].val"),
            ({"op": "not", "nodes": []}, "filter.nodes"),
            ({"key": "a"}, "filter"),
        ]
        for spec, field in cases:
            r = ws.request("subscribe", {"channels": [ch], "filter": spec})
            assert r["error"]["code"] == 400 and r["error"]["message"].startswith(field + ":"), (spec, r)
        r = ws.request("subscribe", {"channels": [ch], "filter": {"key": "a", "cmp": "ex"}, "max_rate_hz": 1})
        assert r["error"]["code"] == 400 and "filter" in r["error"]["message"], r
        r = ws.request("publish", {"channel": ch, "data": 1, "tags": {"a": 1}})
        assert r["error"]["code"] == 400 and "tags" in r["error"]["message"], r
        r = ws.request("publish", {"channel": ch, "data": 1, "tags": {f"k{i}": "v" for i in range(33)}})
        assert r["error"]["code"] == 400 and r["error"]["message"].startswith("tags:"), r
        # The connection and its other work are unharmed.
        ws.subscribe([ch])
        ws.ok("publish", {"channel": ch, "data": 2, "tags": {"a": "b"}})
        [p] = ws.pubs(ch, 1)
        assert (p["data"], p["tags"]) == (2, {"a": "b"})
    r = http("POST", server.http_url + "/api/publish", {"channel": ch, "data": 1, "tags": ["x"]})
    assert r.status == 400 and b"tags" in r.body, r.body
    r = http("POST", server.http_url + "/api/publish", {"batch": [{"channel": ch, "data": 1, "tags": {"": "x"}}]})
    assert r.status == 200 and r.json()["results"][0]["error"]["code"] == 400, r.body
