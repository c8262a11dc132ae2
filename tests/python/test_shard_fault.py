"""A Redis shard that fails affects only its own channels (docs/protocol.md, "Subscriptions the
server ends"): a WebSocket client that follows channels on two real shards keeps its
connection and every publication of the live shard's channels, exactly once and in order; each
channel of the dead shard ends alone with an `unsubscribed` push after what was delivered
before the hole; subscribing it again is refused 503 while the shard is down and, once it is
back, recovers with `complete: false` (the restarted shard lost its history) and streams again.

The client is the third-party `websockets` library (tests/python/sb.py), JSON and MessagePack.
"""

from __future__ import annotations

import pytest

import sb
from redis_kit import two_shards  # noqa: F401 (the fixture)
from sb import uniq


def _publish(srv, channels: list, n: int) -> dict:
    """Publishes `{"n": n}` to each channel; returns {channel: offset} of those committed."""
    results = sb.api_batch(srv, [{"channel": c, "data": {"n": n}} for c in channels])
    return {c: r["offset"] for c, r in zip(channels, results) if "offset" in r}


@pytest.mark.parametrize("subprotocol", [sb.JSON_PROTOCOL, sb.MSGPACK_PROTOCOL])
def test_dead_shard_ends_only_its_channels_and_they_recover_on_the_same_connection(start_server, two_shards,
                                                                                   subprotocol):
    shards = two_shards
    srv = start_server("--broker", ",".join(r.url for r in shards))
    channels = [f"room:{uniq()}" for _ in range(12)]
    first = _publish(srv, channels, 1)
    assert len(first) == len(channels), first
    with sb.WS(srv.ws_url, subprotocol) as ws:
        reply = ws.subscribe(channels)["channels"]
        pos = {c: (reply[c]["epoch"], reply[c]["offset"]) for c in channels}
        before = _publish(srv, channels, 2)
        for c in channels:
            assert [p["off"] for p in ws.pubs(c, 1)] == [before[c]]

        shards[1].kill()
        after = _publish(srv, channels, 3)
        live = sorted(after)
        dead = sorted(set(channels) - set(after))
        assert live and dead, "the channels hash to both shards"
        # Each dead channel ends alone, with a notice that says to subscribe it again.
        ended = set()
        while len(ended) < len(dead):
            m = ws.recv_where(lambda m: "unsubscribed" in m, timeout=20)
            u = m["unsubscribed"]
            assert u["ch"] in dead, u
            assert (u["code"], u["resubscribe"]) == (4008, True), u
            ended.add(u["ch"])
        # The live shard's channels keep streaming on the same connection.
        for n in range(4, 7):
            offs = _publish(srv, live, n)
            assert sorted(offs) == live, offs
        for c in live:
            got = [p["off"] for p in ws.pubs(c, 4, timeout=10)]
            assert got == [after[c], after[c] + 1, after[c] + 2, after[c] + 3], (c, got)
        # Subscribing a dead channel again (as asked) is refused for now, not a conflict.
        recover = {c: {"epoch": pos[c][0], "offset": before[c]} for c in dead}
        r = ws.subscribe(dead, recover=recover)["channels"]
        assert all(r[c]["error"]["code"] == 503 for c in dead), r

        shards[1].start()

        back: dict = {}
        asking = list(dead)

        def subscribed_again() -> bool:
            """Subscribes what is still refused; channels that came back stay subscribed."""
            r = ws.subscribe(asking, recover={c: recover[c] for c in asking})["channels"]
            for c in list(asking):
                if "error" in r[c]:
                    assert r[c]["error"]["code"] == 503, r[c]
                else:
                    back[c] = r[c]
                    asking.remove(c)
            return not asking

        sb.wait_until("the restarted shard's channels to subscribe again", subscribed_again, 30, every=0.5)
        for c in dead:
            s = back[c]
            assert s["complete"] is False, (c, s)
            assert s["epoch"] != pos[c][0], "the restarted shard starts a new epoch"
        # Every channel streams again, the live ones without a gap.
        final = _publish(srv, channels, 7)
        assert sorted(final) == sorted(channels), final
        for c in dead:
            assert [p["off"] for p in ws.pubs(c, 1, timeout=10)] == [final[c]]
        for c in live:
            assert [p["off"] for p in ws.pubs(c, 1, timeout=10)] == [final[c]]
            assert final[c] == after[c] + 4
        assert ws.closed is None
        assert not [m for m in ws.drain(0.3) if "disconnect" in m]
