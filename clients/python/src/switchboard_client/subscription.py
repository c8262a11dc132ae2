"""Subscriptions: one `Subscription` per `Client.subscribe` call (one or several channels), and
one `Entry` per channel holding its position and what a subscribe result does to it.

Delivery contract, per channel: publications arrive in offset order, each at most once —
recovered ones first (after a reconnect, an `unsubscribed` push or a 503 retry), then live ones.
When the server says it could not recover everything (`complete: false`, or a new epoch), the
hole is a `Gap`, followed by what the server still had and then the channel's latest value; the
first publication after it carries it (`after_gap`), so a caller never misses a hole silently.
Each channel's gap mode says whether the iterator also raises it (`raise`), yields it
(`yield`) or leaves it on that publication only (`mark`, the default of point channels).

A subscription with a `filter` is sent only the publications that match, live and recovered,
so holes in its offsets are not gaps: only the server's `complete: false` (or an old epoch's
publications) is one. A `delta` subscription's pushes carry the publication's JSON text or a
Fossil delta of the previous one; the entry keeps the channel's last text and rebuilds them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from typing import Any, Awaitable, Callable, Iterable, Literal, Union, cast

from .errors import ReplyError, SwitchboardError
from .fossil import DeltaError, apply
from .types import Gap, Position, Publication

log = logging.getLogger("switchboard_client")

# Entry states. PENDING: to be sent; SENDING: awaiting its reply; WAITING: refused for now
# (503: its broker shard is failing over), asked again after a delay; SUBSCRIBED; ERROR: refused
# for good (the entry has left the client).
PENDING, SENDING, WAITING, SUBSCRIBED, ERROR = "pending", "sending", "waiting", "subscribed", "error"

Item = Union[Publication, Gap, SwitchboardError]

# How a subscription reports a gap of a channel, besides `after_gap` on the publication after it:
# "raise" from the iterator (iterate again to go on), "yield" as an item, or "mark" (only there).
GapMode = Literal["raise", "yield", "mark"]
GAP_MODES = ("raise", "yield", "mark")


class SubscriptionEndedError(SwitchboardError):
    """`Subscription.get` after the subscription ended (unsubscribed, or the client closed)."""

    def __init__(self) -> None:
        super().__init__(0, "subscription ended")


class Entry:
    """One channel of a subscription as the client tracks it."""

    __slots__ = ("channel", "sub", "status", "epoch", "offset", "inflight", "recover", "initial",
                 "sampling", "sampling_key", "settled", "alone", "lost_again", "gap_mode", "gap",
                 "filtered", "text")

    def __init__(self, channel: str, sub: Subscription, *, recover: bool, initial: bool,
                 start: Position | None, sampling: dict[str, Any], gap_mode: GapMode = "raise") -> None:
        self.channel = channel
        self.sub = sub
        self.status = PENDING
        # Position of the latest publication delivered (or covered by a subscribe reply).
        self.epoch: str | None = start.epoch if start else None
        self.offset: int = start.offset if start else 0
        self.inflight = 0
        self.recover = recover
        self.initial = initial
        self.sampling = sampling
        self.sampling_key = json.dumps(sampling, sort_keys=True) if sampling else ""
        # The first outcome (subscribed, refused, or waiting on a 503) was reported.
        self.settled = False
        # Refused with 413 because others filled the reply: asked again in a command of its own.
        self.alone = False
        # An `unsubscribed` push arrived while a subscribe was in flight: subscribe once more.
        self.lost_again = False
        self.gap_mode: GapMode = gap_mode
        # The gap the next publication delivered carries as `after_gap`.
        self.gap: Gap | None = None
        # Only publications matching a filter come: holes in the offsets are not gaps.
        self.filtered = "filter" in sampling
        # A delta subscription's last rebuilt text (None: none yet, or a push failed).
        self.text: bytes | None = None

    @property
    def position(self) -> Position | None:
        return Position(self.epoch, self.offset) if self.epoch is not None else None

    def recover_from(self) -> dict[str, Any] | None:
        """The `recover` position to send, if this channel resumes from one."""
        if self.recover and self.epoch is not None:
            return {"epoch": self.epoch, "offset": self.offset}
        return None

    def accept(self, r: dict[str, Any]) -> bool:
        """Applies a subscribe result `{"epoch", "offset", "last", "recovered", "complete"}`;
        whether it found a gap."""
        epoch: str = r["epoch"]
        offset: int = r["offset"]
        last = r.get("last")
        recovered = r.get("recovered") or ()
        self.status = SUBSCRIBED
        # A new subscription's first push is whole.
        self.text = None
        gap = False
        if self.epoch is None:
            # First subscribe without a position: the latest value if asked, then live ones.
            self.epoch, self.offset = epoch, offset
            if self.initial and last:
                self.deliver(last["off"], last.get("data"), last.get("hist") is True, last.get("tags"))
        elif not self.recover:
            # Resubscribed without recovery: the latest value stands for what was missed.
            newer = last and self.initial and (epoch != self.epoch or last["off"] > self.offset)
            self.epoch, self.offset = epoch, offset
            if newer and last:
                self.deliver(last["off"], last.get("data"), last.get("hist") is True, last.get("tags"))
        else:
            # Resumed from a position (docs/protocol.md, "Gaps"): what the reply holds after
            # it is delivered once, in offset order. A hole among those, offsets up to the
            # channel's that nothing delivered, or an old epoch left after publications of it
            # make a gap, reported before the first publication after it.
            same = epoch == self.epoch
            # Ahead of the channel in its own epoch: the broker lost its newest publications,
            # and the channel's next offsets are new ones, not repeats.
            behind = same and r.get("complete") is False and offset < self.offset
            start = at = (offset if behind else self.offset) if same else 0
            hole = behind
            fresh = []
            for p in (*recovered, *((last,) if last else ())):
                if p["off"] <= at:
                    continue
                hole = hole or p["off"] != at + 1
                at = p["off"]
                fresh.append(p)
            if self.filtered:
                # Holes are publications that did not match: only the server knows of a loss.
                hole = same and r.get("complete") is False
            else:
                hole = hole or offset > at
            hole = hole or (not same and self.offset > 0)
            if hole:
                gap = True
                self._gap(Gap(self.channel, Position(self.epoch, self.offset), Position(epoch, offset), not same))
            self.epoch, self.offset = epoch, start
            self._replay(fresh)
            self.offset = max(at, offset)
        return gap

    def _replay(self, pubs: Iterable[dict[str, Any]]) -> None:
        for p in pubs:
            off = p["off"]
            if off > self.offset:
                self.offset = off
                self.deliver(off, p.get("data"), p.get("hist") is True, p.get("tags"))

    def rebuild(self, push: dict[str, Any], max_bytes: int) -> Any:
        """The data of a delta subscription's push (it has `delta`): its text whole, or the
        previous push's text with the delta applied, parsed as JSON. Raises `DeltaError` (and
        forgets the text) when that cannot be: no text to apply a delta to, a declared size
        above `max_bytes`, a bad checksum, not JSON."""
        raw = push.get("data")
        body = raw.encode() if isinstance(raw, str) else raw
        try:
            if not isinstance(body, bytes):
                raise DeltaError("the data of a delta publication is neither text nor binary")
            if push["delta"]:
                if self.text is None:
                    raise DeltaError("a delta with no previous publication of the channel to apply it to")
                text = apply(self.text, body, max_bytes)
            elif len(body) > max_bytes:
                raise DeltaError(f"the publication declares {len(body)} bytes, more than the {max_bytes} allowed")
            else:
                text = body
            data = json.loads(text)
        except DeltaError:
            self.text = None
            raise
        except ValueError as e:  # JSON, or UTF-8, that does not decode
            self.text = None
            raise DeltaError(f"the publication's text is not JSON: {e}") from e
        self.text = text
        return data

    def _gap(self, gap: Gap) -> None:
        """Reports a hole: queued for the iterator (raise, yield) and kept for the next
        publication; two holes before that publication make one gap."""
        self.gap = gap if self.gap is None else self.gap.joined(gap)
        if self.gap_mode == "mark":
            log.info("%s", gap)
        else:
            self.sub._push(gap)

    def deliver(self, offset: int, data: Any, historical: bool = False, tags: dict[str, str] | None = None) -> None:
        """Queues the publication at `offset` (the caller checked it is the next one).
        `historical` marks a back-filled value: part of the channel's stream, so the position
        covers it like any other, but never the channel's current value. `tags`: the
        publisher's, if any."""
        gap = self.gap
        if gap is not None:
            self.gap = None
        self.sub._push(Publication(self.channel, offset, data, self.epoch or "", gap, historical, tags))


class Subscription:
    """Publications of one or several channels, in offset order per channel.

    Iterate with `async for pub in sub`, or take one at a time with `await sub.get(timeout)`.
    After a `Gap` the first publication of its channel carries it (`pub.after_gap`); per the
    channel's gap mode (`gap_modes`) it is also raised between the publications it separates
    (iterate again to go on), yielded as an item, or neither. A channel the server refuses
    later (e.g. after a reconnect) raises its `ReplyError`; a fatal connection error (a refused
    token, 4003) raises its `DisconnectError`. Iteration ends after `unsubscribe()` or when the
    client closes.

    Publications wait here until taken: a consumer slower than its channels grows this queue
    (`sub.pending`); point channels conflate on the server, other channels do not.
    """

    def __init__(self, channels: list[str], gap_modes: dict[str, GapMode],
                 unsubscribe: Callable[[Subscription], Awaitable[None]]) -> None:
        self.channels: tuple[str, ...] = tuple(channels)
        # How each channel's gaps reach the iterator (see `GapMode`).
        self.gap_modes = gap_modes
        # The client's own unsubscribe: what ends this subscription on the connection.
        self._unsubscribe = unsubscribe
        # Channels refused for good: by the first subscribe, or later (after a reconnect).
        self.errors: dict[str, ReplyError] = {}
        self._entries: dict[str, Entry] = {}
        self._items: deque[Item] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._end: BaseException | None = None
        self._ready: asyncio.Future[None] | None = None
        self._unsettled = 0

    # ---------------------------------------------------------------------------------------
    # What callers use

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Publication:
        items = self._items
        if items and isinstance(items[0], Publication):
            return cast(Publication, items.popleft())
        item = await self._take(None)
        if item is None:
            raise StopAsyncIteration
        return item  # type: ignore[return-value]  # a Gap only in gap mode "yield" (documented)

    async def get(self, timeout: float | None = None) -> Publication | Gap:
        """The next publication (or `Gap`, in gap mode "yield"); `asyncio.TimeoutError` after
        `timeout` seconds, `SubscriptionEndedError` once the subscription ended."""
        item = await self._take(timeout)
        if item is None:
            raise SubscriptionEndedError()
        return item

    @property
    def pending(self) -> int:
        """Publications (and gaps, errors) received and not yet taken."""
        return len(self._items)

    @property
    def active(self) -> bool:
        return self._end is None

    def position(self, channel: str | None = None) -> Position | None:
        """The position of the latest publication of `channel` (the only channel by default)
        this subscription delivered or was told of; None before the first reply."""
        if channel is None:
            if len(self.channels) != 1:
                raise ValueError("name the channel of a subscription to several channels")
            channel = self.channels[0]
        e = self._entries.get(channel)
        return e.position if e is not None else None

    @property
    def waiting(self) -> list[str]:
        """Channels refused for now with 503 (their broker shard is failing over) and asked
        again after a jittered delay."""
        return [ch for ch, e in self._entries.items() if e.status == WAITING]

    async def unsubscribe(self) -> None:
        """Ends the subscription; iteration stops after what was already received."""
        if self._end is not None:
            return
        self._finish(StopAsyncIteration())
        await self._unsubscribe(self)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.unsubscribe()

    # ---------------------------------------------------------------------------------------
    # What the client uses

    def _push(self, item: Item) -> None:
        self._items.append(item)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _finish(self, why: BaseException) -> None:
        """No more items after those queued; then `why` (StopAsyncIteration: a normal end)."""
        if self._end is None:
            self._end = why
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    def _settle(self, e: Entry) -> None:
        """Counts the first outcome of a channel; `ready` resolves when every channel has one."""
        if e.settled:
            return
        e.settled = True
        self._unsettled -= 1
        if self._unsettled <= 0 and self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    def _refused(self, e: Entry, err: ReplyError) -> None:
        """A channel refused for good: reported by `subscribe` if it was its first outcome,
        else raised by the iterator in its place in the stream."""
        self.errors[e.channel] = err
        self._entries.pop(e.channel, None)
        if e.settled:
            self._push(err)
            if not self._entries:
                self._finish(StopAsyncIteration())
        else:
            self._settle(e)

    def _lost(self, e: Entry, err: SwitchboardError) -> None:
        """A channel the server ended and will not take back."""
        self._entries.pop(e.channel, None)
        self._push(err)
        if not self._entries:
            self._finish(StopAsyncIteration())

    async def _take(self, timeout: float | None) -> Publication | Gap | None:
        """The next publication (a Gap in gap mode "yield"), None at the end; raises what the
        stream holds in its place otherwise (a Gap, a channel's error, a fatal error)."""
        items = self._items
        while not items:
            end = self._end
            if end is not None:
                if isinstance(end, StopAsyncIteration):
                    return None
                raise end
            w = self._waiter = asyncio.get_running_loop().create_future()
            try:
                if timeout is None:
                    await w
                else:
                    await asyncio.wait_for(w, timeout)
            finally:
                self._waiter = None
        item = items.popleft()
        if isinstance(item, Publication):
            return item
        if isinstance(item, Gap) and self.gap_modes.get(item.channel) == "yield":
            return item
        raise item
