"""Bounded state (docs/operations.md, "Bounded state"): the channel ceiling
(`limits.max_channels`) refuses new channels with 429 while existing ones and a bystander keep
working, and the paged channel listing (`GET /api/channels?prefix=&limit=&cursor=`) walks
25,000 channels without a duplicate or a gap while channels are created. Driven with the
third-party `httpx` client and Python `websockets`."""

from __future__ import annotations

import httpx

import sb
from sb import WS, Bystander, uniq


def test_channel_ceiling_refuses_new_channels_but_keeps_existing_ones(start_server):
    server = start_server(env={"SWITCHBOARD_MAX_CHANNELS": "12"})
    bystander = Bystander(server)  # one channel
    bystander.check()
    held = uniq("room:held-")
    c = httpx.Client(base_url=server.http_url, timeout=10, trust_env=False)
    # Publishing new channels until the node holds its maximum.
    accepted, refused = [], None
    for i in range(20):
        ch = f"{held}-{i}"
        r = c.post("/api/publish", json={"channel": ch, "data": {"v": i}})
        if r.status_code == 200:
            accepted.append(ch)
            continue
        refused = r
        break
    assert len(accepted) == 11, f"{len(accepted)} accepted beside the bystander's channel of a ceiling of 12"
    assert refused is not None and refused.status_code == 429, refused
    err = refused.json()["error"]
    assert err["code"] == 429 and "maximum of 12 channels" in err["message"], err
    # A batch: existing channels go through, new ones are refused item by item.
    res = c.post("/api/publish", json={"batch": [
        {"channel": accepted[0], "data": 1}, {"channel": uniq("room:new-"), "data": 2},
    ]}).json()["results"]
    assert res[0]["offset"] == 2 and res[1]["error"]["code"] == 429, res
    # Subscribing a new channel is refused per channel; an existing one is served.
    with WS(server.ws_url) as ws:
        new = uniq("room:sub-")
        reply = ws.subscribe([accepted[1], new], initial=True)["channels"]
        assert reply[accepted[1]]["last"]["data"] == {"v": 1}
        assert reply[new]["error"]["code"] == 429, reply
        # The history of an existing channel and the bystander's stream are intact.
        h = ws.ok("history", {"channel": accepted[0], "limit": 10})
        assert [p["data"] for p in h["publications"]] == [{"v": 0}, 1]
    bystander.check()
    assert sb.metric(server, "switchboard_channels_refused_total", required=True) == 3
    assert sb.metric(server, "switchboard_broker_channels", required=True) == 12
    bystander.close()
    c.close()


def page_all(c: httpx.Client, prefix: str, limit: int, between=lambda: None) -> tuple[list, int]:
    names, pages, cursor = [], 0, None
    for _ in range(10_000):
        params = {"prefix": prefix, "limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        r = c.get("/api/channels", params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["channels"]) <= limit
        names += [row["channel"] for row in body["channels"]]
        pages += 1
        between()
        cursor = body["next"]
        if cursor is None:
            return names, pages
    raise AssertionError("the listing never ended")


def test_paging_25000_channels_while_channels_are_created(server):
    c = httpx.Client(base_url=server.http_url, timeout=30, trust_env=False)
    prefix = uniq("room:pg") + "-"
    want = [f"{prefix}{i:05d}" for i in range(25_000)]
    for k in range(0, len(want), 1000):
        r = c.post("/api/publish", json={"batch": [{"channel": ch, "data": 1} for ch in want[k:k + 1000]]})
        assert r.status_code == 200 and all("offset" in x for x in r.json()["results"])
    created = []

    def create_more():
        batch = [f"{prefix}new-{len(created) + j}" for j in range(50)]
        c.post("/api/publish", json={"batch": [{"channel": ch, "data": 1} for ch in batch]}).raise_for_status()
        created.extend(batch)

    names, pages = page_all(c, prefix, 1000, create_more)
    assert len(names) == len(set(names)), "a channel listed twice"
    missing = set(want) - set(names)
    assert not missing, f"{len(missing)} channels missing, e.g. {sorted(missing)[:3]}"
    assert all(n.startswith(prefix) for n in names)
    assert pages >= 25, pages
    # The memory broker lists in name order.
    assert names == sorted(names)
    # The default page is 1,000 channels and the most one page holds is 10,000.
    body = c.get("/api/channels", params={"prefix": prefix}).json()
    assert len(body["channels"]) == 1000 and body["next"] is not None
    assert len(c.get("/api/channels", params={"prefix": prefix, "limit": 10_000}).json()["channels"]) == 10_000
    c.close()


def test_listing_bad_queries_get_400_naming_the_field(server):
    c = httpx.Client(base_url=server.http_url, timeout=10, trust_env=False)
    for params, field in [({"limit": 0}, "limit"), ({"limit": 10_001}, "limit"), ({"limit": "x"}, "limit"),
                          ({"prefix": "room:a b"}, "prefix"), ({"prefix": "x" * 300}, "prefix")]:
        r = c.get("/api/channels", params=params)
        assert r.status_code == 400, (params, r.text)
        assert field in r.text, (params, r.text)
    c.close()
