"""The asyncio client: one WebSocket connection to one node of a list, carrying any number of
subscriptions and commands, reconnecting by itself and resuming every subscription.

One task (`_run`) owns the connection: it opens it (the next URL when one fails), reads every
frame and dispatches each message in arrival order, and after a loss waits a jittered backoff
and opens the next one. Dispatch is synchronous — a subscribe reply is applied before the
publications that follow it in the same frame — which is what keeps each channel in offset
order without buffering. Commands await a future their reply resolves.

Delivery guarantee: per channel, in offset order, each publication at most once. Across
reconnects nothing is lost while the server's history reaches back to the channel's position;
otherwise the subscription reports a `Gap` before what could still be recovered and the
channel's latest value (raised, yielded, or on the next publication: `subscribe(gaps=)`).
A publication of a `delta` subscription that cannot be rebuilt is such a hole too: the channel
is unsubscribed and subscribed again with `recover`, and history fills it where it can.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
from typing import Any, Callable, Literal, Mapping, Sequence

from websockets.asyncio.client import ClientConnection, connect as ws_connect
from websockets.exceptions import ConnectionClosed

from .backoff import Backoff
from .codec import Format, codec_for
from .commands import Commands
from .credentials import Credentials, TokenProvider, refresh_delay
from .errors import (ClientClosedError, CommandTimeoutError, ConflictError, ConnectError, ConnectionLostError,
                     DisconnectError, ReplyError, SwitchboardError, TooLargeError, UnsubscribedError,
                     disconnect_error, reply_error)
from .fossil import DeltaError
from .http import fetch_trend, http_base, trend_frame
from .subscription import (ERROR, GAP_MODES, PENDING, SENDING, SUBSCRIBED, WAITING, Entry, GapMode,
                           Subscription)
from .types import ConnectInfo, Position, Trend

log = logging.getLogger("switchboard_client")

# Close codes after which reconnecting cannot help (docs/protocol.md, "Codes"): frames that
# broke RFC 6455 (1002, 1007), credentials, a refusal, no command. 4001 is retried when a token
# provider can hand out a new token.
NO_RECONNECT = frozenset({1002, 1007, 4001, 4003, 4010})
# Refusals of a `connect` that no other node would answer differently.
FATAL_CONNECT_REPLIES = frozenset({400, 401, 403})
# A subscribe command stays well under the server's 64 KiB frame limit.
MAX_CHANNELS_PER_SUBSCRIBE = 1000
MAX_SUBSCRIBE_BYTES = 40_000
# A connection that lasted this long resets the reconnect backoff.
STABLE_S = 5.0
MAX_U32 = 0xFFFF_FFFF
# The largest text a delta subscription's push may declare by default (1 MiB): well above a
# node's largest publication (`limits.max_publication_bytes`, 64 KiB by default).
MAX_DELTA_BYTES = 1 << 20


def in_pt_namespace(channel: str) -> bool:
    """The node's point channels by default: the `pt` namespace (latest value wins, no history)."""
    return channel.startswith("pt:")


class Client(Commands):
    """A Switchboard client (docs/protocol.md). Use as `async with Client(url) as c:`.

    `url` is one node's WebSocket URL or a list of them (nodes of one cluster): a connection
    goes to the next when one fails. Credentials: `token`, or `user` and `password` (Basic), or
    `token_provider` — a function (or coroutine function) returning a fresh token, called at
    every connect and before the token's `exp` (sent with `refresh`). `format` is `"json"` or
    `"msgpack"` (the `msgpack` extra). A command larger than `max_frame_bytes` (the node's
    `limits.max_frame_bytes`) raises `TooLargeError` without being sent.
    `is_point_channel` says which channels are point channels (default: the `pt:` namespace),
    whose gaps do not interrupt iteration by default (`subscribe`, `gaps=`).
    `max_delta_bytes` bounds the publication a `delta` subscription's push may declare: a
    larger one is refused before it is rebuilt.
    `compression="deflate"` offers permessage-deflate (RFC 7692; docs/protocol.md,
    "Compression"), which a node with `limits.compression = "deflate"` (its default) accepts:
    messages of at least `limits.compression_min_bytes` then arrive compressed. None offers
    nothing. `extensions` names what the current connection negotiated.
    """

    def __init__(self, url: str | Sequence[str], token: str | None = None, *,
                 user: str | None = None, password: str | None = None,
                 token_provider: TokenProvider | None = None, format: Format = "json",
                 name: str | None = None, reconnect: bool = True,
                 backoff_min: float = 0.25, backoff_max: float = 10.0,
                 connect_timeout: float = 10.0, open_timeout: float = 5.0,
                 command_timeout: float = 10.0, ping_interval: float | None = 20.0,
                 ping_timeout: float | None = 20.0, max_message_bytes: int | None = 64 << 20,
                 max_frame_bytes: int = 65536, compression: Literal["deflate"] | None = "deflate",
                 headers: Mapping[str, str] | None = None, ssl: ssl_module.SSLContext | None = None,
                 proxy: str | bool | None = True,
                 is_point_channel: Callable[[str], bool] = in_pt_namespace,
                 max_delta_bytes: int = MAX_DELTA_BYTES) -> None:
        self.urls: list[str] = [url] if isinstance(url, str) else list(url)
        if not self.urls:
            raise ValueError("no URL")
        if compression not in ("deflate", None):
            raise ValueError(f"compression must be 'deflate' or None, not {compression!r}")
        self._creds = Credentials(token, user, password, token_provider)
        self._codec = codec_for(format)
        self.format = format
        self._name = name
        self._reconnect = reconnect
        self._backoff = Backoff(backoff_min, backoff_max)
        # 503 refusals (a broker shard failing over): 0.2 s growing to 5 s, jittered.
        self._retry_backoff = Backoff(0.2, 5.0)
        self._connect_timeout = connect_timeout
        self._open_timeout = open_timeout
        self._command_timeout = command_timeout
        self._ws_options: dict[str, Any] = {
            "ping_interval": ping_interval, "ping_timeout": ping_timeout,
            "max_size": max_message_bytes, "compression": compression, "open_timeout": open_timeout,
            "close_timeout": 2.0,
            "additional_headers": dict(headers or {}), "ssl": ssl,
            "proxy": (True if proxy is True else (proxy or None)),
        }
        self._ssl = ssl
        # The node closes the connection (1009) on a larger frame: refused here instead.
        self._max_frame_bytes = max_frame_bytes
        self._is_point_channel = is_point_channel
        self._max_delta_bytes = max_delta_bytes
        self.info: ConnectInfo | None = None
        self.stats = {"reconnects": 0, "publications": 0, "gaps": 0, "resubscribes": 0, "retries_503": 0,
                      "delta_failures": 0}

        self._url_index = 0
        self._ws: ClientConnection | None = None
        self._connected: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None
        self._closed = False
        self._fatal: SwitchboardError | None = None
        self._next_id = 1
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._sub_inflight: dict[int, list[str]] = {}
        # Channels the server still holds that go out again: unsubscribed before the subscribe.
        self._unsubscribe_first: set[str] = set()
        self._entries: dict[str, Entry] = {}
        self._subs: set[Subscription] = set()
        self._disconnect: dict[str, Any] | None = None
        self._flush_task: asyncio.Task[None] | None = None
        self._flush_wanted = False
        self._retry_timer: asyncio.TimerHandle | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._connections = 0
        self._last_error: BaseException | None = None

    # ---------------------------------------------------------------------------------------
    # Lifecycle

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self._ws is not None and self.info is not None

    @property
    def extensions(self) -> list[str]:
        """The WebSocket extensions the current connection negotiated (`["permessage-deflate"]`
        when the node accepted `compression="deflate"`); empty while not connected."""
        ws = self._ws
        return [] if ws is None else [e.name for e in ws.protocol.extensions]

    async def connect(self) -> None:
        """Connects to the first node that answers; raises `ConnectError` when none did within
        `connect_timeout`, or the typed error of a refusal (e.g. `TokenError`). After that the
        client reconnects by itself until `close()`."""
        if self._closed:
            raise ClientClosedError()
        if self._runner is None:
            self._connected = asyncio.Event()
            self._runner = asyncio.get_running_loop().create_task(self._run(), name="switchboard-client")
        assert self._connected is not None
        try:
            await asyncio.wait_for(self._connected.wait(), self._connect_timeout)
        except asyncio.TimeoutError:
            err = ConnectError(f"no node answered within {self._connect_timeout} s: {self._last_error!r}")
            await self.close()
            raise err from None
        if self._fatal is not None:
            raise self._fatal

    async def close(self) -> None:
        """Closes the connection for good: pending commands raise `ClientClosedError` and
        subscriptions stop iterating after what they already received."""
        if self._closed:
            return
        self._closed = True
        for t in (self._flush_task, self._refresh_task):
            if t is not None:
                t.cancel()
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.cancel()
            try:
                await runner
            except (asyncio.CancelledError, Exception):
                pass
        self._ws = None
        self.info = None
        self._fail_pending(ClientClosedError())
        for sub in list(self._subs):
            sub._finish(self._fatal or StopAsyncIteration())
        self._subs.clear()
        self._entries.clear()
        if self._connected is not None:
            self._connected.set()

    async def _run(self) -> None:
        try:
            await self._connection_loop()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            # A bug must not leave callers waiting on a client that no longer runs.
            log.exception("switchboard client failed")
            self._fail(SwitchboardError(0, f"client failed: {e!r}"))

    async def _connection_loop(self) -> None:
        delay = 0.0
        while True:
            if delay:
                await asyncio.sleep(delay)
            try:
                ws, info = await self._open_any()
            except SwitchboardError as e:
                if isinstance(e, (DisconnectError, ReplyError)):
                    self._fail(e)
                    return
                self._last_error = e
                delay = self._backoff.next()
                continue
            loop = asyncio.get_running_loop()
            opened = loop.time()
            try:
                self._on_open(ws, info)
                code, reason, again = await self._read(ws)
            finally:
                # Also when close() cancels this task: the socket goes with it.
                await ws.close()
            self._on_lost(code, reason)
            if loop.time() - opened >= STABLE_S:
                self._backoff.reset()
            if not again:
                self._fail(disconnect_error(code, reason))
                return
            log.info("connection lost (%s %s); reconnecting", code, reason)
            delay = self._backoff.next()

    async def _open_any(self) -> tuple[ClientConnection, ConnectInfo]:
        """Opens a connection to the current URL, or else to the next ones in turn."""
        errors: list[str] = []
        n = len(self.urls)
        for i in range(n):
            idx = (self._url_index + i) % n
            url = self.urls[idx]
            try:
                ws, info = await self._open(url)
            except Exception as e:
                # Refused credentials are refused by every node; anything else (refused TCP,
                # a timeout, an HTTP status at the handshake, 4029) may go better elsewhere.
                if (isinstance(e, ReplyError) and e.code in FATAL_CONNECT_REPLIES) or \
                        (isinstance(e, DisconnectError) and e.code in NO_RECONNECT):
                    raise
                errors.append(f"{url}: {e!r}")
                continue
            self._url_index = idx
            return ws, info
        raise ConnectError("; ".join(errors))

    async def _open(self, url: str) -> tuple[ClientConnection, ConnectInfo]:
        body = await self._creds.connect_body()
        if self._name is not None:
            body["name"] = self._name
        ws = await ws_connect(url, subprotocols=[self._codec.subprotocol],  # type: ignore[list-item]
                              **self._ws_options)
        try:
            cid = self._alloc_id()
            await ws.send(self._codec.encode({"id": cid, "connect": body}))
            return ws, await asyncio.wait_for(self._connect_reply(ws, cid, url), self._open_timeout)
        except BaseException:
            await ws.close()
            raise

    async def _connect_reply(self, ws: ClientConnection, cid: int, url: str) -> ConnectInfo:
        told: dict[str, Any] | None = None
        try:
            while True:
                for m in self._codec.decode(await ws.recv()):
                    if m.get("id") == cid:
                        if "error" in m:
                            raise reply_error(m["error"])
                        ok = m["ok"]
                        return ConnectInfo(url=url, client=ok.get("client", ""), node=ok.get("node", ""),
                                           ping_s=int(ok.get("ping_s") or 25), user=ok.get("user"),
                                           expires=ok.get("expires"))
                    if "disconnect" in m:
                        told = m["disconnect"]
        except ConnectionClosed as e:
            code = int(told["code"]) if told else (e.rcvd.code if e.rcvd else 1006)
            reason = str(told["reason"]) if told else (e.rcvd.reason if e.rcvd else "closed")
            raise disconnect_error(code, reason) from None

    def _on_open(self, ws: ClientConnection, info: ConnectInfo) -> None:
        self._ws = ws
        self.info = info
        self._disconnect = None
        if self._connections > 0:
            self.stats["reconnects"] += 1
        self._connections += 1
        for e in self._entries.values():
            if e.status != ERROR:
                e.status = PENDING
        if info.expires and self._creds.renewable:
            self._refresh_task = asyncio.get_running_loop().create_task(self._refresh_loop(info.expires))
        assert self._connected is not None
        self._connected.set()
        self._schedule_flush()

    async def _read(self, ws: ClientConnection) -> tuple[int, str, bool]:
        """Reads until the connection ends: its close code, reason and whether to reconnect."""
        dispatch = self._dispatch
        decode = self._codec.decode
        try:
            async for frame in ws:
                for m in decode(frame):
                    dispatch(m)
        except ConnectionClosed:
            pass
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            # A frame this client cannot read: a new connection starts from a clean state.
            log.warning("unreadable message from the server: %r", e)
            return 1006, f"unreadable message: {e}", self._reconnect
        told = self._disconnect
        if told is not None:
            code, reason = int(told.get("code", 1006)), str(told.get("reason", ""))
            again = bool(told.get("reconnect"))
        else:
            code = ws.close_code if ws.close_code is not None else 1006
            reason = ws.close_reason or ""
            again = code not in NO_RECONNECT
        if code == 4001 and self._creds.renewable:
            again = True  # an expired token: the provider hands out a new one
        return code, reason, again and self._reconnect

    def _on_lost(self, code: int, reason: str) -> None:
        self._ws = None
        self.info = None
        assert self._connected is not None
        self._connected.clear()
        if self._refresh_task is not None:
            self._refresh_task.cancel()
            self._refresh_task = None
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        self._fail_pending(ConnectionLostError(f"connection closed ({code} {reason})".strip()))
        self._sub_inflight.clear()
        self._unsubscribe_first.clear()
        for e in self._entries.values():
            if e.status != ERROR:
                e.status = PENDING
                e.inflight = 0

    def _fail(self, err: SwitchboardError) -> None:
        """The client cannot go on (a refused token, 4003, reconnect off): everything raises."""
        log.warning("switchboard client stopped: %s", err)
        self._fatal = err
        self._closed = True
        self._fail_pending(err)
        for sub in list(self._subs):
            sub._push(err)
            sub._finish(err)
        self._subs.clear()
        self._entries.clear()
        if self._connected is not None:
            self._connected.set()

    def _fail_pending(self, err: SwitchboardError) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)

    async def _refresh_loop(self, expires: int) -> None:
        """Hands the server a fresh token before each one expires."""
        while True:
            await asyncio.sleep(refresh_delay(expires))
            try:
                token = await self._creds.fresh_token()
                reply = await self._request("refresh", {"token": token})
                expires = int(reply["expires"])
            except (ConnectionLostError, ClientClosedError):
                return
            except Exception as e:
                log.warning("token refresh failed: %s", e)
                await asyncio.sleep(1.0)

    # ---------------------------------------------------------------------------------------
    # Receiving

    def _dispatch(self, m: dict[str, Any]) -> None:
        pub = m.get("pub")
        if pub is not None:
            self.stats["publications"] += 1
            e = self._entries.get(pub["ch"])
            if e is None or e.status != SUBSCRIBED:
                return
            off = pub["off"]
            if "delta" in pub:
                # Rebuilt even when covered by the reply: the next push builds on it.
                try:
                    data = e.rebuild(pub, self._max_delta_bytes)
                except DeltaError as err:
                    self._delta_failed(e, off, err)
                    return
            else:
                data = pub.get("data")
            if off <= e.offset:
                return  # covered by the subscribe reply already
            e.offset = off
            e.deliver(off, data, pub.get("hist") is True, pub.get("tags"))
            return
        mid = m.get("id")
        if mid is not None:
            if mid in self._sub_inflight:
                self._on_subscribe_reply(mid, m)
                return
            fut = self._pending.pop(mid, None)
            if fut is None or fut.done():
                if "error" in m:  # a command sent without an id (unsubscribe) failed
                    log.warning("server error: %s", m["error"])
                return
            if "error" in m:
                fut.set_exception(reply_error(m["error"]))
            else:
                fut.set_result(m.get("ok"))
            return
        if "unsubscribed" in m:
            self._on_unsubscribed(m["unsubscribed"])
        elif "disconnect" in m:
            self._disconnect = m["disconnect"]

    def _delta_failed(self, e: Entry, off: int, err: DeltaError) -> None:
        """A push of a delta subscription could not be rebuilt: the channel's stream has a hole
        at `off` while the server still holds the subscription. It is unsubscribed and
        subscribed again with `recover` from its position (pushes on their way are dropped
        meanwhile); a hole history no longer holds is a `Gap` as any other."""
        log.warning("%s: publication %s could not be rebuilt (%s); subscribing again", e.channel, off, err)
        self.stats["delta_failures"] += 1
        e.status = PENDING
        self._unsubscribe_first.add(e.channel)
        self._schedule_flush()

    def _on_unsubscribed(self, body: dict[str, Any]) -> None:
        """The server dropped one channel of this connection (its shard may have lost
        publications): subscribe it again, recovering from its position, or end it."""
        e = self._entries.get(body.get("ch", ""))
        if e is None:
            return
        if not body.get("resubscribe", False):
            self._entries.pop(e.channel, None)
            e.status = ERROR
            e.sub._lost(e, UnsubscribedError(int(body.get("code", 0)), str(body.get("reason", "")), e.channel))
            return
        self.stats["resubscribes"] += 1
        if e.status == SENDING:
            e.lost_again = True
        elif e.status == SUBSCRIBED:
            e.status = PENDING
            self._schedule_flush()

    def _on_subscribe_reply(self, cid: int, m: dict[str, Any]) -> None:
        channels = self._sub_inflight.pop(cid)
        failed = m.get("error")
        results = (m.get("ok") or {}).get("channels") or {}
        took = any("error" not in r for r in results.values())
        flush = later = False
        for ch in channels:
            e = self._entries.get(ch)
            if e is None or e.inflight != cid:
                continue
            e.inflight = 0
            r = results.get(ch)
            if failed is not None or r is None:
                self._refuse(e, reply_error(failed or {"code": 500, "message": "no result for this channel"}, ch))
                continue
            err = r.get("error")
            if err is None:
                if e.accept(r):
                    self.stats["gaps"] += 1
                e.sub._settle(e)
                if e.lost_again:
                    e.lost_again = False
                    e.status = PENDING
                    flush = True
                continue
            code = err.get("code")
            if code == 413 and took and not e.alone:
                # Others filled the reply: this channel goes again in a command of its own.
                e.status, e.alone, flush = PENDING, True, True
            elif code == 409 and e.epoch is not None:
                # 409: the server holds this subscription on this connection already, so it streams on.
                e.status = SUBSCRIBED
                e.sub._settle(e)
            elif code == 503:
                # Its broker shard is failing over: the others stream; this one is asked again.
                e.status, later = WAITING, True
                self.stats["retries_503"] += 1
                e.sub._settle(e)
            else:
                self._refuse(e, reply_error(err, ch))
        if flush:
            self._schedule_flush()
        if later:
            self._retry_later()
        elif took:
            self._retry_backoff.reset()

    def _refuse(self, e: Entry, err: ReplyError) -> None:
        self._entries.pop(e.channel, None)
        e.status = ERROR
        e.sub._refused(e, err)

    def _retry_later(self) -> None:
        if self._retry_timer is not None:
            return
        delay = max(0.05, self._retry_backoff.next())

        def retry() -> None:
            self._retry_timer = None
            for e in self._entries.values():
                if e.status == WAITING:
                    e.status = PENDING
            self._schedule_flush()

        self._retry_timer = asyncio.get_running_loop().call_later(delay, retry)

    # ---------------------------------------------------------------------------------------
    # Sending

    def _alloc_id(self) -> int:
        cid = self._next_id
        self._next_id = 1 if cid >= MAX_U32 else cid + 1
        return cid

    def _schedule_flush(self) -> None:
        self._flush_wanted = True
        if self._flush_task is None and not self._closed:
            self._flush_task = asyncio.get_running_loop().create_task(self._flusher())

    async def _flusher(self) -> None:
        try:
            while self._flush_wanted:
                self._flush_wanted = False
                # Subscribes made in the same turn of the loop share commands.
                await asyncio.sleep(0)
                await self._flush_subscribes()
        finally:
            self._flush_task = None

    async def _flush_subscribes(self) -> None:
        """Sends every pending channel: one command per sampling asked for (sampling is per
        command on the wire), chunked under the frame limit; 413 channels alone."""
        ws = self._ws
        if ws is None or self.info is None:
            return
        if self._unsubscribe_first:
            gone = sorted(self._unsubscribe_first)
            self._unsubscribe_first.clear()
            try:
                await ws.send(self._codec.encode({"unsubscribe": {"channels": gone}}))
            except ConnectionClosed:
                return
        groups: dict[str, list[Entry]] = {}
        for e in self._entries.values():
            if e.status == PENDING:
                groups.setdefault("alone" if e.alone else e.sampling_key, []).append(e)
        commands: list[tuple[int, dict[str, Any]]] = []
        for key, group in groups.items():
            chunk: list[Entry] = []
            size = 0
            for e in group:
                extra = len(e.channel) + 8 + (len(e.epoch or "") + 40 if e.recover else 0)
                if chunk and (key == "alone" or len(chunk) >= MAX_CHANNELS_PER_SUBSCRIBE
                              or size + extra > MAX_SUBSCRIBE_BYTES):
                    commands.append(self._subscribe_command(chunk))
                    chunk, size = [], 0
                chunk.append(e)
                size += extra
            if chunk:
                commands.append(self._subscribe_command(chunk))
        for cid, cmd in commands:
            try:
                await ws.send(self._codec.encode(cmd))
            except ConnectionClosed:
                return  # the reader sees the close and resets every entry

    def _subscribe_command(self, chunk: list[Entry]) -> tuple[int, dict[str, Any]]:
        cid = self._alloc_id()
        recover: dict[str, Any] = {}
        for e in chunk:
            e.status = SENDING
            e.inflight = cid
            e.alone = False
            pos = e.recover_from()
            if pos is not None:
                recover[e.channel] = pos
        body: dict[str, Any] = {"channels": [e.channel for e in chunk], "initial": True, **chunk[0].sampling}
        if recover:
            body["recover"] = recover
        self._sub_inflight[cid] = [e.channel for e in chunk]
        return cid, {"id": cid, "subscribe": body}

    async def _wait_connected(self, deadline: float) -> ClientConnection:
        loop = asyncio.get_running_loop()
        while True:
            if self._fatal is not None:
                raise self._fatal
            if self._closed or self._connected is None:
                raise ClientClosedError("client closed" if self._closed else
                                        "not connected: use `async with Client(...)` or `await client.connect()`")
            ws = self._ws
            if ws is not None and self.info is not None:
                return ws
            left = deadline - loop.time()
            if left <= 0:
                raise CommandTimeoutError("not connected")
            try:
                await asyncio.wait_for(self._connected.wait(), left)
            except asyncio.TimeoutError:
                raise CommandTimeoutError(
                    f"not connected within the command timeout: {self._last_error!r}") from None

    async def _request(self, command: str, body: dict[str, Any], *, timeout: float | None = None,
                       retry: bool = False) -> Any:
        """Sends a command and returns its `ok` body. `retry`: the command is safe to repeat,
        so a connection lost before its reply sends it again on the next one (until the
        timeout)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._command_timeout if timeout is None else timeout)
        while True:
            ws = await self._wait_connected(deadline)
            cid = self._alloc_id()
            frame = self._codec.encode({"id": cid, command: body})
            size = len(frame.encode() if isinstance(frame, str) else frame)
            if size > self._max_frame_bytes:
                raise TooLargeError(413, f"{command} of {size} bytes is larger than max_frame_bytes "
                                         f"({self._max_frame_bytes})", body.get("channel"))
            fut: asyncio.Future[Any] = loop.create_future()
            self._pending[cid] = fut
            try:
                await ws.send(frame)
                return await asyncio.wait_for(fut, max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise CommandTimeoutError(f"{command}: no reply within the timeout") from None
            except (ConnectionLostError, ConnectionClosed):
                if not retry or loop.time() >= deadline or self._closed:
                    raise ConnectionLostError(f"{command}: connection lost before the reply") from None
            finally:
                self._pending.pop(cid, None)

    # ---------------------------------------------------------------------------------------
    # Subscriptions

    async def subscribe(self, channels: str | Sequence[str], *, initial: bool = False,
                        recover: bool | Position | Mapping[str, Position] = True,
                        max_rate_hz: float | None = None,
                        deadband: float | Mapping[str, float] | None = None,
                        delta: Literal["fossil"] | None = None, filter: Mapping[str, Any] | None = None,
                        gaps: GapMode | None = None, yield_gaps: bool = False, partial: bool = False,
                        timeout: float | None = None) -> Subscription:
        """Subscribes to one channel or several; returns once each has its first result.

        - `initial`: start with the channel's latest publication.
        - `recover`: after a reconnect (or when the server drops and re-offers the channel)
          resume from the last position, recovered publications first; a `Position` (or a
          mapping channel → Position) also resumes from there now. False: resume with the
          latest value instead, skipping what was missed.
        - `max_rate_hz`, `deadband` (a number: `{"abs": x}`; or `{"abs": x}` / `{"pct": p}`):
          server-side sampling for this subscriber (docs/protocol.md, "Sampling").
        - `delta="fossil"`: the server sends live publications as Fossil deltas of the previous
          one; they are delivered rebuilt, as without it.
        - `filter`: only publications whose tags match, live and recovered: leaves `{"key",
          "cmp", "val"}` (`vals` for `in` / `nin`), nodes `{"op": "and"|"or"|"not", "nodes"}`.
          Holes in the offsets delivered are then no `Gap`.
        - `gaps`: how a `Gap` (publications lost for good) reaches the iterator, besides
          `after_gap` on the first publication after it: `"raise"` (iterate again to go on),
          `"yield"` (an item), `"mark"` (only on that publication). Default: `"mark"` for point
          channels, which keep no history and whose latest value is what counts, `"raise"`
          for the others; `yield_gaps=True` is `gaps="yield"`.
        - A channel refused for good raises its typed `ReplyError` (with `errors` naming every
          refused channel) and unsubscribes the others — unless `partial`, which keeps them and
          lists the refusals in `sub.errors`. A channel refused with 503 (its broker shard is
          failing over) is retried in the background with a jittered backoff (`sub.waiting`).
        """
        names = [channels] if isinstance(channels, str) else list(channels)
        if not names or len(set(names)) != len(names):
            raise ValueError("channels must be distinct and at least one")
        if gaps is not None and gaps not in GAP_MODES:
            raise ValueError(f"gaps must be one of {', '.join(GAP_MODES)}")
        for ch in names:
            if ch in self._entries:
                raise ConflictError(409, "already subscribed by this client", ch)
        sampling: dict[str, Any] = {}
        if max_rate_hz is not None:
            sampling["max_rate_hz"] = max_rate_hz
        if deadband is not None:
            sampling["deadband"] = dict(deadband) if isinstance(deadband, Mapping) else {"abs": deadband}
        if delta is not None:
            sampling["delta"] = delta
        if filter is not None:
            sampling["filter"] = dict(filter)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._command_timeout if timeout is None else timeout)
        await self._wait_connected(deadline)
        modes: dict[str, GapMode] = {
            ch: gaps or ("yield" if yield_gaps else "mark" if self._is_point_channel(ch) else "raise")
            for ch in names}
        sub = Subscription(names, modes, self._unsubscribe)
        sub._ready = loop.create_future()
        sub._unsettled = len(names)
        for ch in names:
            start: Position | None = None
            if isinstance(recover, Position):
                start = recover
            elif isinstance(recover, Mapping):
                start = recover.get(ch)
            e = Entry(ch, sub, recover=recover is not False, initial=initial, start=start, sampling=sampling,
                      gap_mode=modes[ch])
            sub._entries[ch] = e
            self._entries[ch] = e
        self._subs.add(sub)
        self._schedule_flush()
        try:
            await asyncio.wait_for(asyncio.shield(sub._ready), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            await self._unsubscribe(sub)
            more = " …" if len(names) > 1 else ""
            raise CommandTimeoutError(f"subscribe {names[0]}{more}: no reply") from None
        if self._fatal is not None:
            raise self._fatal
        if sub.errors and (not partial or len(sub.errors) == len(names)):
            await sub.unsubscribe()
            first = next(iter(sub.errors.values()))
            first.errors = dict(sub.errors)
            raise first
        return sub

    async def _unsubscribe(self, sub: Subscription) -> None:
        sub._finish(StopAsyncIteration())
        self._subs.discard(sub)
        gone: list[str] = []
        for ch, e in list(sub._entries.items()):
            if self._entries.get(ch) is e:
                del self._entries[ch]
                if e.status in (SENDING, SUBSCRIBED):
                    gone.append(ch)
            e.status = ERROR
        ws = self._ws
        if gone and ws is not None:
            # No id: no reply on success (an error would come back with id 0 and be logged).
            try:
                await ws.send(self._codec.encode({"unsubscribe": {"channels": gone}}))
            except ConnectionClosed:
                pass

    # ---------------------------------------------------------------------------------------
    # Commands (publish, history, ...: commands.py)

    async def trend(self, channel: str, window_s: int = 3600, *, step_s: int | None = None,
                    until_ms: int | None = None, as_frame: bool = False, timeout: float | None = None) -> Any:
        """The downsampled trend of a point channel over the `window_s` seconds before
        `until_ms` (unix ms; now when None, a zoom into history otherwise): a `Trend` (list of
        `Bucket`, oldest first, with the `tiers` the namespace keeps), or with `as_frame` a
        pandas DataFrame. Read over the node's HTTP API with this client's credentials."""
        url = self.info.url if self.info is not None else self.urls[self._url_index]
        t = self._command_timeout if timeout is None else timeout
        got: Trend = await fetch_trend(http_base(url), channel, window_s, step_s,
                                       self._creds.http_headers(), t, self._ssl, until_ms)
        return trend_frame(got) if as_frame else got
