"""Flow control: conflation for `pt:` subscribers that stop reading, slow-consumer disconnects
(4008) on queueing channels, bounded server memory. No timing assertions: every wait is bounded
by a generous deadline and the checks are on values."""

from __future__ import annotations

import json
import time

import pytest

import sb
from sb import WS, RawWS, api_batch, api_get, ch_path, uniq

RSS_BOUND = 200 * 1024 * 1024


def _raw_subscribe(raw: RawWS, channels, id: int = 1) -> dict:
    raw.send_json({"id": id, "subscribe": {"channels": channels}})
    while True:
        op, payload = raw.recv_message()
        assert op == sb.OP_TEXT, (op, payload[:200])
        for part in payload.decode().split("\n"):
            if part:
                m = json.loads(part)
                if m.get("id") == id:
                    assert "ok" in m, m
                    return m["ok"]


def _metric_values(server, needle: str) -> list:
    text = api_get(server, "/metrics").text
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name = line.split("{")[0].split(" ")[0]
        if needle in name and not name.endswith(("_bucket", "_sum", "_count")):
            out.append((name, float(line.rsplit(" ", 1)[1])))
    return out


@pytest.mark.timeout(90)
def test_flow_pt_subscriber_that_stops_reading_gets_final_values_and_stays(server):
    n_chan, total, batch = 10, 200_000, 4000
    chans = ["pt:" + uniq("conf.") + f".{i}" for i in range(n_chan)]
    pad = "p" * 100

    raw = RawWS("127.0.0.1", server.port, rcvbuf=4096)
    try:
        ok = _raw_subscribe(raw, chans)
        assert all("error" not in ok["channels"][c] for c in chans)

        # The client now stops reading while 200k updates are published.
        rss_peak = server.rss_bytes()
        for start in range(0, total, batch):
            items = [{"channel": chans[j % n_chan], "data": {"v": j, "pad": pad}}
                     for j in range(start, start + batch)]
            results = api_batch(server, items)
            assert len(results) == batch and all("offset" in r for r in results)
            rss_peak = max(rss_peak, server.rss_bytes())
        assert server.alive()

        final = {c: {"v": total - n_chan + i, "pad": pad} for i, c in enumerate(chans)}
        final_off = total // n_chan

        # Now read again: every channel must end on its final value, offsets only increase.
        last_off = {c: 0 for c in chans}
        last_data = {}
        received = 0
        deadline = time.monotonic() + 30
        while any(last_data.get(c) != final[c] for c in chans):
            assert time.monotonic() < deadline, f"final values not reached; last offsets {last_off}"
            op, payload = raw.recv_message(timeout=max(0.1, deadline - time.monotonic()))
            assert op != sb.OP_CLOSE, f"pt subscriber was closed: {payload[:2]!r} {payload[2:]!r}"
            assert op == sb.OP_TEXT
            for part in payload.decode().split("\n"):
                if not part:
                    continue
                m = json.loads(part)
                assert "disconnect" not in m, m
                p = m["pub"]
                assert p["off"] > last_off[p["ch"]], f"offset went backwards on {p['ch']}: {p['off']}"
                last_off[p["ch"]] = p["off"]
                last_data[p["ch"]] = p["data"]
                received += 1
        assert last_off == {c: final_off for c in chans}
        assert received < total, "every update was queued and delivered: nothing was conflated"

        # Still a live, healthy connection.
        raw.send_json({"id": 99, "ping": {"data": "alive"}})
        seen = []
        while not any(m.get("id") == 99 for m in seen):
            op, payload = raw.recv_message()
            assert op == sb.OP_TEXT, (op, payload[:50])
            seen.extend(json.loads(p) for p in payload.decode().split("\n") if p)
        assert {"id": 99, "ok": {"data": "alive"}} in seen
        assert [m for m in seen if "pub" in m] == []

        assert rss_peak < RSS_BOUND, f"server RSS peaked at {rss_peak / 2**20:.0f} MiB"
        conflated = _metric_values(server, "conflated")
        assert conflated and max(v for _, v in conflated) > 0, conflated
    finally:
        raw.close()


def _slow_consumer_scenario(server):
    ch = uniq("slow.")
    payload_pad = "s" * 4000
    # The bystander reads everything (websockets buffers without limit in its own thread) and
    # the main thread checks it after every batch, pacing the publisher to its pace.
    by = WS(server.ws_url, max_queue=None)
    raw = RawWS("127.0.0.1", server.port, rcvbuf=4096)
    try:
        by.subscribe([ch])
        _raw_subscribe(raw, [ch])
        detail = api_get(server, "/api/channels/" + ch_path(ch)).json()
        assert detail["subscribers"] == 2

        published = 0
        by_off = 0
        rss_peak = server.rss_bytes()
        dropped = False
        max_bytes = 160 * 1024 * 1024
        while published * 4000 < max_bytes:
            # 32 × 4 KB per request: each burst stays well under any sane pending bound, so the
            # bystander (which keeps reading) is never at fault.
            items = [{"channel": ch, "data": {"i": published + k + 1, "pad": payload_pad}} for k in range(32)]
            res = api_batch(server, items)
            assert [r["offset"] for r in res] == list(range(published + 1, published + 33))
            published += 32
            rss_peak = max(rss_peak, server.rss_bytes())
            for p in by.pubs(ch, published - by_off, timeout=20):
                by_off += 1
                assert p["off"] == by_off and p["data"]["i"] == by_off, "bystander lost or reordered"
            if api_get(server, "/api/channels/" + ch_path(ch)).json()["subscribers"] == 1:
                dropped = True
                break
        assert dropped, f"slow consumer not disconnected after {published * 4000 / 2**20:.0f} MiB"
        assert rss_peak < RSS_BOUND, f"server RSS peaked at {rss_peak / 2**20:.0f} MiB"

        # The slow client now reads what was sent before the cut: a gap-free prefix of the
        # stream, then the 4008 close.
        msgs = []
        code, reason = raw.read_until_close(msgs.extend, timeout=20)
        assert code == 4008, (code, reason)
        offs = [m["pub"]["off"] for m in msgs if "pub" in m]
        assert offs == list(range(1, len(offs) + 1)), "slow consumer's prefix has gaps or reorders"
        discs = [m["disconnect"] for m in msgs if "disconnect" in m]
        for d in discs:
            assert d["code"] == 4008 and d["reconnect"] is True, d
        assert all("pub" in m or "disconnect" in m for m in msgs)
        if discs:
            assert "disconnect" in msgs[-1], "disconnect must be the last message before close"

        # The bystander still gets every new publication, in order.
        more = api_batch(server, [{"channel": ch, "data": {"i": published + k + 1}} for k in range(10)])
        assert more[0]["offset"] == published + 1
        got = by.pubs(ch, published - by_off + 10, timeout=20)
        tail = [p["off"] for p in got]
        assert tail == list(range(by_off + 1, published + 11))

        slow = _metric_values(server, "slow")
        assert slow and max(v for _, v in slow) >= 1, slow
        return discs
    finally:
        raw.close()
        by.close()


@pytest.mark.timeout(120)
def test_flow_slow_consumer_on_queue_channel_is_disconnected_4008(server):
    _slow_consumer_scenario(server)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", [["--max-pending-bytes", "262144"]], indirect=True)
def test_flow_slow_consumer_with_small_max_pending_bytes(server):
    _slow_consumer_scenario(server)


@pytest.mark.timeout(60)
def test_flow_slow_consumer_can_recover_after_reconnect(server):
    """After a 4008 the client reconnects and recovers from its last offset (history keeps 100:
    complete is true only if it is within the last 100)."""
    ch = uniq("slowrec.")
    raw = RawWS("127.0.0.1", server.port, rcvbuf=4096)
    try:
        epoch = _raw_subscribe(raw, [ch])["channels"][ch]["epoch"]
        pad = "r" * 4000
        published = 0
        while published < 40_000:
            api_batch(server, [{"channel": ch, "data": {"i": published + k + 1, "pad": pad}} for k in range(256)])
            published += 256
            if api_get(server, "/api/channels/" + ch_path(ch)).json()["subscribers"] == 0:
                break
        msgs = []
        code, _ = raw.read_until_close(msgs.extend, timeout=20)
        assert code == 4008
        offs = [m["pub"]["off"] for m in msgs if "pub" in m]
        last = offs[-1] if offs else 0
    finally:
        raw.close()
    with WS(server.ws_url) as ws:
        r = ws.subscribe([ch], initial=True, recover={ch: {"epoch": epoch, "offset": last}})["channels"][ch]
        assert r["offset"] == published
        assert r["last"]["off"] == published
        if published - last <= 100:
            assert r["complete"] is True
            assert [p["off"] for p in r["recovered"]] == list(range(last + 1, published + 1))
        else:
            assert r["complete"] is False
