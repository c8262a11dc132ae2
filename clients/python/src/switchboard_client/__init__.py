"""Python client for Switchboard, the real-time push gateway (docs/protocol.md).

```python
import asyncio

from switchboard_client import Client


async def main() -> None:
    async with Client("ws://127.0.0.1:8700/ws") as c:
        sub = await c.subscribe("pt:boiler.temp", initial=True)
        async for pub in sub:  # goes on across node restarts (see `Publication.after_gap`)
            print(pub.channel, pub.offset, pub.data)


asyncio.run(main())
```

# Layout

- `client`: `Client` — the connection (node list, credentials, reconnect with jittered
  backoff), subscribe batching and 503/413 retries, delta pushes that fail resubscribed.
- `commands`: the request/reply commands `Client` inherits (publish, history, presence, ...).
- `subscription`: `Subscription` (what callers iterate) and the per-channel recovery rules,
  gaps included (gap modes).
- `codec`: JSON and MessagePack, several messages per frame.
- `fossil`: applying the Fossil deltas of `delta="fossil"` subscriptions, bounded and checked.
- `credentials`: token, Basic, token provider and when to refresh.
- `backoff`: jittered exponential backoff.
- `http`: the node's HTTP API (trends) and the pandas helper.
- `errors`: typed errors, one per server code.
- `types`: value types (`Publication`, `Position`, ...) and `Gap`, the hole a recovery could
  not fill.
- `sync`: a blocking wrapper running the client on a background event loop.
"""

from .client import Client
from .errors import (AccessDeniedError, BadRequestError, ClientClosedError, CommandTimeoutError,
                     ConflictError, ConnectError, ConnectionLostError, DisconnectError,
                     ForbiddenError, Gap, InternalServerError, NotFoundError, OutcomeUnknownError,
                     ProtocolError, RateLimitedError, ReplyError, SwitchboardError, TokenError,
                     TooLargeError, TooManyConnectionsError, UnauthenticatedError,
                     UnavailableError, UnsubscribedError, WriteRefusedError)
from .fossil import DeltaError
from .http import trend_frame
from .subscription import GapMode, Subscription, SubscriptionEndedError
from .types import (Bucket, ConnectInfo, History, Position, PresenceClient, Publication,
                    PublishResult, Tier, Trend)

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError", "BadRequestError", "Bucket", "Client", "ClientClosedError",
    "CommandTimeoutError", "ConflictError", "ConnectError", "ConnectInfo", "ConnectionLostError",
    "DeltaError", "DisconnectError", "ForbiddenError", "Gap", "GapMode", "History", "InternalServerError", "NotFoundError",
    "OutcomeUnknownError", "Position", "PresenceClient", "ProtocolError", "Publication",
    "PublishResult", "RateLimitedError", "ReplyError", "Subscription", "SubscriptionEndedError",
    "SwitchboardError", "Tier", "TokenError", "TooLargeError", "TooManyConnectionsError", "Trend",
    "UnauthenticatedError", "UnavailableError", "UnsubscribedError", "WriteRefusedError",
    "trend_frame",
]
