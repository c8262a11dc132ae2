"""The request/reply commands of a connection (docs/protocol.md, "Commands"): publish, history,
presence, ping, refresh, the alarm commands, and any other by name. `Client` provides the
connection they go over (`_request`) and inherits them."""

from __future__ import annotations

from typing import Any, Mapping

from .types import History, Position, PresenceClient, Publication, PublishResult


class Commands:
    """The commands of `Client`, on top of its `_request`."""

    async def _request(self, command: str, body: dict[str, Any], *, timeout: float | None = None,
                       retry: bool = False) -> Any:
        """Sends a command and returns its `ok` body (`Client._request`)."""
        raise NotImplementedError

    async def publish(self, channel: str, data: Any, *, tags: Mapping[str, str] | None = None,
                      idempotency_key: str | None = None, timeout: float | None = None) -> PublishResult:
        """Publishes `data` (the namespace must allow client publishing), with the
        publication's `tags` (what subscriptions' `filter` compares) if given. With an
        `idempotency_key` a connection lost before the reply sends it again (the server
        answers the first result); without one that raises `ConnectionLostError`."""
        body: dict[str, Any] = {"channel": channel, "data": data}
        if tags is not None:
            body["tags"] = dict(tags)
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        r = await self._request("publish", body, timeout=timeout, retry=idempotency_key is not None)
        if r.get("written"):
            return PublishResult(offset=None, epoch=None, source=str(r.get("source", "")))
        return PublishResult(offset=r["offset"], epoch=r["epoch"])

    async def history(self, channel: str, *, limit: int | None = None, since: Position | None = None,
                      timeout: float | None = None) -> History:
        """Publications of `channel`, oldest first: the newest `limit` ones, or those after
        `since`. Replies the server cut at its byte budget (`more`) are read on until `limit`."""
        pubs: list[Publication] = []
        complete = True
        while True:
            body: dict[str, Any] = {"channel": channel}
            if limit is not None:
                body["limit"] = limit - len(pubs)
            if since is not None:
                body["since"] = {"epoch": since.epoch, "offset": since.offset}
            r = await self._request("history", body, timeout=timeout, retry=True)
            epoch = r["epoch"]
            page = [Publication(p["ch"], p["off"], p.get("data"), epoch, historical=p.get("hist") is True,
                                tags=p.get("tags")) for p in r["publications"]]
            pubs.extend(page)
            complete = complete and r.get("complete", True) is not False
            if not r.get("more") or not page or (limit is not None and len(pubs) >= limit):
                return History(pubs, epoch, r["offset"], complete)
            since = Position(epoch, page[-1].offset)

    async def presence(self, channel: str, *, timeout: float | None = None) -> list[PresenceClient]:
        """Who is subscribed to `channel` (namespaces with presence)."""
        r = await self._request("presence", {"channel": channel}, timeout=timeout, retry=True)
        return [PresenceClient(c.get("client", ""), c.get("user", "")) for c in r["clients"]]

    async def ping(self, data: Any = None, *, timeout: float | None = None) -> Any:
        """A round trip through the node; returns `data` as echoed."""
        return (await self._request("ping", {"data": data}, timeout=timeout, retry=True)).get("data")

    async def request(self, command: str, body: Mapping[str, Any], *, timeout: float | None = None) -> Any:
        """Sends any command (`{"id", command: body}`) and returns its `ok` body, or raises the
        typed error of its refusal: for commands this client has no method for."""
        return await self._request(command, dict(body), timeout=timeout)

    async def refresh(self, token: str) -> int:
        """Hands the node a new token for this connection (same `sub`); its expiry (unix s)."""
        return int((await self._request("refresh", {"token": token}))["expires"])

    async def ack(self, alarm: str, comment: str | None = None) -> dict[str, Any]:
        """Acknowledges `alarm` as this connection's user; its new state (docs/alarms.md)."""
        return await self._alarm("alarm_ack", {"alarm": alarm, "comment": comment})

    async def shelve(self, alarm: str, for_s: float, comment: str | None = None) -> dict[str, Any]:
        """Shelves `alarm` for `for_s` seconds (1 to 86,400); its new state."""
        return await self._alarm("alarm_shelve", {"alarm": alarm, "for_s": for_s, "comment": comment})

    async def unshelve(self, alarm: str, comment: str | None = None) -> dict[str, Any]:
        """Ends the shelf of `alarm`; its new state."""
        return await self._alarm("alarm_unshelve", {"alarm": alarm, "comment": comment})

    async def _alarm(self, command: str, body: dict[str, Any]) -> dict[str, Any]:
        return dict(await self._request(command, {k: v for k, v in body.items() if v is not None}))
