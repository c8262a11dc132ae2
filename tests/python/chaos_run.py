"""A chaos run: gateway nodes on a Redis topology, clients that follow `room:` channels through
faults, a publisher with idempotency keys, and a checker that decides, from what the clients
and the publisher saw alone, whether every publication reached every client exactly once — or
the client was told it could not (SPEC §2: a `complete: false` recovery or a new epoch).

The clients speak the JSON protocol with `websockets` directly; the publisher uses
`POST /api/publish`. Nothing of the project's own clients or bookkeeping is used.

What the checker counts, per fault window (from one fault to the next):

- lost without notice: an offset of an epoch a client followed, after its subscribe point,
  never delivered to it, and no announced gap covering it. Offsets are dense per channel and
  epoch, so every integer between a client's subscribe point and the channel's last offset
  (the publisher's last answer) is expected; a client left in an older epoch than the
  channel's last one without being told has lost all of the newer epoch;
- duplicated: the same (channel, epoch, offset) delivered twice to one client;
- announced gaps: recoveries answered `complete: false` or in another epoch;
- order violations: a publication of a channel before its subscribe reply on that connection,
  an offset going backwards within an epoch; also a delivered offset that is not the one the
  publisher was answered for that publication, and one offset answered for two publications;
- disconnects by close code, and how long the close frame took after a `disconnect` message;
  `unsubscribed` pushes (one channel ended alone, the connection stays: the client subscribes
  it again with `recover`); a failed shard or Cluster primary must disconnect no client;
- recovery: per affected client, from the fault to its first delivery after it;
- healthy stall: on (client, channel) pairs the fault should not touch, the longest time
  without a delivery in the window, beside the longest time without a committed publication
  of that channel (what the publisher could do);
- publisher: attempts answered 200 / 503 / 504 / other / connection error, and the time to
  the first 200 after the fault (any channel, and a publication of an affected channel).

Run: `python tests/python/chaos_run.py --topology cluster` (short) or `--long` (the issue's
scenario); `--help` for the knobs. Prints the JSON report, exits 1 when `"pass": false`.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import signal
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos_kit  # noqa: E402
from chaos_check import check  # noqa: E402
import sb  # noqa: E402

_T0 = time.monotonic()


def progress(what: str) -> None:
    """One line on stderr per phase, so a long run shows where it is."""
    print(f"[chaos {now():7.2f}] {what}", file=sys.stderr, flush=True)


def now() -> float:
    """Seconds on the run's clock (it starts when the clients are created; the load starts at
    `Run.t_load`)."""
    return time.monotonic() - _T0


# --------------------------------------------------------------------------------------------
# Scenario
# --------------------------------------------------------------------------------------------


@dataclass
class Fault:
    at: float
    kind: str  # primary | node | sentinel | shard | latency | pause | reset
    hold: float = 0.0  # latency/pause: how long; shard: seconds until restarted empty
    arg: int = 0  # node: which node; latency: milliseconds; shard: which shard


@dataclass
class Scenario:
    name: str
    topology: str  # cluster | sentinel | shards | proxy
    faults: list
    nodes: int = 2
    clients: int = 10
    channels: int = 6
    subs: int = 0  # channels per client; 0 = all
    rate: float = 50.0
    duration: float = 20.0
    drain: float = 20.0
    stall_window: float = 10.0
    wait_close: bool = False  # after a `disconnect` message, reconnect only once the close frame came
    full_coverage: bool = True  # Cluster: `cluster-require-full-coverage` (Redis's default: yes)


def short_scenarios() -> dict:
    return {
        "cluster": Scenario("cluster", "cluster", [Fault(5, "primary"), Fault(12, "node", arg=1)],
                            duration=18),
        "sentinel": Scenario("sentinel", "sentinel", [Fault(5, "sentinel"), Fault(12, "node", arg=1)],
                             duration=18),
        "shards": Scenario("shards", "shards", [Fault(5, "shard", hold=2, arg=1), Fault(12, "node", arg=1)],
                           duration=18),
        "proxy": Scenario("proxy", "proxy", [Fault(4, "pause", hold=5)], duration=13),
    }


def long_scenarios() -> dict:
    big = dict(clients=50, channels=20, rate=200.0, duration=60.0, drain=30.0)
    return {
        "cluster": Scenario("cluster-long", "cluster", [Fault(15, "primary"), Fault(35, "node", arg=1)], **big),
        "sentinel": Scenario("sentinel-long", "sentinel", [Fault(15, "sentinel"), Fault(35, "node", arg=1)], **big),
        "shards": Scenario("shards-long", "shards", [Fault(15, "shard", hold=3, arg=1), Fault(35, "node", arg=1)],
                           **big),
        "proxy": Scenario("proxy-long", "proxy", [Fault(10, "latency", hold=5, arg=300), Fault(25, "pause", hold=5),
                                                  Fault(40, "reset")], **big),
    }


# --------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------


class ChanState:
    """One client's view of one channel: the epoch and last offset it processed, the spans of
    offsets it followed (epoch, start exclusive, end inclusive or None while open), and every
    delivery (time, epoch, offset, publication id, how, connection)."""

    def __init__(self):
        self.epoch: str | None = None
        self.last = 0
        self.spans: list = []
        self.seen: dict = {}
        self.deliveries: list = []


class Client:
    def __init__(self, run: "Run", cid: int, channels: list):
        self.run, self.cid, self.channels = run, cid, channels
        self.ch = {c: ChanState() for c in channels}
        self.conns: list = []  # [t_open, t_end, node, conn number]
        self.violations: list = []
        self.gaps: list = []
        self.disconnects: list = []
        self.unsubscribes: list = []  # `unsubscribed` pushes: {t, node, conn, channel, code}
        self.sub_errors: dict = {}
        self.pubs_after_disconnect = 0
        self.stopping = False
        self.ws = None
        self.watchers: set = set()

    def violation(self, kind: str, **kw) -> None:
        self.violations.append({"kind": kind, "client": self.cid, "t": round(now(), 3), **kw})

    async def main(self) -> None:
        attempt = 0
        for _ in range(100000):  # bounded: one connection per pass
            if self.stopping:
                return
            live = self.run.nodes.live()
            if not live:
                await asyncio.sleep(0.2)
                continue
            node, srv = live[(self.cid + attempt) % len(live)]
            attempt += 1
            try:
                ws = await ws_connect(srv.ws_url, open_timeout=3, ping_interval=None, close_timeout=1,
                                      max_size=None, compression=None, proxy=None,
                                      subprotocols=[sb.JSON_PROTOCOL])
            except Exception:
                await asyncio.sleep(min(1.0, 0.1 * attempt))
                continue
            attempt = 0
            entry = [now(), None, node, len(self.conns)]
            self.conns.append(entry)
            try:
                await self.session(ws, node, entry[3])
            finally:
                entry[1] = now()
            if not self.stopping:
                await asyncio.sleep(0.05 + random.random() * 0.1)

    async def session(self, ws, node: int, conn_no: int) -> None:
        self.ws = ws
        subscribed: dict = {}  # channel -> epoch of its reply on this connection
        pending: dict = {}  # command id -> {channel: recover position or None}
        next_id = [0]
        waiting: set = set()  # channels to subscribe again (refused for now, or ended by the server)
        retry_task = None

        async def subscribe(channels: list) -> None:
            next_id[0] += 1
            recover, sent = {}, {}
            for c in channels:
                st = self.ch[c]
                if st.epoch is not None:
                    recover[c] = {"epoch": st.epoch, "offset": st.last}
                    sent[c] = (st.epoch, st.last)
                else:
                    sent[c] = None
            pending[next_id[0]] = sent
            body = {"channels": channels}
            if recover:
                body["recover"] = recover
            await ws.send(json.dumps({"id": next_id[0], "subscribe": body}))

        async def retry() -> None:
            await asyncio.sleep(0.2 + random.random() * 0.3)
            channels = sorted(waiting)
            waiting.clear()
            await subscribe(channels)

        def again(channels) -> None:
            nonlocal retry_task
            waiting.update(channels)
            if retry_task is None or retry_task.done():
                retry_task = asyncio.ensure_future(retry())

        try:
            await subscribe(list(self.channels))
            while not self.stopping:
                frame = await ws.recv()
                t = now()
                for line in frame.split("\n"):
                    if not line:
                        continue
                    m = json.loads(line)
                    if "pub" in m:
                        p = m["pub"]
                        c = p["ch"]
                        if c not in subscribed:
                            self.violation("pub_before_reply", channel=c, offset=p["off"], node=node, conn=conn_no,
                                           data=p.get("data"))
                            continue
                        self.deliver(c, subscribed[c], p["off"], p.get("data"), t, "live", conn_no)
                    elif "id" in m and m["id"] in pending:
                        sent = pending.pop(m["id"])
                        if "error" in m:
                            code = m["error"].get("code")
                            self.sub_errors[code] = self.sub_errors.get(code, 0) + 1
                            failed = list(sent)
                        else:
                            failed = []
                            for c, r in m["ok"]["channels"].items():
                                if "error" in r:
                                    code = r["error"].get("code")
                                    self.sub_errors[code] = self.sub_errors.get(code, 0) + 1
                                    failed.append(c)
                                    continue
                                self.apply_reply(c, r, sent.get(c), t, node, conn_no)
                                subscribed[c] = r["epoch"]
                        if failed:
                            again(failed)
                    elif "unsubscribed" in m:
                        u = m["unsubscribed"]
                        self.unsubscribes.append({"t": t, "node": node, "conn": conn_no, "channel": u["ch"],
                                                  "code": u.get("code")})
                        subscribed.pop(u["ch"], None)
                        again([u["ch"]])
                    elif "disconnect" in m:
                        d = m["disconnect"]
                        rec = {"t": t, "node": node, "conn": conn_no, "code": d.get("code"),
                               "reason": d.get("reason"), "close_code": None, "close_after_s": None}
                        self.disconnects.append(rec)
                        if self.run.sc.wait_close:
                            await self.watch_close(ws, rec)
                            return
                        w = asyncio.ensure_future(self.watch_close(ws, rec))
                        self.watchers.add(w)
                        w.add_done_callback(self.watchers.discard)
                        return
        except ConnectionClosed as e:
            if self.stopping:
                return
            code = e.rcvd.code if e.rcvd is not None else 1006
            self.disconnects.append({"t": now(), "node": node, "conn": conn_no, "code": None,
                                     "reason": e.rcvd.reason if e.rcvd is not None else "no close frame",
                                     "close_code": code, "close_after_s": None})
        except (OSError, asyncio.IncompleteReadError) as e:
            if self.stopping:
                return
            self.disconnects.append({"t": now(), "node": node, "conn": conn_no, "code": None, "reason": repr(e),
                                     "close_code": 1006, "close_after_s": None})
        finally:
            if retry_task is not None:
                retry_task.cancel()
            if self.stopping:
                await ws.close()

    async def watch_close(self, ws, rec: dict) -> None:
        """After a `disconnect` message: how long until the close frame (the client has already
        moved on; anything arriving meanwhile is not processed, only counted)."""
        try:
            async with asyncio.timeout(20):
                while True:
                    frame = await ws.recv()
                    self.pubs_after_disconnect += frame.count('{"pub"')
        except ConnectionClosed as e:
            rec["close_code"] = e.rcvd.code if e.rcvd is not None else 1006
            rec["close_after_s"] = round(now() - rec["t"], 3)
        except (TimeoutError, asyncio.TimeoutError):
            rec["close_code"] = "none within 20 s"
            await ws.close()
        except Exception as e:
            rec["close_code"] = repr(e)

    def apply_reply(self, c: str, r: dict, sent, t: float, node: int, conn_no: int) -> None:
        st = self.ch[c]
        epoch, offset = r["epoch"], r["offset"]
        rec = r.get("recovered") or []
        complete = r.get("complete", True)
        if sent is None:
            st.spans.append([epoch, offset, None, t, "subscribe"])
            st.epoch, st.last = epoch, offset
            if rec:
                self.violation("recovered_without_recover", channel=c, offsets=[p["off"] for p in rec][:10])
        else:
            e0, o0 = sent
            if not (complete and epoch == e0):
                start = rec[0]["off"] - 1 if rec else offset
                if complete:
                    self.violation("epoch_change_complete_true", channel=c, from_epoch=e0, to_epoch=epoch)
                self.gaps.append({"t": round(t, 3), "client": self.cid, "channel": c, "node": node,
                                  "conn": conn_no, "from": [e0, o0], "to": [epoch, start],
                                  "reply_offset": offset, "complete": complete,
                                  "new_epoch": epoch != e0})
                if st.spans:
                    st.spans[-1][2] = st.last
                st.spans.append([epoch, start, None, t, "told"])
                st.epoch, st.last = epoch, start
        for p in rec:
            self.deliver(c, epoch, p["off"], p.get("data"), t, "recovered", conn_no)

    def deliver(self, c: str, epoch: str, off: int, data, t: float, how: str, conn_no: int) -> None:
        st = self.ch[c]
        pid = data.get("id") if isinstance(data, dict) else None
        key = (epoch, off)
        first = st.seen.get(key)
        if first is not None:
            self.violation("duplicate", channel=c, epoch=epoch, offset=off, pid=pid, how=how, conn=conn_no,
                           first_t=round(first, 3))
        else:
            st.seen[key] = t
            if epoch == st.epoch and off <= st.last:
                self.violation("backwards", channel=c, epoch=epoch, offset=off, last=st.last, how=how, conn=conn_no)
        st.deliveries.append((t, epoch, off, pid, how, conn_no))
        if epoch == st.epoch and off > st.last:
            st.last = off

    def node_at(self, t: float):
        for t_open, t_end, node, _ in self.conns:
            if t_open <= t and (t_end is None or t < t_end):
                return node
        return None


# --------------------------------------------------------------------------------------------
# Publisher
# --------------------------------------------------------------------------------------------


class HttpPool:
    """Keep-alive HTTP/1.1 connections to one node, for POSTs of JSON (a plain client: a
    general one's pool bookkeeping grows with the requests queued behind a failover)."""

    def __init__(self, port: int, limit: int = 256):
        self.port = port
        self.free: list = []
        self.sem = asyncio.Semaphore(limit)

    async def post(self, path: str, body: dict, timeout: float):
        raw = json.dumps(body, separators=(",", ":")).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(raw)}\r\n\r\n").encode()
        async with self.sem:
            for fresh in (False, True):  # a kept connection the node closed meanwhile: once more, new
                conn = None if fresh or not self.free else self.free.pop()
                reused = conn is not None
                if conn is None:
                    conn = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 3)
                r, w = conn
                try:
                    w.write(head + raw)
                    await w.drain()
                    async with asyncio.timeout(timeout):
                        status_line = await r.readline()
                        if not status_line:
                            raise ConnectionResetError("closed before the status line")
                        status = int(status_line.split()[1])
                        headers = {}
                        while True:
                            line = await r.readline()
                            if line in (b"\r\n", b""):
                                break
                            k, _, v = line.decode("latin-1").partition(":")
                            headers[k.strip().lower()] = v.strip()
                        if "content-length" in headers:
                            data = await r.readexactly(int(headers["content-length"]))
                        elif headers.get("transfer-encoding", "").lower() == "chunked":
                            data = b""
                            while True:
                                n = int((await r.readline()).split(b";")[0], 16)
                                chunk = await r.readexactly(n + 2)
                                if n == 0:
                                    break
                                data += chunk[:-2]
                        else:
                            data = await r.read()
                            headers["connection"] = "close"
                except (ConnectionResetError, asyncio.IncompleteReadError, BrokenPipeError) as e:
                    w.transport.abort()
                    if reused and isinstance(e, ConnectionResetError) and "status line" in str(e):
                        continue
                    raise
                except BaseException:
                    w.transport.abort()
                    raise
                if headers.get("connection", "").lower() == "close":
                    w.transport.abort()
                else:
                    self.free.append(conn)
                return status, data
        raise ConnectionResetError("unreachable")


class Publisher:
    def __init__(self, run: "Run"):
        self.run = run
        self.records: list = []
        self.late_max = 0.0
        self.tasks: set = set()

    async def main(self, t_end: float) -> None:
        channels, rate = self.run.channels, self.run.sc.rate
        pools: dict = {}
        if True:
            start = now()
            i = 0
            while True:
                due = start + i / rate
                if due >= t_end:
                    break
                wait = due - now()
                if wait > 0:
                    await asyncio.sleep(wait)
                else:
                    self.late_max = max(self.late_max, -wait)
                rec = {"seq": i, "ch": channels[i % len(channels)], "t_due": due, "attempts": [],
                       "answer": None, "t_ok": None}
                self.records.append(rec)
                task = asyncio.ensure_future(self.publish(pools, rec))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
                i += 1
            if self.tasks:
                await asyncio.wait(list(self.tasks), timeout=120)

    async def publish(self, pools: dict, rec: dict) -> None:
        body = {"channel": rec["ch"], "data": {"id": rec["seq"], "t": round(now(), 3)},
                "idempotency_key": f"{self.run.run_id}-{rec['seq']}"}
        for a in range(60):  # bounded; each attempt is bounded by the client's 15 s timeout
            live = self.run.nodes.live()
            # round-robin over the live nodes, a channel's publications alternating between them
            node, srv = live[(rec["seq"] + rec["seq"] // len(self.run.channels) + a) % len(live)]
            t_send = now()
            pool = pools.get(node)
            if pool is None:
                pool = pools[node] = HttpPool(srv.port)
            try:
                status, data = await pool.post("/api/publish", body, 15.0)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, asyncio.TimeoutError) as e:
                status, data = "conn", None
                err = type(e).__name__
            t_ans = now()
            att = [round(t_send, 3), round(t_ans, 3), node, status]
            if status == "conn":
                att.append(err)
            elif status != 200:
                att.append(data[:200].decode("utf-8", "replace"))
            rec["attempts"].append(att)
            if status == 200:
                ans = json.loads(data)
                rec["answer"] = (ans["epoch"], ans["offset"])
                rec["t_ok"] = t_ans
                return
            await asyncio.sleep(0.2 if status in (503, 504, "conn") else 0.5)


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


class Run:
    def __init__(self, sc: Scenario, log_dir: str):
        self.sc = sc
        self.log_dir = log_dir
        self.run_id = "chaos" + os.urandom(4).hex()
        self.channels = [f"room:{i}" for i in range(sc.channels)]
        self.topo = None
        self.proxy = None
        self.nodes = chaos_kit.Nodes(log_dir)
        self.clients: list = []
        self.publisher = Publisher(self)
        self.faults: list = []
        self.loop_lag: list = []
        self.t_load = 0.0
        self.t_end = 0.0
        self.t_pub_end = 0.0

    # -- setup
    def start_topology(self) -> None:
        sc = self.sc
        root = os.path.join(self.log_dir, "redis")
        os.makedirs(root, exist_ok=True)
        if sc.topology == "cluster":
            self.topo = chaos_kit.Cluster(3, 1, 2000, root=root, full_coverage=sc.full_coverage).start()
            urls = [self.topo.url] * sc.nodes
        elif sc.topology == "sentinel":
            self.topo = chaos_kit.Sentinel(root=root).start()
            urls = [self.topo.url] * sc.nodes
        elif sc.topology == "shards":
            self.topo = chaos_kit.Shards(3, root=root).start()
            urls = [self.topo.url] * sc.nodes
        elif sc.topology == "proxy":
            self.topo = chaos_kit.Single(root=root).start()
            self.proxy = chaos_kit.Proxy(self.topo.server.port)
            # node 0 reaches Redis through the proxy, the others directly
            urls = [self.proxy.url] + [self.topo.url] * (sc.nodes - 1)
        else:
            raise ValueError(f"unknown topology {sc.topology}")
        for u in urls:
            self.nodes.start(u)

    def stop(self) -> None:
        self.nodes.stop()
        if self.proxy is not None:
            self.proxy.kill()
        if self.topo is not None:
            self.topo.stop()

    # -- faults
    def affected_channels(self, f: Fault) -> set:
        if f.kind == "primary":
            return {c for c in self.channels if self.topo.primary_of(c) == f.target}
        if f.kind == "shard":
            return {c for c in self.channels if self.topo.shard_of(c) == f.arg}
        if f.kind == "sentinel":
            return set(self.channels)
        return set()

    def inject(self, f: Fault) -> dict:
        """Runs in a thread: the fault itself, then (for failovers) how long until the topology
        was whole again."""
        d = {"kind": f.kind, "at": f.at, "after_load_start_s": None}
        if f.kind == "primary":
            # the primary serving the most channels among those that are not the seed
            counts: dict = {}
            for c in self.channels:
                p = self.topo.primary_of(c)
                counts[p] = counts.get(p, 0) + 1
            seed = self.topo.nodes[0].port
            choice = max((p for p in counts if p != seed), key=lambda p: counts[p])
            f.target = choice
            d["affected"] = sorted(self.affected_channels(f), key=lambda c: int(c.split(":")[1]))
            d["t"] = now()
            self.topo.node(choice).kill()
            d["detail"] = f"kill -9 Redis Cluster primary :{choice} ({len(d['affected'])} of the channels)"
            self.faults.append(d)
            progress(d["detail"])
            try:
                d["failover_s"] = round(self.topo.wait_failover(choice, 30), 2)
            except TimeoutError as e:
                d["failover_s"] = str(e)
        elif f.kind == "sentinel":
            d["affected"] = list(self.channels)
            port = self.topo.current_primary()
            d["t"] = now()
            self.topo.kill_primary()
            d["detail"] = f"kill -9 Sentinel primary :{port}"
            self.faults.append(d)
            progress(d["detail"])
            try:
                d["failover_s"] = round(self.topo.wait_failover(port, 30), 2)
            except TimeoutError as e:
                d["failover_s"] = str(e)
        elif f.kind == "shard":
            d["affected"] = sorted(self.affected_channels(f), key=lambda c: int(c.split(":")[1]))
            d["t"] = now()
            port = self.topo.kill(f.arg)
            d["detail"] = f"kill -9 shard {f.arg} :{port}, restarted empty after {f.hold} s"
            self.faults.append(d)
            progress(d["detail"])
            time.sleep(f.hold)
            self.topo.restart(f.arg)
            d["restarted_t"] = round(now(), 3)
        elif f.kind == "node":
            d["t"] = now()
            self.nodes.kill(f.arg)
            d["detail"] = f"kill -9 gateway node n{f.arg}"
            d["node"] = f.arg
            self.faults.append(d)
            progress(d["detail"])
        elif f.kind in ("latency", "pause", "reset"):
            d["node"] = 0
            d["t"] = now()
            if f.kind == "latency":
                self.proxy.latency(f.arg)
                d["detail"] = f"+{f.arg} ms each way on node n0's Redis links for {f.hold} s"
            elif f.kind == "pause":
                self.proxy.pause()
                d["detail"] = f"node n0's Redis links paused (held open) for {f.hold} s"
            else:
                self.proxy.reset()
                d["detail"] = "node n0's Redis links reset (RST)"
            self.faults.append(d)
            progress(d["detail"])
            if f.hold:
                time.sleep(f.hold)
                if f.kind == "latency":
                    self.proxy.latency(0)
                else:
                    self.proxy.resume()
                d["ended_t"] = round(now(), 3)
        d["after_load_start_s"] = round(d["t"] - self.t_load, 3)
        d["t"] = round(d["t"], 3)
        return d

    async def run_faults(self) -> None:
        loop = asyncio.get_running_loop()
        jobs = []
        for f in self.sc.faults:
            wait = self.t_load + f.at - now()
            if wait > 0:
                await asyncio.sleep(wait)
            jobs.append(loop.run_in_executor(None, self.inject, f))
        for j in jobs:
            await j

    async def watch_loop(self, stop: asyncio.Event) -> None:
        """The checker's own event-loop lag: a stall measured while this was high may be ours."""
        while not stop.is_set():
            t = time.monotonic()
            await asyncio.sleep(0.05)
            self.loop_lag.append((now(), time.monotonic() - t - 0.05))

    async def main(self) -> None:
        global _T0
        sc = self.sc
        # one publication per channel first, so every channel has its epoch before anyone follows it
        for c in self.channels:
            srv = self.nodes.live()[0][1]
            sb.wait_until(f"first publication on {c}", lambda: sb.http(
                "POST", srv.http_url + "/api/publish", {"channel": c, "data": {"id": -1}}).status == 200, 20, 0.2)
        if sc.topology == "shards":
            self.topo.check_placement(self.channels)
        _T0 = time.monotonic()
        n = len(self.channels)
        per = sc.subs or n
        for cid in range(sc.clients):
            chs = self.channels if per >= n else [self.channels[(cid * per + j) % n] for j in range(per)]
            self.clients.append(Client(self, cid, chs))
        client_tasks = [asyncio.ensure_future(c.main()) for c in self.clients]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(st.spans for c in self.clients for st in c.ch.values()):
            await asyncio.sleep(0.1)
        self.t_load = now()
        progress(f"{len(self.clients)} clients subscribed; load starts")
        stop = asyncio.Event()
        lag = asyncio.ensure_future(self.watch_loop(stop))
        faults = asyncio.ensure_future(self.run_faults())
        await self.publisher.main(self.t_load + sc.duration)
        progress("publishing ended")
        await faults
        self.t_pub_end = now()
        # drain: until every client holds each channel's last answered position, or the bound
        final = self.final_positions()
        deadline = time.monotonic() + sc.drain
        while time.monotonic() < deadline:
            if all(st.epoch == final[ch][0] and st.last >= final[ch][1]
                   for cl in self.clients for ch, st in cl.ch.items() if ch in final):
                break
            await asyncio.sleep(0.2)
        self.t_end = now()
        progress("drained; stopping clients")
        stop.set()
        for c in self.clients:
            c.stopping = True
        for c in self.clients:
            if c.ws is not None:
                await c.ws.close()
        for t in client_tasks:
            t.cancel()
        await asyncio.gather(*client_tasks, return_exceptions=True)
        for c in self.clients:
            for w in list(c.watchers):
                w.cancel()
        await lag

    def final_positions(self) -> dict:
        """Per channel, the (epoch, offset) of its last answered publication (by answer time)."""
        out: dict = {}
        best: dict = {}
        for r in self.publisher.records:
            if r["answer"] is None:
                continue
            e, o = r["answer"]
            cur = out.get(r["ch"])
            if cur is None or (e == cur[0] and o > cur[1]) or (e != cur[0] and r["t_ok"] > best[r["ch"]]):
                out[r["ch"]] = (e, o)
                best[r["ch"]] = r["t_ok"]
        return out


def run_scenario(sc: Scenario, log_dir: str | None = None) -> dict:
    """Starts everything, runs the load and the faults, stops everything (by PID) and returns
    the checker's report."""
    own = log_dir is None
    log_dir = log_dir or tempfile.mkdtemp(prefix="sb-chaos-")
    os.makedirs(log_dir, exist_ok=True)
    run = Run(sc, log_dir)
    t_start = time.monotonic()
    try:
        run.start_topology()
        progress(f"{sc.name}: {sc.topology} and {sc.nodes} nodes up")
        asyncio.run(run.main())
    finally:
        run.stop()
    progress("checking")
    report = check(run)
    progress("checked")
    report["wall_s"] = round(time.monotonic() - t_start, 1)
    st = os.stat(chaos_kit.binary())
    report["binary"] = {"path": chaos_kit.binary(), "size": st.st_size,
                        "mtime_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime))}
    report["logs"] = None if own else log_dir
    return report


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topology", choices=["cluster", "sentinel", "shards", "proxy", "all"], default="cluster")
    ap.add_argument("--long", action="store_true", help="the issue's scenario: 50 clients x 20 channels, "
                    "200 publications/s for 60 s, faults at +15 s and +35 s")
    ap.add_argument("--clients", type=int)
    ap.add_argument("--channels", type=int)
    ap.add_argument("--subs", type=int, help="channels per client (default: all)")
    ap.add_argument("--rate", type=float)
    ap.add_argument("--duration", type=float)
    ap.add_argument("--wait-close", action="store_true", help="after a disconnect message, reconnect only "
                    "once the close frame came (as the TypeScript SDK does); default: at once")
    ap.add_argument("--full-coverage", choices=["yes", "no"], default="yes",
                    help="Cluster: cluster-require-full-coverage (no keeps the other slots writable in a failover)")
    ap.add_argument("--out", help="write the full report (every violation) to this JSON file")
    ap.add_argument("--logs", help="keep node and Redis logs in this directory")
    a = ap.parse_args(argv)
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack on stderr
    table = long_scenarios() if a.long else short_scenarios()
    names = list(table) if a.topology == "all" else [a.topology]
    reports = []
    for name in names:
        sc = table[name]
        for k in ("clients", "channels", "subs", "rate", "duration"):
            if getattr(a, k) is not None:
                setattr(sc, k, getattr(a, k))
        sc.wait_close = a.wait_close
        sc.full_coverage = a.full_coverage == "yes"
        logs = os.path.join(a.logs, name) if a.logs else None
        reports.append(run_scenario(sc, logs))
        print(json.dumps(reports[-1], indent=1, default=str), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(reports if len(reports) > 1 else reports[0], f, indent=1, default=str)
    return 0 if all(r["pass"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
