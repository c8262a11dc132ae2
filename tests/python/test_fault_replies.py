"""Replies are bounded (SPEC §10, docs/protocol.md "Reply bound"): no reply exceeds the
connection's pending-bytes bound (`limits.max_pending_bytes`) by more than one frame, whatever
one command asks for — a subscribe with an hour of trend over 1,000 point channels, a
recovery of megabytes, a `history` of megabytes. What does not fit is refused per channel
(413 naming the data) or cut and said so (`complete: false`, `more: true`), never lost
silently; a bystander keeps receiving every publication with exact offsets meanwhile.

Driven with Python `websockets` and urllib; the node's memory is read from /proc/PID/status."""

from __future__ import annotations

import json
import threading
import time

import pytest

import sb
from sb import WS, api_batch, http, uniq

MAX_PENDING = 1024 * 1024  # the default `limits.max_pending_bytes`
FRAME = 64 * 1024  # the largest publication (`limits.max_publication_bytes`)


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


def reset_peak(pid: int) -> bool:
    """Resets the process's peak RSS (VmHWM) to its current RSS; False where not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def request_sized(ws: WS, command: str, body, timeout: float = 30.0):
    """Sends a command and returns (its reply, the reply's size in bytes on the wire). Other
    messages stay queued on `ws` for later reads."""
    cid = ws.next_id()
    ws.send({"id": cid, command: body})
    deadline = time.monotonic() + timeout
    while True:
        frame = ws.conn.recv(timeout=max(0.01, deadline - time.monotonic()))
        assert isinstance(frame, str)
        for part in frame.split("\n"):
            if not part:
                continue
            msg = json.loads(part)
            if msg.get("id") == cid:
                return msg, len(part.encode())
            ws.pending.append(msg)


def fill_trends(server, channels: list, seconds: int) -> None:
    """One value per second over the last `seconds` for every channel, each point with its own
    `t`, through `POST /api/publish` batches."""
    now_ms = int(time.time() * 1000)
    items = []

    def flush():
        raw = ("{\"batch\":[" + ",".join(items) + "]}").encode()
        r = http("POST", server.http_url + "/api/publish", raw=raw, timeout=60)
        assert r.status == 200, r.body[:300]
        items.clear()

    for k in range(seconds):
        t = now_ms - (seconds - 1 - k) * 1000
        for i, ch in enumerate(channels):
            v = round(20 + (i % 17) * 0.37 + (k % 60) * 0.011, 3)
            items.append(f'{{"channel":"{ch}","data":{{"v":{v},"q":"good","t":{t}}}}}')
        if len(items) >= 40_000:
            flush()
    if items:
        flush()


class Publisher(threading.Thread):
    """Publishes `n` numbered values to the bystander's channel, one every few ms."""

    def __init__(self, server, channel: str, n: int):
        super().__init__(daemon=True)
        self.server, self.channel, self.n = server, channel, n
        self.offsets: list = []

    def run(self):
        for i in range(self.n):
            self.offsets.append(sb.api_publish(self.server, self.channel, {"seq": i})["offset"])
            time.sleep(0.005)


def bystander_got_every_one(by: WS, channel: str, first_offset: int, pub: Publisher) -> None:
    pub.join(timeout=60)
    assert not pub.is_alive()
    got = by.pubs(channel, pub.n, timeout=20)
    offs = [p["off"] for p in got]
    assert offs == list(range(first_offset + 1, first_offset + 1 + pub.n)) == pub.offsets
    assert [p["data"]["seq"] for p in got] == list(range(pub.n))


@pytest.mark.timeout(180)
def test_fault_replies_trend_subscribe_over_1000_channels_is_bounded(server):
    prefix = uniq("pt:fr-")
    channels = [f"{prefix}-{i:04d}" for i in range(1000)]
    fill_trends(server, channels, 3600)
    byc = uniq("bystander.")
    with WS(server.ws_url) as by, WS(server.ws_url) as ws:
        first = by.subscribe([byc])["channels"][byc]["offset"]
        pub = Publisher(server, byc, 150)
        before_kb = status_kb(server.pid, "VmRSS")
        peak_known = reset_peak(server.pid)
        pub.start()
        reply, size = request_sized(ws, "subscribe", {"channels": channels, "trend": {"window_s": 3600}})
        after_kb = status_kb(server.pid, "VmHWM" if peak_known else "VmRSS")
        results = reply["ok"]["channels"]
        assert size <= MAX_PENDING + FRAME, f"a reply of {size} bytes"
        taken = [ch for ch in channels if "trend" in results[ch]]
        refused = [ch for ch in channels if "error" in results[ch]]
        assert len(taken) + len(refused) == len(channels)
        assert 1 <= len(taken) < 20, (len(taken), size)
        # The channels that fit come first; every one after them is refused, naming the trend.
        assert channels[: len(taken)] == taken
        for ch in refused:
            e = results[ch]["error"]
            assert e["code"] == 413 and "trend" in e["message"], e
        for ch in taken:
            assert sum(b["n"] for b in results[ch]["trend"]["buckets"]) >= 3500, ch
        growth_mb = (after_kb - before_kb) / 1024
        print(f"\n1,000 x 1 h trend subscribe: reply {size} bytes, {len(taken)} channels taken, "
              f"node RSS {'peak ' if peak_known else ''}+{growth_mb:.1f} MiB")
        assert growth_mb < 100, f"RSS grew {growth_mb:.0f} MiB for one command"
        bystander_got_every_one(by, byc, first, pub)
        # Later subscribes take the refused ones, each reply within the bound, until all are
        # subscribed with their whole trend.
        left, rounds, largest = refused, 0, size
        while left and rounds < 800:
            rounds += 1
            reply, size = request_sized(ws, "subscribe", {"channels": left, "trend": {"window_s": 3600}})
            largest = max(largest, size)
            results = reply["ok"]["channels"]
            got = [ch for ch in left if "trend" in results[ch]]
            assert got, results[left[0]]
            for ch in got:
                assert sum(b["n"] for b in results[ch]["trend"]["buckets"]) >= 3500, ch
            left = [ch for ch in left if "error" in results[ch]]
            assert all(results[ch]["error"]["code"] == 413 for ch in left)
        assert left == [] and largest <= MAX_PENDING + FRAME, (len(left), largest)
        # Subscribed indeed: a publication on the last one arrives live.
        last = channels[-1]
        sb.api_publish(server, last, {"v": 1.5, "q": "good"})
        assert ws.pubs(last, 1)[0]["data"]["v"] == 1.5
    b = sb.Bystander(server)
    b.check()
    b.close()


@pytest.mark.timeout(90)
def test_fault_replies_recover_and_history_are_bounded_and_say_so(server):
    small, big = uniq("room:frs-"), uniq("room:frb-")
    blob = "r" * 20_000
    api_batch(server, [{"channel": small, "data": {"i": i}} for i in range(1, 4)])
    for start in range(1, 101, 20):
        api_batch(server, [{"channel": big, "data": {"i": i, "blob": blob}} for i in range(start, start + 20)])
    byc = uniq("bystander.")
    with WS(server.ws_url) as by, WS(server.ws_url) as ws:
        first = by.subscribe([byc])["channels"][byc]["offset"]
        epoch_s = ws.ok("history", {"channel": small, "limit": 1})["epoch"]
        epoch_b = ws.ok("history", {"channel": big, "limit": 1})["epoch"]
        pub = Publisher(server, byc, 100)
        pub.start()
        # Two recoveries in one subscribe: the small one fits, the 2 MB one is refused (413
        # naming recovered) and taken by the next command.
        recover = {small: {"epoch": epoch_s, "offset": 0}, big: {"epoch": epoch_b, "offset": 0}}
        reply, size = request_sized(ws, "subscribe", {"channels": [small, big], "recover": recover})
        assert size <= MAX_PENDING + FRAME
        r = reply["ok"]["channels"]
        assert [p["off"] for p in r[small]["recovered"]] == [1, 2, 3] and r[small]["complete"] is True
        assert r[big]["error"]["code"] == 413 and "recovered" in r[big]["error"]["message"], r[big]
        # Alone, a recovery larger than a reply is cut: the newest publications, up to the
        # offset, and `complete: false` — never a cut recovery that looks complete.
        reply, size = request_sized(ws, "subscribe", {"channels": [big], "recover": {big: recover[big]}})
        assert size <= MAX_PENDING + FRAME, size
        rb = reply["ok"]["channels"][big]
        offs = [p["off"] for p in rb["recovered"]]
        assert rb["complete"] is False and rb["offset"] == 100
        assert 1 <= len(offs) < 100 and offs == list(range(101 - len(offs), 101)), offs
        # What was cut is read with `history`, page by page (`more`), each page bounded.
        pages, got, since = 0, [], {"epoch": epoch_b, "offset": 0}
        while pages < 50:
            pages += 1
            reply, size = request_sized(ws, "history", {"channel": big, "since": since, "limit": 100})
            assert size <= MAX_PENDING + FRAME, size
            h = reply["ok"]
            assert h["complete"] is True
            got += [p["off"] for p in h["publications"]]
            if not h["more"]:
                break
            since = {"epoch": h["epoch"], "offset": h["publications"][-1]["off"]}
        assert got == list(range(1, 101)) and pages > 1, (pages, got[:5])
        assert [p["data"]["i"] for p in h["publications"]][-1] == 100
        # Without `since`: the newest `limit`, from their first on, with `more` when cut.
        reply, size = request_sized(ws, "history", {"channel": big, "limit": 100})
        h = reply["ok"]
        assert size <= MAX_PENDING + FRAME and h["more"] is True and h["publications"][0]["off"] == 1
        # Live publications continue right after the recovered ones.
        sb.api_publish(server, big, {"i": 101})
        assert ws.pubs(big, 1)[0]["off"] == 101
        bystander_got_every_one(by, byc, first, pub)
