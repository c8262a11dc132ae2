"""The Python client package (clients/python) on what a node sends only in some setups, without
the binary: historical publications (a plant source's back-fill, `"hist": true`) from the
scripted node of test_client_package.py, and a trend read's `until_ms` and `tiers` from a
scripted HTTP API."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import urllib.parse

import pytest

from switchboard_client import Client, Publication, Tier
from switchboard_client.http import parse_trend
from test_client_package import WAIT, ScriptedNode, run, take


def point(ch: str, off: int, v: float, t: int, hist: bool = False) -> dict:
    p = {"ch": ch, "off": off, "data": {"v": v, "t": t, "q": "good"}}
    if hist:
        p["hist"] = True
    return p


def shown(pubs: list[Publication]) -> list[tuple[int, bool]]:
    return [(p.offset, p.historical) for p in pubs]


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_client_historical_publications_keep_their_flag_and_move_the_position(fmt):
    """A historical publication comes in offset order with `historical`, moves the position
    like any other (the resubscription recovers after it, no gap), and so do historical ones
    in a recovery and a history read. The client keeps no current value of its own besides the
    position: a program showing the value skips `historical` ones."""

    async def main():
        async with ScriptedNode(fmt) as node:
            c = Client(node.url, format=fmt, connect_timeout=WAIT, backoff_max=0.5)
            conn = (await asyncio.gather(node.accept(), c.connect()))[0]
            async with c:
                t = asyncio.create_task(c.subscribe("pt:a", initial=True))
                s = await conn.cmd()
                last = point("pt:a", 5, 10.0, 5_000)
                await conn.send({"id": s["id"], "ok": {"channels": {"pt:a": {
                    "epoch": "e1", "offset": 5, "last": last, "recovered": [], "complete": True}}}},
                    {"pub": point("pt:a", 6, 11.0, 6_000)},
                    {"pub": point("pt:a", 7, 3.0, 1_000, hist=True)},
                    {"pub": point("pt:a", 8, 12.0, 8_000)})
                sub = await t
                got = await take(sub, 4)
                assert shown(got) == [(5, False), (6, False), (7, True), (8, False)]
                assert got[2].data == {"v": 3.0, "t": 1_000, "q": "good"}, "with its own time"
                assert all(p.after_gap is None and p.epoch == "e1" for p in got)
                assert sub.position() == ("e1", 8)
                await conn.send({"pub": point("pt:a", 9, 4.0, 2_000, hist=True)})
                assert shown([await sub.get(WAIT)]) == [(9, True)]
                assert sub.position() == ("e1", 9), "a historical publication moves the position"
                assert c.stats["publications"] == 4

                # The connection drops: the channel resumes after the historical one; a
                # historical one recovered keeps its flag; nothing is a gap.
                await conn.ws.close(1011, "gone")
                conn = await node.accept()
                s = await conn.cmd()
                assert s["subscribe"]["recover"] == {"pt:a": {"epoch": "e1", "offset": 9}}
                await conn.send({"id": s["id"], "ok": {"channels": {"pt:a": {
                    "epoch": "e1", "offset": 10, "last": None,
                    "recovered": [point("pt:a", 10, 5.0, 3_000, hist=True)], "complete": True}}}},
                    {"pub": point("pt:a", 11, 13.0, 11_000)})
                got = await take(sub, 2)
                assert shown(got) == [(10, True), (11, False)]
                assert all(p.after_gap is None for p in got)
                assert c.stats["gaps"] == 0

                # A history read carries the flag too.
                h = asyncio.create_task(c.history("room:h", limit=2))
                cmd = await conn.cmd()
                await conn.send({"id": cmd["id"], "ok": {"publications": [
                    {"ch": "room:h", "off": 1, "data": "a"}, {"ch": "room:h", "off": 2, "data": "b", "hist": True}],
                    "epoch": "e1", "offset": 2}})
                assert shown(list(await h)) == [(1, False), (2, True)]

    run(main())


class TrendApi(http.server.BaseHTTPRequestHandler):
    """`GET /api/channels/{ch}/trend`: one reply, and the queries it was asked."""

    asked: list[dict[str, list[str]]] = []

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        url = urllib.parse.urlsplit(self.path)
        assert url.path == "/api/channels/pt%3Aa/trend", url.path
        TrendApi.asked.append(urllib.parse.parse_qs(url.query))
        body = json.dumps({"step_s": 10, "buckets": [{"t": 1_000_000, "min": 1, "max": 2, "last": 2, "n": 3}],
                           "tiers": [{"step_s": 1, "window_s": 3600}, {"step_s": 10, "window_s": 86400}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_client_trend_reads_until_ms_and_names_the_tiers():
    api = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TrendApi)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    TrendApi.asked = []
    try:
        async def main():
            # A trend is an HTTP read: no connection needed.
            c = Client(f"ws://127.0.0.1:{api.server_address[1]}/ws")
            past = await c.trend("pt:a", 600, step_s=10, until_ms=1_000_500)
            now = await c.trend("pt:a", 60)
            return past, now

        past, now = run(main())
    finally:
        api.shutdown()
        api.server_close()
    assert TrendApi.asked == [{"window_s": ["600"], "step_s": ["10"], "until_ms": ["1000500"]}, {"window_s": ["60"]}]
    assert past.step_s == 10 and [(b.t, b.last) for b in past] == [(1_000_000, 2)]
    assert past.tiers == [Tier(step_s=1, window_s=3600), Tier(step_s=10, window_s=86400)]
    assert now.tiers == past.tiers
    # A reply without tiers (a node before them) reads as none.
    assert parse_trend({"step_s": 1, "buckets": []}).tiers == []
