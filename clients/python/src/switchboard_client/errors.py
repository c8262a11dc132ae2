"""Typed errors: every refusal the server can send reaches the caller as one of these, with the
server's code and message (docs/protocol.md, "Codes").

- `ReplyError` and its subclasses: a command or one channel of a subscribe was refused
  (`{"error": {"code", "message"}}`); `channel` names the channel when there is one.
- `DisconnectError` and its subclasses: the server ended the connection for good
  (`{"disconnect": {..., "reconnect": false}}` or a close code that forbids reconnecting).
- `UnsubscribedError`: the server ended one subscription and asked not to subscribe it again.
- `ConnectionLostError`: the connection dropped after a command was sent and before its reply,
  so the command may or may not have run.
- `Gap` (defined in `types`, re-exported here): recovery could not reach back to the
  subscription's position (`complete: false`, or a new epoch); raised, yielded or carried by the
  next publication as its subscription chose (`Client.subscribe`, `gaps=`).
"""

from __future__ import annotations

from typing import Any, Mapping

from .types import Gap as Gap  # re-exported: raised like the errors here


class SwitchboardError(Exception):
    """Base of every error this package raises; `code` is the server's code (or a local one,
    0, when the error did not come from the server)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code} {message}" if code else message)
        self.code = code
        self.message = message


# --------------------------------------------------------------------------------------------
# Replies


class ReplyError(SwitchboardError):
    """A command, or one channel of a subscribe, refused by the server."""

    def __init__(self, code: int, message: str, channel: str | None = None) -> None:
        super().__init__(code, message if channel is None else f"{channel}: {message}")
        self.message = message
        self.channel = channel
        # Every channel refused by the same subscribe call, when it named several.
        self.errors: dict[str, ReplyError] = {}


class BadRequestError(ReplyError):
    """400: a malformed command, channel name or option."""


class UnauthenticatedError(ReplyError):
    """401: credentials are needed (or a refreshed token was refused)."""


class ForbiddenError(ReplyError):
    """403: the credentials do not allow this."""


class NotFoundError(ReplyError):
    """404: unknown command or channel."""


class ConflictError(ReplyError):
    """409: already subscribed."""


class TooLargeError(ReplyError):
    """413: larger than the server takes (a reply budget, a publication)."""


class RateLimitedError(ReplyError):
    """429: a rate or a limit was reached."""


class InternalServerError(ReplyError):
    """500: the server failed."""


class WriteRefusedError(ReplyError):
    """502: a plant device refused a write (publish to a `write_source` namespace)."""


class UnavailableError(ReplyError):
    """503: the broker (or a write source) is unavailable; nothing was done, retry later."""


class OutcomeUnknownError(ReplyError):
    """504: a publish reached the broker and no answer came back; it may or may not exist
    (retry only with the same `idempotency_key`)."""


_REPLY_CLASSES: dict[int, type[ReplyError]] = {
    400: BadRequestError,
    401: UnauthenticatedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    413: TooLargeError,
    429: RateLimitedError,
    500: InternalServerError,
    502: WriteRefusedError,
    503: UnavailableError,
    504: OutcomeUnknownError,
}


def reply_error(body: Any, channel: str | None = None) -> ReplyError:
    """The typed error of an `{"code", "message"}` body."""
    code, message = _code_message(body)
    return _REPLY_CLASSES.get(code, ReplyError)(code, message, channel)


def _code_message(body: Any) -> tuple[int, str]:
    if isinstance(body, Mapping):
        code = body.get("code")
        message = body.get("message")
        return (int(code) if isinstance(code, int) else 0, str(message) if message is not None else "")
    return 0, repr(body)


# --------------------------------------------------------------------------------------------
# Connection


class DisconnectError(SwitchboardError):
    """The server closed the connection and the client does not reconnect."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code, reason)
        self.reason = reason


class TokenError(DisconnectError):
    """4001: the token (or user and password) was refused, or expired without a refresh."""


class AccessDeniedError(DisconnectError):
    """4003: the connection is not allowed."""


class ProtocolError(DisconnectError):
    """1002 / 1007: a frame of this client broke RFC 6455; 4010: a frame carried no command."""


class TooManyConnectionsError(DisconnectError):
    """4029: too many connections (or password attempts) from this client's address."""


_DISCONNECT_CLASSES: dict[int, type[DisconnectError]] = {
    4001: TokenError,
    4003: AccessDeniedError,
    1002: ProtocolError,
    1007: ProtocolError,
    4010: ProtocolError,
    4029: TooManyConnectionsError,
}


def disconnect_error(code: int, reason: str) -> DisconnectError:
    return _DISCONNECT_CLASSES.get(code, DisconnectError)(code, reason)


class ConnectError(SwitchboardError):
    """No node of the URL list could be reached (within `connect_timeout`)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


class ConnectionLostError(SwitchboardError):
    """The connection dropped after the command was sent and before its reply: it may or may
    not have run (a publish is safe to repeat only with an `idempotency_key`)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


class ClientClosedError(SwitchboardError):
    """The client was closed."""

    def __init__(self, message: str = "client closed") -> None:
        super().__init__(0, message)


class CommandTimeoutError(SwitchboardError, TimeoutError):
    """No reply (or no connection to send on) within the command's timeout."""

    def __init__(self, message: str) -> None:
        SwitchboardError.__init__(self, 0, message)


class UnsubscribedError(SwitchboardError):
    """The server ended this channel's subscription and asked the client not to subscribe it
    again (`{"unsubscribed": {..., "resubscribe": false}}`)."""

    def __init__(self, code: int, reason: str, channel: str) -> None:
        super().__init__(code, f"{channel}: {reason}")
        self.reason = reason
        self.channel = channel
