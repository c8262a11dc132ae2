"""The Python client package `switchboard_client` (clients/python) against the real binary:
commands and subscriptions in JSON and MessagePack, recovery across a node restart and a node
killed on a shared Redis (every offset exactly once), gaps when Redis loses its data, typed
errors for refusals, credentials, heartbeats and the blocking wrapper. A scripted node (a
`websockets` server in this file) sends, on cue, what a real node sends only while something
fails: 503 while a broker shard fails over, 413 past a reply's budget, `unsubscribed` for one
channel of several, a new epoch, 4003.

Every wait is bounded (`sub.get(timeout=...)`); nothing asserts how long something took."""

from __future__ import annotations

import asyncio
import os
import pathlib
import socket
import threading
import time

import jwt
import msgpack
import pytest
from websockets.asyncio.server import serve

import sb
from redis_kit import redis  # noqa: F401 (the fixture)
from sb import api_publish, uniq
from switchboard_client import (AccessDeniedError, BadRequestError, Client, ConflictError, ConnectError,
                                ForbiddenError, Gap, NotFoundError, Position, TokenError,
                                TooLargeError, UnsubscribedError)
from switchboard_client import sync as sbsync

SECRET = "client-package-secret-3c1b0a9f8e7d6c5b4a39-28f7e6d5c4b3"
API_KEY = "client-package-api-key-9a8b7c6d5e4f"
PASSWORD = "client-package-password-1f2e3d"
WAIT = 20.0  # bound of every wait for a publication


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 90))


async def take(sub, n: int, timeout: float = WAIT) -> list:
    return [await sub.get(timeout) for _ in range(n)]


async def until(what: str, cond, limit: float = WAIT) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def wait_ready(srv: sb.Server, limit: float = 20) -> None:
    sb.wait_until("readyz 200", lambda: sb.api_get(srv, "/readyz").status == 200, limit)


def token(**claims) -> str:
    body = {"sub": "cp-user", "exp": int(time.time()) + 600}
    body.update(claims)
    return jwt.encode(body, SECRET, algorithm="HS256")


def key_publish(srv: sb.Server, channel: str, data) -> dict:
    r = sb.http("POST", srv.http_url + "/api/publish", {"channel": channel, "data": data},
                headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status == 200, (r.status, r.body)
    return r.json()


# --------------------------------------------------------------------------------------------
# Commands and subscriptions


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_client_subscribe_publish_history_presence(server, fmt):
    ch = uniq("room:cp-")

    async def main():
        api_publish(server, ch, {"text": "before"})
        async with Client(server.ws_url, format=fmt, name="cp-test/1") as c:
            assert c.info is not None and c.info.url == server.ws_url
            sub = await c.subscribe(ch, initial=True)
            first = await sub.get(WAIT)
            assert (first.channel, first.offset, first.data) == (ch, 1, {"text": "before"})
            res = await c.publish(ch, {"text": "hi", "n": [1, 2.5, None, True]})
            assert res.offset == 2 and res.epoch == first.epoch and not res.written
            api_publish(server, ch, {"text": "over http"})
            got = await take(sub, 2)
            assert [(p.offset, p.data) for p in got] == [(2, {"text": "hi", "n": [1, 2.5, None, True]}),
                                                         (3, {"text": "over http"})]
            assert sub.position() == Position(first.epoch, 3)
            hist = await c.history(ch, limit=10)
            assert [p.offset for p in hist] == [1, 2, 3] and hist.epoch == first.epoch and hist.complete
            assert [p.data["text"] for p in await c.history(ch, limit=2)] == ["hi", "over http"]
            assert [p.offset for p in await c.history(ch, since=Position(first.epoch, 2))] == [3]
            who = await c.presence(ch)
            assert [w.client for w in who] == [c.info.client]
            assert await c.ping({"x": 1}) == {"x": 1}
            with pytest.raises(ConflictError):
                await c.subscribe(ch)
            await sub.unsubscribe()
            assert await c.presence(ch) == []
            assert [p async for p in sub] == [], "iteration ends after unsubscribe"
        async with Client(server.ws_url, format=fmt) as again:  # resumes from a saved position
            resumed = await again.subscribe(ch, recover=Position(first.epoch, 1))
            assert [(p.offset, p.epoch) for p in await take(resumed, 2)] == [(2, first.epoch), (3, first.epoch)]

    run(main())


def test_client_trend_of_a_point_channel(server):
    ch = uniq("pt:cp-")

    async def main():
        async with Client(server.ws_url) as c:
            sub = await c.subscribe(ch)
            for v in (1.5, -2.0, 4.25):
                api_publish(server, ch, {"v": v, "q": "good"})
            api_publish(server, ch, {"v": "text"})  # not numeric: no trend
            got = await take(sub, 1)
            assert got[0].channel == ch
            trend = await c.trend(ch, window_s=60)
            assert sum(b.n for b in trend) == 3 and trend.step_s == 1
            assert min(b.min for b in trend) == -2.0 and max(b.max for b in trend) == 4.25
            assert trend[-1].last == 4.25
            coarse = await c.trend(ch, window_s=60, step_s=60)
            assert coarse.step_s == 60 and sum(b.n for b in coarse) == 3
            with pytest.raises(NotFoundError) as e:
                await c.trend(uniq("room:cp-"), window_s=60)
            assert e.value.code == 404
            with pytest.raises(BadRequestError) as e:
                await c.trend(ch, window_s=0)
            assert "window_s" in e.value.message

    run(main())


def test_client_trend_as_a_pandas_frame(server):
    pd = pytest.importorskip("pandas")
    ch = uniq("pt:cp-")
    for v in (1.0, 3.0):
        api_publish(server, ch, {"v": v})
    with sbsync.Client(server.ws_url) as c:
        frame = c.trend(ch, window_s=60, as_frame=True)
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == ["min", "max", "last", "n"]
    assert frame["n"].sum() == 2 and frame["max"].max() == 3.0


def test_client_sampling_options_and_several_channels(server):
    band, fast = uniq("cp-band."), uniq("cp-fast.")

    async def main():
        async with Client(server.ws_url) as c:
            sub = await c.subscribe(band, deadband=10)
            for v in (1.0, 2.0, 50.0):  # 2.0 moved less than the band from 1.0
                api_publish(server, band, v)
            got = await take(sub, 2)
            assert [(p.offset, p.data) for p in got] == [(1, 1.0), (3, 50.0)]
            both = await c.subscribe([fast, uniq("cp-other.")], max_rate_hz=1000)
            api_publish(server, fast, "x")
            assert (await both.get(WAIT)).data == "x"
            with pytest.raises(BadRequestError) as e:
                await c.subscribe(uniq("cp-bad."), max_rate_hz=-1)
            assert e.value.code == 400 and "max_rate_hz" in e.value.message

    run(main())


def test_client_refusals_raise_typed_errors_with_the_servers_code(server):
    async def main():
        async with Client(server.ws_url) as c:
            with pytest.raises(NotFoundError) as e:
                await c.request("frobnicate", {})
            assert e.value.code == 404 and "frobnicate" in e.value.message
            with pytest.raises(ForbiddenError) as e:
                await c.publish(uniq("cp-plain."), 1)  # the default namespace takes no client publishes
            assert e.value.code == 403
            with pytest.raises(BadRequestError) as e:
                await c.subscribe(["bad name!", uniq("cp-fine.")])
            assert e.value.channel == "bad name!" and set(e.value.errors) == {"bad name!"}
            with pytest.raises(NotFoundError):
                await c.history(uniq("room:never-"))
            with pytest.raises(TooLargeError) as e:  # refused before the node would close (1009)
                await c.publish(uniq("room:cp-"), "x" * 70_000)
            assert e.value.code == 413
            assert await c.ping() is None, "the connection survives every refusal"

    run(main())


# --------------------------------------------------------------------------------------------
# Recovery


def test_client_recovers_every_publication_across_a_node_restart_on_redis(switchboard_bin, start_server,
                                                                         redis_url, tmp_path):
    port, ch = sb.free_port(), uniq("room:cp-restart-")
    args = ["--broker", redis_url]
    started: list[sb.Server] = []
    try:
        node = sb.start_on_port(switchboard_bin, port, args, str(tmp_path / "a.log"))
        started.append(node)
        other = start_server(*args)  # publishes while the node is down

        async def main():
            nonlocal node
            async with Client(node.ws_url, backoff_max=1.0) as c:
                sub = await c.subscribe(ch)
                for i in range(1, 11):
                    api_publish(node, ch, {"i": i})
                got = await take(sub, 10)
                first_client = c.info.client
                node.terminate()  # graceful: 4000, reconnect
                node.proc.wait(timeout=30)
                for i in range(11, 21):
                    api_publish(other, ch, {"i": i})
                node = sb.start_on_port(switchboard_bin, port, args, str(tmp_path / "a2.log"))
                started.append(node)
                got += await take(sub, 10)
                assert c.info.client != first_client and c.stats["reconnects"] == 1
                for i in range(21, 31):
                    api_publish(node, ch, {"i": i})
                got += await take(sub, 10)
                assert [p.offset for p in got] == list(range(1, 31))
                assert [p.data["i"] for p in got] == list(range(1, 31))
                assert sub.pending == 0 and c.stats["gaps"] == 0

        run(main())
    finally:
        for s in started:
            s.kill()


def test_client_resumes_on_the_other_node_when_one_is_killed(start_server, redis_url):
    a = start_server("--broker", redis_url)
    b = start_server("--broker", redis_url)
    ch = uniq("room:cp-kill-")

    async def main():
        async with Client([a.ws_url, b.ws_url], backoff_max=1.0) as c:
            assert c.info.url == a.ws_url
            sub = await c.subscribe(ch)
            for i in range(1, 21):
                api_publish(b, ch, i)
            got = await take(sub, 20)
            a.kill()  # SIGKILL by PID: no disconnect message, no close frame
            for i in range(21, 41):
                api_publish(b, ch, i)
            got += await take(sub, 20)
            assert c.info.url == b.ws_url
            for i in range(41, 61):
                api_publish(b, ch, i)
            got += await take(sub, 20)
            assert [p.offset for p in got] == list(range(1, 61)), "every offset once, in order"
            assert [p.data for p in got] == list(range(1, 61))
            assert c.stats["reconnects"] == 1 and c.stats["gaps"] == 0

    run(main())


def test_client_raises_a_gap_when_redis_lost_the_history(start_server, redis):  # noqa: F811
    srv = start_server("--broker", redis.url)
    wait_ready(srv)
    ch = uniq("room:cp-gap-")

    async def main():
        async with Client(srv.ws_url, backoff_max=1.0) as c:
            sub = await c.subscribe(ch)
            for i in range(1, 4):
                api_publish(srv, ch, f"old-{i}")
            old = await take(sub, 3)
            redis.kill()
            redis.start()  # empty: the channel starts a new epoch
            wait_ready(srv)
            for i in range(1, 4):
                api_publish(srv, ch, f"new-{i}")
            with pytest.raises(Gap) as gap:
                await sub.get(WAIT)
            assert gap.value.channel == ch and gap.value.epoch_changed
            assert gap.value.since == Position(old[0].epoch, 3) and gap.value.until.epoch != old[0].epoch
            new = await take(sub, 3)
            assert [(p.offset, p.data) for p in new] == [(1, "new-1"), (2, "new-2"), (3, "new-3")]
            assert {p.epoch for p in new} == {gap.value.until.epoch} and c.stats["gaps"] == 1
            # The node ended just that subscription (`unsubscribed`); the connection stayed.
            assert c.stats["resubscribes"] >= 1 and c.stats["reconnects"] == 0, c.stats

    run(main())


def test_client_stays_connected_on_a_quiet_link(start_server):
    srv = start_server("--ping-s", "1")  # silent for 3 s: closed with 4011

    async def main():
        async with Client(srv.ws_url, ping_interval=None) as c:  # only answers the node's pings
            who = c.info.client
            sub = await c.subscribe(uniq("cp-quiet."))
            await asyncio.sleep(4.5)
            assert c.connected and c.info.client == who and c.stats["reconnects"] == 0
            assert await c.ping("alive") == "alive" and sub.pending == 0

    run(main())


# --------------------------------------------------------------------------------------------
# Credentials


@pytest.fixture
def auth_node(start_server, switchboard_bin, tmp_path):
    users = tmp_path / "users"
    sb.add_user(switchboard_bin, users, "grace", PASSWORD)
    return start_server("--jwt-secret", SECRET, "--users", str(users), "--api-key", API_KEY)


def test_client_credentials_and_refusals(auth_node):
    mine = uniq("room:cp-mine.")

    async def main():
        with pytest.raises(TokenError) as e:
            await Client(auth_node.ws_url, token="not-a-token").connect()
        assert e.value.code == 4001 and "JWT" in e.value.reason
        with pytest.raises(TokenError):
            await Client(auth_node.ws_url, user="grace", password="wrong").connect()
        async with Client(auth_node.ws_url, user="grace", password=PASSWORD) as c:
            assert c.info.user == "grace"
        async with Client(auth_node.ws_url, token=token(channels=["room:cp-mine.*"])) as c:
            assert c.info.user == "cp-user" and c.info.expires is not None
            with pytest.raises(ForbiddenError) as e:
                await c.subscribe(uniq("room:cp-theirs."))
            assert e.value.code == 403
            sub = await c.subscribe([mine, uniq("pt:cp-theirs.")], partial=True)
            assert [err.code for err in sub.errors.values()] == [403]
            key_publish(auth_node, mine, "ok")
            assert (await sub.get(WAIT)).data == "ok"

    run(main())


def test_client_token_provider_refreshes_before_expiry_and_a_lapsed_token_ends(auth_node):
    ch = uniq("room:cp-refresh.")
    issued: list[int] = []

    def provider() -> str:
        issued.append(int(time.time()) + 3)
        return token(exp=issued[-1])

    async def main():
        async with Client(auth_node.ws_url, token_provider=provider) as kept, \
                Client(auth_node.ws_url, token=token(exp=int(time.time()) + 3)) as lapsed:
            sub = await kept.subscribe(ch)
            doomed = await lapsed.subscribe(ch)
            with pytest.raises(TokenError) as e:
                await doomed.get(WAIT)  # the node closes it at exp: 4001, no reconnect
            assert e.value.code == 4001 and "expired" in e.value.reason
            await until("a token past the first one's expiry", lambda: time.time() > issued[0] + 1.5)
            key_publish(auth_node, ch, "after the first expiry")
            assert (await sub.get(WAIT)).data == "after the first expiry"
            assert len(issued) >= 2 and kept.stats["reconnects"] == 0, "refreshed, never reconnected"

    run(main())


# --------------------------------------------------------------------------------------------
# Blocking wrapper


def test_client_sync_wrapper(server):
    ch = uniq("room:cp-sync-")
    api_publish(server, ch, "zero")
    with sbsync.Client(server.ws_url, format="msgpack") as c:
        sub = c.subscribe(ch, initial=True)
        assert sub.get(timeout=WAIT).data == "zero"
        assert c.publish(ch, {"k": "v"}).offset == 2
        assert sub.get(timeout=WAIT).data == {"k": "v"}
        with pytest.raises(TimeoutError):
            sub.get(timeout=0.2)
        assert [p.offset for p in c.history(ch)] == [1, 2]
        assert [p.client for p in c.presence(ch)] == [c.info.client]
        with pytest.raises(ForbiddenError):
            c.publish(uniq("cp-plain."), 1)
        api_publish(server, ch, "last")
        for pub in sub:
            assert pub.data == "last"
            break
        sub.unsubscribe()
        assert list(sub) == []
    assert not c.connected
    threads = threading.active_count()
    with pytest.raises(ConnectError):  # nothing listens there
        sbsync.Client(f"ws://127.0.0.1:{sb.free_port()}/ws", connect_timeout=1).connect()
    assert threading.active_count() == threads, "the background loop stopped with it"


# --------------------------------------------------------------------------------------------
# A scripted node: the replies a real node sends only while failing


class ScriptedConn:
    """One connection to the scripted node: the test reads the client's commands and writes
    the node's messages, several per frame as a busy node does."""

    def __init__(self, ws, fmt: str):
        self.ws, self.fmt = ws, fmt
        self.queued: list = []

    async def cmd(self) -> dict:
        while not self.queued:
            frame = await asyncio.wait_for(self.ws.recv(), WAIT)
            if self.fmt == "msgpack":
                up = msgpack.Unpacker(raw=False)
                up.feed(frame)
                self.queued.extend(up)
            else:
                self.queued.extend(sb.json.loads(p) for p in frame.split("\n") if p)
        return self.queued.pop(0)

    async def send(self, *msgs) -> None:
        if self.fmt == "msgpack":
            await self.ws.send(b"".join(msgpack.packb(m) for m in msgs))
        else:
            await self.ws.send("\n".join(sb.json.dumps(m) for m in msgs))

    async def accept(self) -> None:
        c = await self.cmd()
        assert "connect" in c, c
        await self.send({"id": c["id"], "ok": {"client": "fake-1", "node": "fake", "ping_s": 25}})


class ScriptedNode:
    def __init__(self, fmt: str):
        self.fmt = fmt
        self.conns: asyncio.Queue = asyncio.Queue()

    async def __aenter__(self):
        proto = "switchboard.v1.msgpack" if self.fmt == "msgpack" else "switchboard.v1.json"
        self.server = await serve(self._handle, "127.0.0.1", 0, subprotocols=[proto], compression=None)
        self.url = f"ws://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/ws"
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, ws):
        await self.conns.put(ScriptedConn(ws, self.fmt))
        await ws.wait_closed()

    async def accept(self) -> ScriptedConn:
        """The next connection, its `connect` answered."""
        conn = await asyncio.wait_for(self.conns.get(), WAIT)
        await conn.accept()
        return conn



def ok(epoch: str, offset: int, recovered=(), complete=True) -> dict:
    pubs = [{"ch": ch, "off": off, "data": off} for ch, off in recovered]
    return {"epoch": epoch, "offset": offset, "last": None, "recovered": pubs, "complete": complete}


def pub(ch: str, off: int) -> dict:
    return {"pub": {"ch": ch, "off": off, "data": off}}


def unsubscribed(ch: str, code: int = 4008, resubscribe: bool = True) -> dict:
    return {"unsubscribed": {"ch": ch, "code": code, "reason": "missed", "resubscribe": resubscribe}}


def error(code: int) -> dict:
    return {"error": {"code": code, "message": f"refused with {code}"}}


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_client_retries_503_and_413_and_resubscribes_unsubscribed_channels(fmt):
    async def main():
        async with ScriptedNode(fmt) as node:
            c = Client(node.url, format=fmt, connect_timeout=WAIT)
            conn = (await asyncio.gather(node.accept(), c.connect()))[0]
            async with c:
                # a streams while b's shard fails over (503, twice): b is asked again, alone.
                sub_task = asyncio.create_task(c.subscribe(["a", "b"]))
                s = await conn.cmd()
                assert s["subscribe"]["channels"] == ["a", "b"] and "recover" not in s["subscribe"]
                await conn.send({"id": s["id"], "ok": {"channels": {"a": ok("e1", 5), "b": error(503)}}},
                                pub("a", 6), pub("a", 7))
                sub = await sub_task
                for _ in range(2):
                    s = await conn.cmd()
                    assert s["subscribe"]["channels"] == ["b"]
                    if c.stats["retries_503"] < 2:
                        await conn.send({"id": s["id"], "ok": {"channels": {"b": error(503)}}})
                await conn.send({"id": s["id"], "ok": {"channels": {"b": ok("e1", 0)}}}, pub("b", 1), pub("a", 8))
                got = await take(sub, 4)
                assert [(p.channel, p.offset) for p in got] == [("a", 6), ("a", 7), ("b", 1), ("a", 8)]
                assert c.stats["retries_503"] == 2

                # 413: the reply was full; d is subscribed again in a command of its own.
                t = asyncio.create_task(c.subscribe(["c", "d"]))
                s = await conn.cmd()
                await conn.send({"id": s["id"], "ok": {"channels": {"c": ok("e1", 0), "d": error(413)}}})
                s = await conn.cmd()
                assert s["subscribe"]["channels"] == ["d"]
                await conn.send({"id": s["id"], "ok": {"channels": {"d": ok("e1", 3)}}})
                other = await t

                # unsubscribed: a is subscribed again, recovering from offset 8, on this connection.
                await conn.send(unsubscribed("a"))
                s = await conn.cmd()
                assert s["subscribe"]["channels"] == ["a"]
                assert s["subscribe"]["recover"] == {"a": {"epoch": "e1", "offset": 8}}
                await conn.send({"id": s["id"], "ok": {"channels": {"a": ok("e1", 10, [("a", 9), ("a", 10)])}}},
                                pub("a", 10), pub("a", 11))
                assert [p.offset for p in await take(sub, 3)] == [9, 10, 11], "recovered, then live, once"

                # b's shard lost its data: a new epoch; the gap comes first, then the new epoch.
                await conn.send(unsubscribed("b"))
                s = await conn.cmd()
                assert s["subscribe"]["recover"] == {"b": {"epoch": "e1", "offset": 1}}
                await conn.send({"id": s["id"], "ok": {"channels": {
                    "b": ok("e2", 2, [("b", 1), ("b", 2)], complete=False)}}})
                with pytest.raises(Gap) as gap:
                    await sub.get(WAIT)
                assert (gap.value.since, gap.value.until) == (Position("e1", 1), Position("e2", 2))
                got = await take(sub, 2)
                assert [(p.offset, p.epoch) for p in got] == [(1, "e2"), (2, "e2")]

                # A channel the node will not take back ends with its typed error; d goes on.
                await conn.send(unsubscribed("c", 4003, resubscribe=False),
                                pub("d", 4))
                with pytest.raises(UnsubscribedError) as e:
                    await other.get(WAIT)
                assert (e.value.channel, e.value.code) == ("c", 4003)
                assert (await other.get(WAIT)).offset == 4
                assert c.stats["reconnects"] == 0 and node.conns.empty(), "never reconnected"

                # A forbidden connection ends for good: every subscription raises the typed error.
                await conn.send({"disconnect": {"code": 4003, "reason": "forbidden", "reconnect": False}})
                await conn.ws.close(4003, "forbidden")
                for s in (sub, other):
                    with pytest.raises(AccessDeniedError) as e:
                        await s.get(WAIT)
                    assert e.value.code == 4003
                with pytest.raises(AccessDeniedError):
                    await c.ping()

    run(main())


def test_client_reconnects_and_recovers_when_told_to():
    """A `disconnect` with `reconnect: true` (4000 shutdown, 4008 slow consumer): the client
    comes back and resumes each channel from its position, recovered publications first."""

    async def main():
        async with ScriptedNode("json") as node:
            c = Client(node.url, backoff_max=0.5)
            conn = (await asyncio.gather(node.accept(), c.connect()))[0]
            async with c:
                t = asyncio.create_task(c.subscribe("room:x"))
                s = await conn.cmd()
                await conn.send({"id": s["id"], "ok": {"channels": {"room:x": ok("e1", 4)}}}, pub("room:x", 5))
                sub = await t
                assert (await sub.get(WAIT)).offset == 5
                await conn.send({"disconnect": {"code": 4000, "reason": "shutting down", "reconnect": True}})
                await conn.ws.close(4000, "shutting down")
                conn = await node.accept()
                s = await conn.cmd()
                assert s["subscribe"]["recover"] == {"room:x": {"epoch": "e1", "offset": 5}}
                recovered = ok("e1", 7, [("room:x", 6), ("room:x", 7)])
                await conn.send({"id": s["id"], "ok": {"channels": {"room:x": recovered}}}, pub("room:x", 8))
                assert [p.offset for p in await take(sub, 3)] == [6, 7, 8]
                assert c.stats["reconnects"] == 1

    run(main())
