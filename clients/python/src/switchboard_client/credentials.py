"""Credentials: a token, a Basic user and password, or a callback returning a fresh token.

They go in the `connect` command (docs/protocol.md, "Connecting") — the same on every node and
over any proxy — and in `Authorization` for the HTTP API. A token from a callback is renewed
with the `refresh` command before its `exp`, and asked for again at every reconnect.
"""

from __future__ import annotations

import base64
import inspect
import time
from typing import Any, Awaitable, Callable, Union

TokenProvider = Callable[[], Union[str, Awaitable[str]]]


class Credentials:
    def __init__(self, token: str | None = None, user: str | None = None, password: str | None = None,
                 token_provider: TokenProvider | None = None) -> None:
        if (token is not None or token_provider is not None) and user is not None:
            raise ValueError("give a token (or token_provider) or a user and password, not both")
        if user is not None and password is None:
            raise ValueError("a user needs a password")
        self._token = token
        self.user = user
        self.password = password
        self.provider = token_provider

    @property
    def renewable(self) -> bool:
        """A provider can hand out a new token: refresh before expiry, reconnect after 4001."""
        return self.provider is not None

    async def fresh_token(self) -> str | None:
        """The token to present now (asks the provider, if any)."""
        if self.provider is not None:
            got = self.provider()
            if inspect.isawaitable(got):
                got = await got
            if not isinstance(got, str) or not got:
                raise ValueError("token_provider must return a non-empty string")
            self._token = got
        return self._token

    async def connect_body(self) -> dict[str, Any]:
        """Credential fields of the `connect` command."""
        if self.user is not None:
            return {"user": self.user, "password": self.password}
        token = await self.fresh_token()
        return {"token": token} if token else {}

    def http_headers(self) -> dict[str, str]:
        """`Authorization` for the HTTP API with the latest token (or Basic credentials)."""
        if self.user is not None:
            raw = f"{self.user}:{self.password}".encode()
            return {"Authorization": "Basic " + base64.b64encode(raw).decode()}
        if self._token:
            return {"Authorization": f"Bearer {self._token}"}
        return {}


def refresh_delay(expires: int, now: float | None = None) -> float:
    """Seconds to wait before refreshing a token that expires at `expires` (unix s): a fifth of
    the remaining lifetime before it (at least 1 s, at most 60 s), never negative."""
    left = expires - (time.time() if now is None else now)
    return max(0.0, left - min(60.0, max(1.0, left / 5)))
