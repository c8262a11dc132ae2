"""Gaps in the Python client package `switchboard_client` against the real binary: after a
recovery that cannot replay (a node restart on the memory broker starts a new epoch; a point
channel keeps no history, so updates missed while a node was down are gone), the gap is
reported and then the channel's latest value is delivered. Point channels (`pt:`) go on without
raising by default, the gap carried by the publication after it (`after_gap`); other channels
raise `Gap` first; `gaps=` picks per subscription; `recover=False` takes the latest value with
no gap at all.

Every wait is bounded; nothing asserts how long something took."""

from __future__ import annotations

import asyncio

import pytest

import sb
from sb import api_publish, uniq
from switchboard_client import Client, Gap, Position

WAIT = 20.0  # bound of every wait for a publication


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 90))


async def next_item(sub, timeout: float = WAIT):
    """What `async for` would give next (or raise)."""
    return await asyncio.wait_for(sub.__anext__(), timeout)


def test_client_gap_after_a_memory_node_restart_point_channels_go_on_others_raise(switchboard_bin, tmp_path):
    port = sb.free_port()
    pt, pt_latest, room = uniq("pt:gap-"), uniq("pt:gap-latest-"), uniq("room:gap-")
    quiet = uniq("room:gap-quiet-")  # never published before the restart: nothing was missed
    started: list[sb.Server] = []
    try:
        node = sb.start_on_port(switchboard_bin, port, [], str(tmp_path / "a.log"))
        started.append(node)

        async def main():
            nonlocal node
            async with Client(node.ws_url, backoff_max=0.5) as c:
                points = await c.subscribe(pt, initial=True)
                latest = await c.subscribe(pt_latest, initial=True, recover=False)
                msgs = await c.subscribe(room)
                unheard = await c.subscribe(quiet)
                for ch, data in ((pt, {"v": 1}), (pt_latest, {"v": 10}), (room, "before")):
                    api_publish(node, ch, data)
                before = [await next_item(s) for s in (points, latest, msgs)]
                assert [(p.offset, p.data, p.after_gap) for p in before] == \
                    [(1, {"v": 1}, None), (1, {"v": 10}, None), (1, "before", None)]

                node.terminate()  # graceful (4000, reconnect); the memory broker's epochs go with it
                node.proc.wait(timeout=30)
                node = sb.start_on_port(switchboard_bin, port, [], str(tmp_path / "a2.log"))
                started.append(node)
                # The client reconnects before or after these; either way it sees the same.
                for ch, data in ((pt, {"v": 2}), (pt_latest, {"v": 20}), (room, "after")):
                    api_publish(node, ch, data)

                # The point channel: iteration goes on, the gap rides on the publication.
                p = await next_item(points)
                assert (p.offset, p.data) == (1, {"v": 2}) and p.epoch != before[0].epoch
                assert p.after_gap is not None and p.after_gap.channel == pt and p.after_gap.epoch_changed
                assert p.after_gap.since == Position(before[0].epoch, 1)

                # recover=False: the latest value, no gap.
                q = await next_item(latest)
                assert (q.offset, q.data, q.after_gap) == (1, {"v": 20}, None)

                # A channel with history: the Gap is raised first, then what the new epoch holds.
                with pytest.raises(Gap) as gap:
                    await next_item(msgs)
                assert gap.value.channel == room and gap.value.epoch_changed
                assert gap.value.since == Position(before[2].epoch, 1)
                m = await next_item(msgs)
                assert (m.offset, m.data) == (1, "after") and m.after_gap is gap.value

                # Never published before the restart: no gap, the new epoch's first publication.
                api_publish(node, quiet, "first")
                u = await next_item(unheard)
                assert (u.offset, u.data, u.after_gap) == (1, "first", None)

                assert (points.pending, latest.pending, msgs.pending, unheard.pending) == (0, 0, 0, 0)
                assert c.stats["gaps"] == 2 and c.stats["reconnects"] == 1, c.stats

        run(main())
    finally:
        for s in started:
            s.kill()


def test_client_gap_when_a_point_channel_was_published_while_its_node_was_down(switchboard_bin, start_server,
                                                                              redis_url, tmp_path):
    """The same epoch (a shared Redis keeps it), but a point channel keeps no history: the
    updates published through another node while this one was down cannot be replayed. Each
    gap mode reports the hole, then the latest value (offset 9), never the stale one."""
    port = sb.free_port()
    args = ["--broker", redis_url]
    marked, raised, yielded = uniq("pt:gap-mark-"), uniq("pt:gap-raise-"), uniq("pt:gap-yield-")
    started: list[sb.Server] = []
    try:
        node = sb.start_on_port(switchboard_bin, port, args, str(tmp_path / "a.log"))
        started.append(node)
        other = start_server(*args)

        async def main():
            nonlocal node
            async with Client(node.ws_url, backoff_max=0.5) as c:
                subs = [await c.subscribe(marked, initial=True),
                        await c.subscribe(raised, initial=True, gaps="raise"),
                        await c.subscribe(yielded, initial=True, gaps="yield")]
                for i in range(1, 7):
                    for ch in (marked, raised, yielded):
                        api_publish(other, ch, {"v": i})
                for s in subs:
                    # Point channels conflate for a slow reader: read on until the sixth.
                    while (await s.get(WAIT)).offset < 6:
                        pass
                epochs = [s.position().epoch for s in subs]  # each channel has its own

                node.kill()  # SIGKILL: no close frame; the client retries the same URL
                for i in range(7, 10):
                    for ch in (marked, raised, yielded):
                        api_publish(other, ch, {"v": i * 100})
                node = sb.start_on_port(switchboard_bin, port, args, str(tmp_path / "a2.log"))
                started.append(node)

                def hole(i: int) -> tuple:
                    return (Position(epochs[i], 6), Position(epochs[i], 9), False)

                p = await next_item(subs[0])
                assert (p.offset, p.data) == (9, {"v": 900})
                assert p.after_gap is not None and \
                    (p.after_gap.since, p.after_gap.until, p.after_gap.epoch_changed) == hole(0)

                with pytest.raises(Gap) as gap:
                    await next_item(subs[1])
                assert (gap.value.since, gap.value.until, gap.value.epoch_changed) == hole(1)
                assert gap.value.channel == raised
                p = await next_item(subs[1])
                assert (p.offset, p.data, p.after_gap) == (9, {"v": 900}, gap.value)

                g = await subs[2].get(WAIT)
                assert isinstance(g, Gap) and g.channel == yielded
                assert (g.since, g.until, g.epoch_changed) == hole(2)
                p = await subs[2].get(WAIT)
                assert (p.offset, p.data, p.after_gap) == (9, {"v": 900}, g)

                assert [s.pending for s in subs] == [0, 0, 0] and c.stats["gaps"] == 3, c.stats

        run(main())
    finally:
        for s in started:
            s.kill()


def test_client_gap_modes_are_checked(server):
    async def main():
        async with Client(server.ws_url) as c:
            with pytest.raises(ValueError):
                await c.subscribe("pt:x", gaps="ignore")  # type: ignore[arg-type]

    run(main())
