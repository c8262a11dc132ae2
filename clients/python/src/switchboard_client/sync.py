"""A blocking client for scripts and notebooks: the asyncio `Client` runs on an event loop in a
background thread, and each method waits for its result.

```python
from switchboard_client.sync import Client

with Client("ws://127.0.0.1:8700/ws") as c:
    c.publish("room:ops", {"text": "hi"})
    for pub in c.subscribe("pt:boiler.temp", initial=True):
        print(pub.offset, pub.data)
```

The background loop keeps the connection alive (it answers the server's pings, reconnects and
recovers) while the calling thread does something else; publications wait in the subscription
until taken. Methods take the same arguments as the asyncio client's. Several threads may share
one client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Coroutine, Literal, Mapping, Sequence, TypeVar

from .client import Client as AsyncClient
from .errors import Gap
from .subscription import GapMode, SubscriptionEndedError
from .subscription import Subscription as AsyncSubscription
from .types import ConnectInfo, History, Position, PresenceClient, Publication, PublishResult

T = TypeVar("T")


class Client:
    """The blocking twin of `switchboard_client.Client` (same arguments)."""

    def __init__(self, url: str | Sequence[str], token: str | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="switchboard-client", daemon=True)
        self._thread.start()
        self._stopped = False
        try:
            # Built on the loop's thread: everything the client creates belongs to that loop.
            self._client: AsyncClient = self._call(self._make(url, token, options))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _make(url: str | Sequence[str], token: str | None, options: dict[str, Any]) -> AsyncClient:
        return AsyncClient(url, token, **options)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError("no result within the timeout") from None
        except BaseException:
            # An interrupt (Ctrl-C in a notebook) leaves nothing running on the loop.
            fut.cancel()
            raise

    # ---------------------------------------------------------------------------------------

    def connect(self) -> Client:
        """Connects (see the asyncio client's `connect`); on failure the background loop stops
        too, and the error is raised."""
        try:
            self._call(self._client.connect())
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Closes the connection and stops the background loop."""
        if self._stopped:
            return
        try:
            self._call(self._client.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._stopped = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> Client:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def info(self) -> ConnectInfo | None:
        return self._client.info

    @property
    def connected(self) -> bool:
        return self._client.connected

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._client.stats)

    @property
    def extensions(self) -> list[str]:
        return self._client.extensions

    # ---------------------------------------------------------------------------------------

    def subscribe(self, channels: str | Sequence[str], *, initial: bool = False,
                  recover: bool | Position | Mapping[str, Position] = True,
                  max_rate_hz: float | None = None, deadband: float | Mapping[str, float] | None = None,
                  delta: Literal["fossil"] | None = None, filter: Mapping[str, Any] | None = None,
                  gaps: GapMode | None = None, yield_gaps: bool = False, partial: bool = False,
                  timeout: float | None = None) -> Subscription:
        sub = self._call(self._client.subscribe(
            channels, initial=initial, recover=recover, max_rate_hz=max_rate_hz, deadband=deadband,
            delta=delta, filter=filter, gaps=gaps, yield_gaps=yield_gaps, partial=partial, timeout=timeout))
        return Subscription(self, sub)

    def publish(self, channel: str, data: Any, *, tags: Mapping[str, str] | None = None,
                idempotency_key: str | None = None, timeout: float | None = None) -> PublishResult:
        return self._call(self._client.publish(channel, data, tags=tags, idempotency_key=idempotency_key,
                                               timeout=timeout))

    def history(self, channel: str, *, limit: int | None = None, since: Position | None = None,
                timeout: float | None = None) -> History:
        return self._call(self._client.history(channel, limit=limit, since=since, timeout=timeout))

    def presence(self, channel: str, *, timeout: float | None = None) -> list[PresenceClient]:
        return self._call(self._client.presence(channel, timeout=timeout))

    def ping(self, data: Any = None, *, timeout: float | None = None) -> Any:
        return self._call(self._client.ping(data, timeout=timeout))

    def request(self, command: str, body: Mapping[str, Any], *, timeout: float | None = None) -> Any:
        return self._call(self._client.request(command, body, timeout=timeout))

    def refresh(self, token: str) -> int:
        return self._call(self._client.refresh(token))

    def ack(self, alarm: str, comment: str | None = None) -> dict[str, Any]:
        return self._call(self._client.ack(alarm, comment))

    def shelve(self, alarm: str, for_s: float, comment: str | None = None) -> dict[str, Any]:
        return self._call(self._client.shelve(alarm, for_s, comment))

    def unshelve(self, alarm: str, comment: str | None = None) -> dict[str, Any]:
        return self._call(self._client.unshelve(alarm, comment))

    def trend(self, channel: str, window_s: int = 3600, *, step_s: int | None = None,
              until_ms: int | None = None, as_frame: bool = False, timeout: float | None = None) -> Any:
        return self._call(self._client.trend(channel, window_s, step_s=step_s, until_ms=until_ms,
                                             as_frame=as_frame, timeout=timeout))


class Subscription:
    """A subscription read by blocking: `for pub in sub` or `sub.get(timeout)`; gaps as in the
    asyncio client (`pub.after_gap`, and raised or yielded per the channel's gap mode)."""

    def __init__(self, client: Client, sub: AsyncSubscription) -> None:
        self._client = client
        self._sub = sub

    @property
    def channels(self) -> tuple[str, ...]:
        return self._sub.channels

    @property
    def errors(self) -> dict[str, Any]:
        return self._sub.errors

    @property
    def waiting(self) -> list[str]:
        return self._sub.waiting

    def position(self, channel: str | None = None) -> Position | None:
        return self._sub.position(channel)

    @property
    def pending(self) -> int:
        return self._sub.pending

    def get(self, timeout: float | None = None) -> Publication | Gap:
        """The next publication; `TimeoutError` after `timeout` seconds,
        `SubscriptionEndedError` once the subscription ended."""
        try:
            return self._client._call(self._sub.get(timeout))
        except asyncio.TimeoutError:
            raise TimeoutError(f"no publication within {timeout} s") from None

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> Publication:
        try:
            return self.get()  # type: ignore[return-value]  # a Gap only in gap mode "yield"
        except SubscriptionEndedError:
            raise StopIteration from None

    def unsubscribe(self) -> None:
        self._client._call(self._sub.unsubscribe())

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unsubscribe()
