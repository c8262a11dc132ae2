"""Fossil deltas (docs/protocol.md, "Deltas"): a subscriber with `"delta": "fossil"` gets the
first publication after each (re)subscribe whole — its JSON text as a string — and then each
one as a Fossil delta against the previous one's text when that is smaller; applied in order,
the deltas give every publication's exact text. Subscribers without deltas are not affected,
and channels that could drop a publication (conflating ones) refuse deltas.

Python `websockets` (through sb.WS) is the subscriber; the deltas are applied with the Python
client's Fossil decoder (clients/python), and their texts compared with what was published.
"""

from __future__ import annotations

import json

import pytest

import sb
from sb import WS, http, uniq
from switchboard_client.fossil import apply

FIELDS = 24


def document(i: int) -> dict:
    """A ~1 KiB point document of which one field changes per publication."""
    doc = {f"sensor_{f:02d}": {"v": round(20 + f * 0.5, 2), "unit": "degC", "q": "good"} for f in range(FIELDS)}
    doc[f"sensor_{i % FIELDS:02d}"]["v"] = 100 + i
    doc["seq"] = i
    return doc


def publish(srv: sb.Server, ch: str, i: int) -> str:
    """Publishes document i; returns its text as sent (and so as stored)."""
    text = json.dumps({"channel": ch, "data": document(i)})
    r = http("POST", srv.http_url + "/api/publish", raw=text.encode())
    assert r.status == 200, r.body
    return json.dumps(document(i))


@pytest.mark.parametrize("subprotocol", [None, "switchboard.v1.msgpack"])
def test_a_delta_subscriber_rebuilds_every_publication_exactly_from_small_deltas(server, subprotocol):
    ch = f"log:{uniq('doc')}"
    with WS(server.ws_url, subprotocol=subprotocol) as ws, WS(server.ws_url) as plain:
        epoch = ws.ok("subscribe", {"channels": [ch], "delta": "fossil"})["channels"][ch]["epoch"]
        plain.subscribe([ch])
        texts = [publish(server, ch, i) for i in range(1, 31)]
        pushes = ws.pubs(ch, len(texts), timeout=20)
        text, sizes = b"", {True: [], False: []}
        for i, p in enumerate(pushes):
            data = p["data"].encode() if isinstance(p["data"], str) else bytes(p["data"])
            assert p["off"] == pushes[0]["off"] + i
            text = apply(text, data, 1 << 20) if p["delta"] else data
            assert text.decode() == texts[i], f"publication {i + 1} rebuilt differently"
            sizes[p["delta"]].append(len(data))
        assert not pushes[0]["delta"], "the first one after subscribing is whole"
        assert len(sizes[True]) == len(texts) - 1, "every later one is a delta"
        assert max(sizes[True]) * 5 < min(sizes[False]), sizes
        # A subscriber without deltas gets the data as JSON, as always.
        assert [p["data"] for p in plain.pubs(ch, len(texts))] == [json.loads(t) for t in texts]
        last_seen = {"epoch": epoch, "offset": pushes[-1]["off"]}

    # Again, recovering: what was missed comes whole in `recovered`, and the first live one after
    # the reply is whole again.
    missed = [publish(server, ch, i) for i in range(31, 36)]
    with WS(server.ws_url, subprotocol=subprotocol) as ws:
        r = ws.ok("subscribe", {"channels": [ch], "delta": "fossil", "recover": {ch: last_seen}})["channels"][ch]
        assert [p["data"] for p in r["recovered"]] == [json.loads(t) for t in missed]
        texts = [publish(server, ch, i) for i in range(36, 39)]
        pushes = ws.pubs(ch, 3, timeout=20)
        assert [p["delta"] for p in pushes] == [False, True, True]
        text = b""
        for p, want in zip(pushes, texts):
            data = p["data"].encode() if isinstance(p["data"], str) else bytes(p["data"])
            text = apply(text, data, 1 << 20) if p["delta"] else data
            assert text.decode() == want


def test_deltas_are_refused_where_a_publication_could_be_skipped(server):
    with WS(server.ws_url) as ws:
        r = ws.ok("subscribe", {"channels": ["pt:conflated", "log:fine"], "delta": "fossil"})["channels"]
        assert r["pt:conflated"]["error"]["code"] == 400 and "delta" in r["pt:conflated"]["error"]["message"], r
        assert "epoch" in r["log:fine"], r
        for extra in [{"filter": {"key": "a", "cmp": "ex"}}, {"max_rate_hz": 5}]:
            e = ws.request("subscribe", {"channels": ["log:other"], "delta": "fossil", **extra})["error"]
            assert e["code"] == 400 and e["message"].startswith("delta:"), e
        e = ws.request("subscribe", {"channels": ["log:other"], "delta": "vcdiff"})["error"]
        assert e["code"] == 400 and e["message"].startswith("delta:"), e
