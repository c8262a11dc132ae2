"""Trend tiers (docs/operations.md, "Trend capacity"): a namespace with
`trend_tiers = [{step_s, window_s}, ...]` keeps a trend per tier, and a read — over HTTP or the
`trend` option of subscribe — uses the finest tier that reaches back over its window. On the
memory broker and on Redis; httpx and Python `websockets` as the clients."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from sb import WS, api_batch, ch_path, server_env, uniq

TIERS = """
[namespaces.pt]
conflate = true
trend_tiers = [{step_s = 1, window_s = 60}, {step_s = 10, window_s = 600}]
"""


@pytest.mark.parametrize("broker", ["memory", "redis"])
def test_trend_tiers_answer_each_window_from_the_finest_tier_that_reaches_it(start_server, redis_url, tmp_path,
                                                                             broker):
    config = tmp_path / "tiers.toml"
    config.write_text(TIERS)
    srv = start_server("--config", str(config), "--broker", redis_url if broker == "redis" else "memory")
    ch = uniq("pt:tier-")
    now = int(time.time() * 1000)
    start = now - now % 10_000 - 300_000
    # A value every 5 s over the last five minutes, each at its own time.
    api_batch(srv, [{"channel": ch, "data": {"v": i, "t": start + 5000 * i}} for i in range(60)])
    c = httpx.Client(base_url=srv.http_url, timeout=10, trust_env=False)
    fine = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": 60}).json()
    assert fine["step_s"] == 1, fine
    assert fine["buckets"] and all(b["t"] >= now - 61_000 and b["n"] == 1 for b in fine["buckets"]), fine
    wide = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": 300}).json()
    assert wide["step_s"] == 10, wide
    b = wide["buckets"]
    # The coarse tier holds the older values the fine one never kept: 10 s buckets of two.
    assert sum(x["n"] for x in b) >= 58 and all(x["t"] % 10_000 == 0 for x in b), b
    assert b[0]["t"] <= start + 10_000 and b[0]["max"] - b[0]["min"] == 1.0, b[0]
    # Every reply names the tiers, so a client knows its windows and where finer buckets are.
    assert fine["tiers"] == wide["tiers"] == [{"step_s": 1, "window_s": 60}, {"step_s": 10, "window_s": 600}]
    # A past range (a zoom): the finest tier that reaches back to its start, only its buckets.
    until = now - 15_000
    near = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": 40, "until_ms": until}).json()
    assert near["step_s"] == 1, near
    assert near["buckets"] and all(until - 41_000 <= x["t"] <= until for x in near["buckets"]), near
    assert all(x["n"] == 1 for x in near["buckets"]), near
    old = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": 60, "until_ms": now - 120_000}).json()
    assert old["step_s"] == 10 and old["buckets"], old
    assert all(now - 190_000 <= x["t"] <= now - 120_000 for x in old["buckets"]), old
    assert len(old["buckets"]) in (6, 7) and all(x["n"] == 2 for x in old["buckets"][1:-1]), old
    # A window ending after now ends now; one ending before the epoch plus the window is refused.
    later = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": 60, "until_ms": now + 3_600_000})
    assert later.status_code == 200 and later.json()["step_s"] == 1, later.text
    r = c.get(f"/api/channels/{ch_path(ch)}/trend", params={"window_s": 60, "until_ms": 5})
    assert r.status_code == 400 and "until_ms" in r.text, r.text
    with WS(srv.ws_url) as ws:
        r = ws.ok("subscribe", {"channels": [ch], "trend": {"window_s": 300}})["channels"][ch]
        # The same buckets as the HTTP read, but for the oldest when the window's start passed
        # a bucket boundary between the two reads.
        got = r["trend"]["buckets"]
        assert r["trend"]["step_s"] == 10 and got and got == [x for x in b if x["t"] >= got[0]["t"]], r["trend"]
        assert len(got) >= len(b) - 1, r["trend"]
        assert r["trend"]["tiers"] == wide["tiers"], r["trend"]
        # Beyond every tier's reach: the longest tier answers.
        far = ws.ok("subscribe", {"channels": [uniq("pt:none-")], "trend": {"window_s": 3600}})["channels"]
        assert list(far.values())[0]["trend"]["step_s"] == 10


@pytest.mark.parametrize("tiers, says", [
    ("[{step_s = 10, window_s = 600}, {step_s = 1, window_s = 60}]", "larger step_s"),
    ("[{step_s = 0, window_s = 60}]", "step_s 0"),
    ("[{step_s = 60, window_s = 30}]", "step_s 60 and window_s 30"),
    ("[{step_s = 1, window_s = 60}, {step_s = 2, window_s = 120}, {step_s = 3, window_s = 180}, "
     "{step_s = 4, window_s = 240}, {step_s = 5, window_s = 300}]", "at most 4"),
    ("[{step_s = 1, window_s = 60, every = 2}]", "every"),
])
def test_trend_tiers_that_make_no_sense_exit_2_naming_the_key(switchboard_bin, tmp_path, tiers, says):
    config = tmp_path / "bad.toml"
    config.write_text(f"[namespaces.pt]\ntrend_tiers = {tiers}\n")
    r = subprocess.run([switchboard_bin, "serve", "--config", str(config), "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=30, env=server_env())
    assert r.returncode == 2, r
    assert "trend_tiers" in r.stderr and says in r.stderr, r.stderr
