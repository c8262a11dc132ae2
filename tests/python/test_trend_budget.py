"""Trend reads over HTTP are bounded like a subscribe's (docs/protocol.md, "Reply bound"): a
`GET /api/channels/{ch}/trend` whose body would pass the budget of one reply (half of
`limits.max_pending_bytes`, 512 KiB) is answered 413 naming the bound — the same answer a
subscribe with that `trend` gets — and clients that ask for a week of 1 s buckets and never
read hold no more of the node's memory than that bound. Raw sockets and httpx as clients."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from sb import WS, UnreadGets, api_batch, ch_path, uniq

BUDGET = 512 * 1024  # half of the default limits.max_pending_bytes
POINTS = 100_000
WEEK = 604_800

CONFIG = """
[namespaces.pt]
trend_tiers = [{step_s = 1, window_s = 604800}]
"""


@pytest.fixture
def filled(start_server, tmp_path):
    """A node whose channel holds POINTS one-second buckets, all in the past week."""
    config = tmp_path / "week.toml"
    config.write_text(CONFIG)
    srv = start_server("--config", str(config))
    ch = uniq("pt:week-")
    now = int(time.time() * 1000)
    base = now - now % 1000 - (POINTS + 600) * 1000
    for start in range(0, POINTS, 10_000):
        items = [{"channel": ch, "data": {"v": i * 0.5, "t": base + 1000 * i}} for i in range(start, start + 10_000)]
        assert all("offset" in r for r in api_batch(srv, items))
    return srv, ch, base


def test_trend_http_past_the_reply_budget_is_413_naming_the_bound_like_subscribe(filled):
    srv, ch, base = filled
    c = httpx.Client(base_url=srv.http_url, timeout=30, trust_env=False)
    r = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": WEEK, "step_s": 1})
    assert r.status_code == 413, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["code"] == 413 and f"{BUDGET} bytes" in err["message"] and "step_s" in err["message"], err
    # A coarser step over the same week fits, within the bound.
    ok = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": WEEK, "step_s": 60})
    assert ok.status_code == 200 and len(ok.content) <= BUDGET, (ok.status_code, len(ok.content))
    assert sum(b["n"] for b in ok.json()["buckets"]) == POINTS
    # The subscribe's answer to the same read: one bound, one message.
    with WS(srv.ws_url) as ws:
        got = ws.ok("subscribe", {"channels": [ch], "trend": {"window_s": WEEK, "step_s": 1}}, timeout=30)
        assert got["channels"][ch]["error"] == err, got["channels"][ch]


def test_trend_http_clients_that_never_read_hold_at_most_the_bound(filled):
    srv, ch, base = filled
    clients = 20
    c = httpx.Client(base_url=srv.http_url, timeout=30, trust_env=False)
    # What a whole reply of every bucket would take, from the size of a slice of them.
    part = c.get(f"/api/channels/{ch_path(ch)}/trend",
                 params={"window_s": 1000, "step_s": 1, "until_ms": base + 50_000_000}).content
    per_bucket = len(part) / len(json.loads(part)["buckets"])
    whole = clients * int(per_bucket * POINTS)
    assert whole > 60 * 1024 * 1024, whole
    path = f"/api/channels/{ch_path(ch)}/trend?window_s={WEEK}&step_s=1"
    # One read first, so the node's allocator has seen the size of such a read once.
    assert c.get(path).status_code == 413
    before = srv.rss_bytes()
    with UnreadGets(srv, path, clients) as unread:
        grown = srv.rss_bytes() - before
        assert grown < whole / 8, (grown, whole)
        head = unread.head()
        assert head.startswith(b"HTTP/1.1 413"), head[:100]
