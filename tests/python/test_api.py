"""HTTP API (SPEC §4), with urllib. Publications on HTTP use the long form
`{"channel", "offset", "data"}` (docs/protocol.md)."""

from __future__ import annotations

import re
import urllib.parse

import sb
from sb import WS, api_batch, api_get, api_publish, ch_path, http, uniq


def test_api_publish_single_returns_offset_and_epoch(server):
    ch = uniq("apipub.")
    r = http("POST", server.http_url + "/api/publish", {"channel": ch, "data": {"v": 1}})
    assert r.status == 200
    assert r.headers.get("content-type", "").startswith("application/json")
    first = r.json()
    assert set(first) >= {"offset", "epoch"}
    assert first["offset"] == 1
    assert isinstance(first["epoch"], str) and first["epoch"]
    second = api_publish(server, ch, {"v": 2})
    assert second == {"offset": 2, "epoch": first["epoch"]}


def test_api_publish_null_data_single_and_batch(server):
    """SPEC §1: `data` is any JSON value, null included; single and batch publish agree."""
    ch = uniq("null.")
    r = http("POST", server.http_url + "/api/publish", {"batch": [{"channel": ch, "data": None}]})
    assert r.status == 200 and r.json()["results"][0]["offset"] == 1, (r.status, r.body)
    r = http("POST", server.http_url + "/api/publish", {"channel": ch, "data": None})
    assert r.status == 200, (r.status, r.body)
    assert r.json()["offset"] == 2


def test_api_publish_reaches_websocket_subscriber(server):
    ch = uniq("pt:apiws.")
    with WS(server.ws_url) as ws:
        ws.subscribe([ch])
        api_publish(server, ch, {"v": True, "t": 1, "q": "bad"})
        assert ws.pubs(ch, 1) == [{"ch": ch, "off": 1, "data": {"v": True, "t": 1, "q": "bad"}}]


def test_api_publish_anywhere_including_namespaces_clients_cannot_publish(server):
    for ch in (uniq("bare."), uniq("pt:x."), uniq("room:")):
        assert api_publish(server, ch, 1)["offset"] == 1


def test_api_publish_batch_results_in_order_with_per_item_errors(server):
    a, b = uniq("ba."), uniq("bb.")
    results = api_batch(server, [
        {"channel": a, "data": 1},
        {"channel": b, "data": "x"},
        {"channel": "bad name", "data": 0},
        {"channel": a, "data": {"k": [1, 2]}},
        {"channel": "", "data": 0},
    ])
    assert len(results) == 5
    assert results[0]["offset"] == 1
    assert results[1]["offset"] == 1
    assert results[2]["error"]["code"] == 400
    assert results[3] == {"offset": 2, "epoch": results[0]["epoch"]}
    assert results[4]["error"]["code"] == 400
    r = http("GET", server.http_url + f"/api/channels/{ch_path(a)}/history")
    assert [(p["offset"], p["data"]) for p in r.json()["publications"]] == [(1, 1), (2, {"k": [1, 2]})]


def test_api_publish_rejects_bad_requests_with_400(server):
    url = server.http_url + "/api/publish"
    assert http("POST", url, {"channel": "bad name", "data": 1}).status == 400
    assert http("POST", url, {"channel": "x" * 256, "data": 1}).status == 400
    assert http("POST", url, raw=b"{not json").status == 400
    assert http("POST", url, {"data": 1}).status in (400, 422)
    assert http("POST", url, {"channel": uniq("nodata.")}).status in (400, 422)


def test_api_publish_data_over_64KiB_is_413(server):
    ch = uniq("huge.")
    r = http("POST", server.http_url + "/api/publish", {"channel": ch, "data": "x" * 70000})
    assert r.status == 413, (r.status, r.body[:200])
    assert http("POST", server.http_url + "/api/publish", {"channel": ch, "data": "x" * 60000}).status == 200


def test_api_channels_lists_channels_with_subscribers_offset_epoch(server):
    ch = uniq("list.")
    other = uniq("list.")
    res = api_batch(server, [{"channel": ch, "data": i} for i in range(3)])
    api_publish(server, other, 0)
    with WS(server.ws_url) as w1, WS(server.ws_url) as w2:
        w1.subscribe([ch])
        w2.subscribe([ch])
        r = api_get(server, "/api/channels")
        assert r.status == 200
        body = r.json()
        rows = body["channels"]
        by_name = {row["channel"]: row for row in rows}
        assert by_name[ch]["subscribers"] == 2
        assert by_name[ch]["offset"] == 3
        assert by_name[ch]["epoch"] == res[0]["epoch"]
        assert by_name[other]["offset"] == 1
        assert by_name[other]["subscribers"] == 0


def test_api_channel_detail_has_last_in_long_form(server):
    ch = uniq("detail.")
    for i in range(1, 4):
        res = api_publish(server, ch, {"i": i})
    with WS(server.ws_url) as ws:
        ws.subscribe([ch])
        r = api_get(server, "/api/channels/" + ch_path(ch))
        assert r.status == 200
        d = r.json()
        assert d["channel"] == ch
        assert d["subscribers"] == 1
        assert d["offset"] == 3
        assert d["epoch"] == res["epoch"]
        last = d["last"]
        assert last["channel"] == ch
        assert last["offset"] == 3
        assert last["data"] == {"i": 3}


def test_api_channel_detail_pt_channel_last_value(server):
    ch = uniq("pt:detail.")
    for v in range(5):
        api_publish(server, ch, {"v": v, "t": 1700000000000 + v, "q": "good"})
    d = api_get(server, "/api/channels/" + ch_path(ch)).json()
    assert d["offset"] == 5
    assert d["last"]["data"] == {"v": 4, "t": 1700000000004, "q": "good"}


def test_api_channel_detail_name_with_slash_percent_encoded(server):
    ch = uniq("a/b/")
    api_publish(server, ch, "slashed")
    r = api_get(server, "/api/channels/" + ch_path(ch))
    assert r.status == 200, (r.status, r.body)
    assert r.json()["channel"] == ch
    assert r.json()["last"]["data"] == "slashed"


def test_api_channel_detail_invalid_name_is_400(server):
    r = api_get(server, "/api/channels/" + ch_path("bad name"))
    assert r.status == 400


def test_api_history_since_offset_epoch_and_limit(server):
    ch = uniq("apihist.")
    res = api_batch(server, [{"channel": ch, "data": {"i": i}} for i in range(1, 11)])
    epoch = res[0]["epoch"]
    base = "/api/channels/" + ch_path(ch) + "/history"

    r = api_get(server, base)
    assert r.status == 200
    pubs = r.json()["publications"]
    assert [(p["channel"], p["offset"], p["data"]) for p in pubs] == [(ch, i, {"i": i}) for i in range(1, 11)]

    r = api_get(server, f"{base}?since_offset=4&epoch={epoch}&limit=3")
    assert r.status == 200
    body = r.json()
    assert [(p["offset"], p["data"]) for p in body["publications"]] == [(5, {"i": 5}), (6, {"i": 6}), (7, {"i": 7})]

    r = api_get(server, f"{base}?since_offset=7&epoch={epoch}")
    assert [p["offset"] for p in r.json()["publications"]] == [8, 9, 10]

    r = api_get(server, f"{base}?since_offset=abc")
    assert r.status == 400


def test_api_presence_lists_room_members(server):
    room = uniq("room:")
    with WS(server.ws_url) as a, WS(server.ws_url) as b:
        ida = a.ok("connect", {})["client"]
        idb = b.ok("connect", {})["client"]
        a.subscribe([room])
        b.subscribe([room])
        r = api_get(server, "/api/presence/" + ch_path(room))
        assert r.status == 200
        body = r.json()
        clients = body["clients"] if isinstance(body, dict) else body
        assert sorted(c["client"] for c in clients) == sorted([ida, idb])
        b.close()
        # The leave is processed asynchronously; wait for it through a's push.
        a.recv_where(lambda m: "leave" in m and m["leave"]["client"] == idb)
        body = api_get(server, "/api/presence/" + ch_path(room)).json()
        clients = body["clients"] if isinstance(body, dict) else body
        assert [c["client"] for c in clients] == [ida]


def test_api_info_reports_node_version_connections_subscriptions(server):
    with WS(server.ws_url) as a, WS(server.ws_url) as b:
        node = a.ok("connect", {})["node"]
        a.subscribe([uniq("i."), uniq("i.")])
        b.subscribe([uniq("i.")])
        r = api_get(server, "/api/info")
        assert r.status == 200
        info = r.json()
        flat = {k.lower(): v for k, v in info.items()}
        node_key = next(k for k in ("node", "node_id", "id") if k in flat)
        assert flat[node_key] == node
        assert flat["version"] == "0.1.0"
        assert flat["connections"] == 2
        assert flat["subscriptions"] == 3
        uptime_key = next(k for k in flat if k.startswith("uptime"))
        assert isinstance(flat[uptime_key], (int, float)) and flat[uptime_key] >= 0
        broker = flat["broker"]
        assert "memory" in (broker if isinstance(broker, str) else str(broker)).lower()


def test_api_healthz_and_readyz(server):
    assert api_get(server, "/healthz").status == 200
    assert api_get(server, "/readyz").status == 200


def test_api_unknown_path_is_404(server):
    assert api_get(server, "/api/does-not-exist").status == 404


PROM_LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? ([-+0-9.eE]+|NaN|[+-]Inf)( -?\d+)?$')


def test_api_metrics_is_prometheus_text_with_expected_families(server):
    ch = uniq("met.")
    with WS(server.ws_url) as ws:
        ws.subscribe([ch])
        api_publish(server, ch, 1)
        ws.pubs(ch, 1)
        r = api_get(server, "/metrics")
        assert r.status == 200
        assert r.headers.get("content-type", "").startswith("text/plain")
        text = r.text
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        assert PROM_LINE.match(line), f"not a Prometheus sample line: {line!r}"
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    joined = "\n".join(sorted(names))
    for needle in ("connections", "subscriptions", "channels", "publications", "bytes",
                   "conflated", "slow", "lag"):
        assert needle in joined, f"no metric mentions {needle!r}; names: {sorted(names)}"
    assert any(k in joined for k in ("messages", "deliveries")), sorted(names)
    assert "_bucket" in joined, "the delivery lag histogram has no buckets"
    assert "# TYPE" in text

    # While exactly one WebSocket connection was open, the connections gauge said 1.
    gauges = [l for l in text.splitlines()
              if not l.startswith("#") and re.match(r"^[a-z_:]*connections(\{[^}]*\})? ", l)]
    assert gauges, f"no gauge named *connections; names: {sorted(names)}"
    assert any(float(l.rsplit(" ", 1)[1]) == 1 for l in gauges), gauges


def test_api_reads_of_unknown_channels_are_404_and_create_nothing(server):
    """Probing names (GET last value or history, the history command) never grows the node's
    state: every read of a channel nobody published or subscribed is 404 and the channel list
    is unchanged; a published channel reads as before."""
    def listed():
        names, cursor = [], ""
        for _ in range(1000):
            r = http("GET", server.http_url + "/api/channels?limit=10000&cursor=" + cursor)
            assert r.status == 200, r.body
            body = r.json()
            names += [c["channel"] for c in body["channels"]]
            if body["next"] is None:
                return len(names)
            cursor = urllib.parse.quote(body["next"], safe="")
        raise AssertionError("the listing never ended")

    before = listed()
    probe = uniq("room:probe-")
    for i in range(300):
        r = http("GET", server.http_url + "/api/channels/" + ch_path(f"{probe}{i}"))
        assert r.status == 404, (r.status, r.body)
        assert r.json()["error"]["code"] == 404
        r = http("GET", server.http_url + "/api/channels/" + ch_path(f"{probe}{i}") + "/history")
        assert r.status == 404, (r.status, r.body)
    with WS(server.ws_url) as ws:
        for i in range(50):
            reply = ws.request("history", {"channel": f"{probe}ws{i}"})
            assert reply.get("error", {}).get("code") == 404, reply
    assert listed() == before, "reads created channels"
    known = uniq("room:known-")
    api_publish(server, known, {"v": 1})
    r = http("GET", server.http_url + "/api/channels/" + ch_path(known))
    assert r.status == 200 and r.json()["last"]["data"] == {"v": 1}, r.body
    assert listed() == before + 1
