"""The public value types: what subscriptions yield and commands return, and `Gap`, the hole
recovery could not fill (a value, raised or yielded by a subscription or carried by the
publication after it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class Position(NamedTuple):
    """A place in a channel's stream: offsets count publications within one epoch. Keep the
    position of the last publication processed and pass it as `recover=` to resume there."""

    epoch: str
    offset: int


class Gap(Exception):
    """Publications of `channel` between `since` and `until` could not be recovered: the
    server's history no longer reached back to `since`, or the channel's epoch changed
    (`epoch_changed`: a node of the memory broker restarted, or Redis lost its data). What the
    server still had is delivered after it, then the channel's latest value if it has one; the
    first publication delivered after it carries it as `after_gap`. How a subscription reports
    it (raised, yielded, or only on that publication) is chosen per channel (`Client.subscribe`,
    `gaps=`). Within one epoch, what the node's history still holds of the hole (a recovery cut
    at the reply's byte budget) can be read with `history(channel, since=gap.since)`."""

    def __init__(self, channel: str, since: Position, until: Position, epoch_changed: bool) -> None:
        what = "epoch changed" if epoch_changed else "history no longer reaches back"
        super().__init__(f"{channel}: gap after {since.epoch}:{since.offset} ({what}; "
                         f"now {until.epoch}:{until.offset})")
        self.channel = channel
        self.since = since
        self.until = until
        self.epoch_changed = epoch_changed

    def joined(self, later: Gap) -> Gap:
        """One gap covering this one and a `later` one of the same channel (two holes before
        the next publication)."""
        return Gap(self.channel, self.since, later.until, self.epoch_changed or later.epoch_changed)


@dataclass(slots=True)
class Publication:
    """One publication of a channel: `data` is any JSON value (point channels carry
    `{"v", "t", "q"}`). `after_gap` is the `Gap` just before it when publications of the
    channel were lost in between (it then is what was recovered after the hole, or the
    channel's latest value), else None.

    `historical` (`"hist": true` on the wire): a value a plant source back-filled from before
    the channel's newest (a Sparkplug B `is_historical` metric, an OPC UA back-fill). It has its
    own offset and comes in offset order like any other publication, its data carries its own
    time (`t`), and it is never the channel's current value: whoever shows the current value
    skips it.

    `tags`: the publisher's tags (what a subscription's `filter` compares), None when it gave
    none."""

    channel: str
    offset: int
    data: Any
    epoch: str = ""
    after_gap: Gap | None = None
    historical: bool = False
    tags: dict[str, str] | None = None

    @property
    def position(self) -> Position:
        return Position(self.epoch, self.offset)


@dataclass(slots=True, frozen=True)
class PublishResult:
    """A publish's reply: the publication's `offset` and `epoch`, or for a namespace with a
    write source (a write to a plant device, not a publication) `written` and the `source`
    that took it, with no offset."""

    offset: int | None
    epoch: str | None
    source: str | None = None

    @property
    def written(self) -> bool:
        return self.source is not None


@dataclass(slots=True, frozen=True)
class PresenceClient:
    """A client present in a channel, and its user (empty when anonymous)."""

    client: str
    user: str


@dataclass(slots=True, frozen=True)
class Bucket:
    """One trend bucket: the numeric values published in [t, t + step) (t: unix ms)."""

    t: int
    min: float
    max: float
    last: float
    n: int


@dataclass(slots=True, frozen=True)
class Tier:
    """One trend tier of a namespace: buckets of `step_s` seconds reaching back `window_s`."""

    step_s: int
    window_s: int


class Trend(list[Bucket]):
    """Trend buckets, oldest first, with the `step_s` the server used (rounded up to a multiple
    of the stored step; it names the tier read) and the `tiers` the channel's namespace keeps,
    finest first: how far back a read reaches, and at which step."""

    def __init__(self, buckets: list[Bucket], step_s: int, tiers: list[Tier] | None = None) -> None:
        super().__init__(buckets)
        self.step_s = step_s
        self.tiers: list[Tier] = list(tiers or ())


class History(list[Publication]):
    """Publications, oldest first, with the channel's current `epoch` and `offset`, and
    `complete` false when the history no longer reached back to the `since` asked for."""

    def __init__(self, publications: list[Publication], epoch: str, offset: int, complete: bool) -> None:
        super().__init__(publications)
        self.epoch = epoch
        self.offset = offset
        self.complete = complete


@dataclass(slots=True, frozen=True)
class ConnectInfo:
    """The current connection: the node's URL, this client's id, the node's id and ping
    interval, and with authentication the user and the credentials' expiry (unix s)."""

    url: str
    client: str
    node: str
    ping_s: int
    user: str | None = None
    expires: int | None = None
