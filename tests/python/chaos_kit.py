"""Real processes for chaos runs, each stopped by its PID: a Redis Cluster, a Sentinel set,
independent shards, a TCP proxy that can slow down, pause and reset a node's Redis links, and
gateway nodes (`sb.start_server`).

Nothing here comes from the project: channel-to-slot and channel-to-shard are computed from the
documented rules (hash tag `{channel}` → CRC16 slot; jump consistent hash of FNV-1a, docs/
operations.md "Topologies") and checked against the servers where they can answer.

`python chaos_kit.py proxy LISTEN_PORT TARGET_PORT` runs the proxy alone (the `Proxy` class
starts it so): it prints `ready` and takes commands on stdin, one a line — `latency MS`,
`pause`, `resume`, `reset` — answering `ok` to each.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import sb

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def binary() -> str:
    return os.environ.get("SWITCHBOARD_BIN") or str(REPO_ROOT / "target" / "release" / "switchboard")


# --------------------------------------------------------------------------------------------
# Ports, a RESP client, a redis-server process
# --------------------------------------------------------------------------------------------

_taken: set[int] = set()


def spare_port(bus: bool = False) -> int:
    """A free loopback port not handed out before in this process; with `bus`, port + 10000
    (the cluster bus) is free too. Bounded: 200 tries."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port in _taken or (bus and port + 10000 > 65535):
            continue
        if bus:
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        _taken.add(port)
        if bus:
            _taken.add(port + 10000)
        return port
    raise RuntimeError("no spare port in 200 tries")


class RespError(Exception):
    pass


def resp(port: int, *args, timeout: float = 2.0):
    """One command to the Redis (or sentinel) on `port`; the decoded answer (str, int, list,
    None), or RespError for an error reply. A fresh connection per call: faults may kill any."""
    out = b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in (str(x).encode() for x in args))
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"*%d\r\n" % len(args) + out)
        f = s.makefile("rb")
        return _read_resp(f)


def _read_resp(f):
    line = f.readline()
    if not line:
        raise ConnectionError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RespError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        return data[:-2].decode()
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_resp(f) for _ in range(n)]
    raise ConnectionError(f"bad RESP line {line!r}")


def info_field(text: str, key: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    return None


def wait_for(what: str, cond, limit: float, every: float = 0.1):
    """Polls `cond()` (exceptions count as not yet) until truthy; bounded by `limit` seconds."""
    deadline = time.monotonic() + limit
    last = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # a server still starting or just killed
            last = e
        time.sleep(every)
    raise TimeoutError(f"timed out after {limit}s waiting for {what} (last error: {last!r})")


class RedisProc:
    """One `redis-server` (data node or sentinel) on a fixed port with its own directory, so
    that a restart comes back where the others expect it."""

    def __init__(self, root: str, name: str, args_for, bus: bool = False):
        self.port, self.bus = spare_port(bus), bus
        self.dir = os.path.join(root, f"{name}-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        self.args_for = args_for
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Starts it on its port. A first start whose port was taken meanwhile (an outgoing
        connection's source port, another process) moves to a new spare port, at most 3 times;
        a restart keeps its port, where the others expect it."""
        first = self.proc is None
        for attempt in range(4):
            log = open(os.path.join(self.dir, "redis.log"), "ab")
            self.proc = subprocess.Popen(["redis-server", *self.args_for(self)], stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, cwd=self.dir,
                                         preexec_fn=sb._die_with_parent)
            log.close()
            # Up when it answers PING; done waiting when it exited (its log says why).
            wait_for(f"redis-server :{self.port} to answer PING or exit",
                     lambda: self.proc.poll() is not None or resp(self.port, "PING") == "PONG", 10)
            if self.proc.poll() is None:
                return
            if not first or attempt == 3:
                raise RuntimeError(f"redis-server :{self.port} exited with {self.proc.returncode}; "
                                   f"see {self.dir}/redis.log")
            self.port = spare_port(self.bus)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 by PID (after SIGCONT, in case it was stopped)."""
        if self.running():
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def cmd(self, *args, timeout: float = 2.0):
        return resp(self.port, *args, timeout=timeout)

    def role(self) -> str:
        return self.cmd("ROLE")[0]


def data_args(extra: list):
    def args(r: RedisProc) -> list:
        return ["--port", str(r.port), "--bind", "127.0.0.1", "--dir", r.dir, "--save", "",
                "--appendonly", "no", "--repl-diskless-sync-delay", "0", *extra]
    return args


class Topology:
    """What every topology shares: a scratch root and the processes to kill at the end."""

    def __init__(self, root: str | None = None):
        self.own_root = root is None
        self.root = root or tempfile.mkdtemp(prefix="sb-chaos-")
        self.procs: list[RedisProc] = []

    def add(self, name: str, args_for, bus: bool = False) -> RedisProc:
        r = RedisProc(self.root, name, args_for, bus)
        self.procs.append(r)
        return r

    def stop(self) -> None:
        for r in reversed(self.procs):
            r.kill()
        if self.own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# --------------------------------------------------------------------------------------------
# Redis Cluster
# --------------------------------------------------------------------------------------------


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), the hash of Redis Cluster's key slots."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key: str) -> int:
    """The slot of `key`, hash tags honoured."""
    k = key.encode()
    i = k.find(b"{")
    if i >= 0:
        j = k.find(b"}", i + 1)
        if j > i + 1:
            k = k[i + 1:j]
    return crc16(k) % 16384


def channel_slot(channel: str) -> int:
    """A channel's keys are `<prefix>:{<channel>}:…`: the slot of the channel name."""
    return crc16(channel.encode()) % 16384


class Cluster(Topology):
    """`primaries × (1 + replicas)` cluster nodes formed with `redis-cli --cluster create`."""

    def __init__(self, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = 2000,
                 root: str | None = None, full_coverage: bool = True):
        super().__init__(root)
        self.primaries, self.replicas = primaries, replicas

        def args(r: RedisProc) -> list:
            return data_args(["--cluster-enabled", "yes", "--cluster-node-timeout", str(node_timeout_ms),
                              "--cluster-require-full-coverage", "yes" if full_coverage else "no",
                              "--cluster-config-file", os.path.join(r.dir, "nodes.conf")])(r)

        self.nodes = [self.add("cluster", args, bus=True) for _ in range(primaries * (1 + replicas))]

    def start(self) -> "Cluster":
        for n in self.nodes:
            n.start()
        try:
            proc = subprocess.run(
                ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in self.nodes],
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise RuntimeError("redis-cli not found on PATH (apt-get install redis-server)")
        if proc.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{proc.stdout.decode()[-3000:]}"
                               f"\n{proc.stderr.decode()[-2000:]}")
        wait_for("the cluster to form", self._formed, 60, every=0.2)
        ch = "room:slot-check"
        got = self.nodes[0].cmd("CLUSTER", "KEYSLOT", "sb:{" + ch + "}:m")
        assert got == channel_slot(ch), f"CRC16 slot {channel_slot(ch)} but CLUSTER KEYSLOT says {got}"
        return self

    def _formed(self) -> bool:
        total = str(len(self.nodes))
        primaries = 0
        for n in self.nodes:
            info = n.cmd("CLUSTER", "INFO")
            if info_field(info, "cluster_state") != "ok" or info_field(info, "cluster_known_nodes") != total:
                return False
            repl = n.cmd("INFO", "replication")
            if n.role() == "master":
                primaries += 1
                if info_field(repl, "connected_slaves") != str(self.replicas):
                    return False
            elif info_field(repl, "master_link_status") != "up":
                return False
        return primaries == self.primaries

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def node(self, port: int) -> RedisProc:
        return next(n for n in self.nodes if n.port == port)

    def slot_map(self) -> dict:
        """{(first, last): primary port} as the first running node answering CLUSTER NODES
        sees it."""
        for n in self.nodes:
            if not n.running():
                continue
            try:
                text = n.cmd("CLUSTER", "NODES")
            except Exception:
                continue
            out = {}
            for line in text.splitlines():
                parts = line.split()
                if len(parts) < 9 or "master" not in parts[2].split(",") or "fail" in parts[2]:
                    continue
                port = int(parts[1].split("@")[0].split(",")[0].rsplit(":", 1)[1])
                for rng in parts[8:]:
                    if rng.startswith("["):
                        continue
                    a, _, b = rng.partition("-")
                    out[(int(a), int(b or a))] = port
            return out
        raise RuntimeError("no running cluster node answers CLUSTER NODES")

    def primary_of(self, channel: str) -> int:
        slot = channel_slot(channel)
        for (a, b), port in self.slot_map().items():
            if a <= slot <= b:
                return port
        raise RuntimeError(f"no primary serves slot {slot}")

    def kill_primary_of(self, channel: str) -> int:
        """kill -9 of the primary serving `channel`'s slot; returns its port."""
        port = self.primary_of(channel)
        self.node(port).kill()
        return port

    def wait_failover(self, dead_port: int, limit: float = 30.0) -> float:
        """Seconds until every running node says cluster_state:ok and no slot is served by
        `dead_port`."""
        t0 = time.monotonic()

        def done():
            for n in self.nodes:
                if n.running() and info_field(n.cmd("CLUSTER", "INFO"), "cluster_state") != "ok":
                    return False
            return dead_port not in self.slot_map().values()

        wait_for(f"failover of :{dead_port}", done, limit, every=0.1)
        return time.monotonic() - t0


# --------------------------------------------------------------------------------------------
# Sentinel
# --------------------------------------------------------------------------------------------


class Sentinel(Topology):
    """A primary, `replicas` replicas and `sentinels` sentinels monitoring it as `name`
    (quorum s/2+1, down-after 1000 ms, failover-timeout 3000 ms, as the project's own kit)."""

    def __init__(self, replicas: int = 1, sentinels: int = 3, name: str = "main", root: str | None = None):
        super().__init__(root)
        self.name = name
        self.primary = self.add("primary", data_args([]))
        self.replica_procs = [self.add("replica", data_args(["--replicaof", "127.0.0.1", str(self.primary.port)]))
                              for _ in range(replicas)]
        quorum = sentinels // 2 + 1

        def sentinel_args(r: RedisProc) -> list:
            conf = os.path.join(r.dir, "sentinel.conf")
            if not os.path.exists(conf):
                with open(conf, "w") as f:
                    f.write(f"port {r.port}\nbind 127.0.0.1\ndir {r.dir}\n"
                            f"sentinel monitor {name} 127.0.0.1 {self.primary.port} {quorum}\n"
                            f"sentinel down-after-milliseconds {name} 1000\n"
                            f"sentinel failover-timeout {name} 3000\n"
                            f"sentinel parallel-syncs {name} 1\n")
            return [conf, "--sentinel"]

        self.sentinels = [self.add("sentinel", sentinel_args) for _ in range(sentinels)]
        self.data = [self.primary, *self.replica_procs]

    def start(self) -> "Sentinel":
        for r in self.data:
            r.start()
        wait_for("replicas to sync", lambda: all(
            info_field(r.cmd("INFO", "replication"), "master_link_status") == "up" for r in self.replica_procs), 20)
        for s in self.sentinels:
            s.start()
        others, reps = str(len(self.sentinels) - 1), str(len(self.replica_procs))

        def watching():
            for s in self.sentinels:
                m = s.cmd("SENTINEL", "MASTER", self.name)
                d = dict(zip(m[::2], m[1::2]))
                if d.get("flags") != "master" or d.get("num-other-sentinels") != others or d.get("num-slaves") != reps:
                    return False
            return True

        wait_for("sentinels to watch the primary", watching, 40, every=0.2)
        return self

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{self.name}"

    def current_primary(self) -> int:
        for s in self.sentinels:
            if s.running():
                try:
                    return int(s.cmd("SENTINEL", "get-master-addr-by-name", self.name)[1])
                except Exception:
                    continue
        raise RuntimeError("no sentinel names the primary")

    def kill_primary(self) -> int:
        port = self.current_primary()
        next(r for r in self.data if r.port == port).kill()
        return port

    def wait_failover(self, dead_port: int, limit: float = 30.0) -> float:
        t0 = time.monotonic()

        def done():
            seen = {int(s.cmd("SENTINEL", "get-master-addr-by-name", self.name)[1])
                    for s in self.sentinels if s.running()}
            if len(seen) != 1 or dead_port in seen:
                return False
            port = seen.pop()
            return next(r for r in self.data if r.port == port).role() == "master"

        wait_for(f"the sentinels to replace :{dead_port}", done, limit)
        return time.monotonic() - t0


# --------------------------------------------------------------------------------------------
# Shards
# --------------------------------------------------------------------------------------------


def shard_of(channel: str, shards: int) -> int:
    """Jump consistent hash of the FNV-1a (64-bit) hash of the name (docs/operations.md)."""
    m = (1 << 64) - 1
    key = 0xCBF29CE484222325
    for b in channel.encode():
        key = ((key ^ b) * 0x100000001B3) & m
    b, j, n = -1, 0, max(1, shards)
    while j < n:
        b = j
        key = (key * 2862933555777941757 + 1) & m
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


class Shards(Topology):
    def __init__(self, n: int = 3, root: str | None = None):
        super().__init__(root)
        self.servers = [self.add("shard", data_args([])) for _ in range(n)]

    def start(self) -> "Shards":
        for s in self.servers:
            s.start()
        return self

    @property
    def url(self) -> str:
        return ",".join(f"redis://127.0.0.1:{s.port}" for s in self.servers)

    def shard_of(self, channel: str) -> int:
        return shard_of(channel, len(self.servers))

    def check_placement(self, channels: list) -> None:
        """Each channel's keys are on the shard the hash names (run after it was published)."""
        for ch in channels:
            i = self.shard_of(ch)
            found = [k for k, s in enumerate(self.servers) if s.cmd("EXISTS", "sb:{" + ch + "}:m")]
            assert found == [i], f"{ch}: keys on shards {found}, the hash says {i}"

    def kill(self, i: int) -> int:
        self.servers[i].kill()
        return self.servers[i].port

    def restart(self, i: int) -> None:
        """The same port, empty (no persistence)."""
        self.servers[i].start()


# --------------------------------------------------------------------------------------------
# A single Redis behind a TCP proxy
# --------------------------------------------------------------------------------------------


class Single(Topology):
    def __init__(self, root: str | None = None):
        super().__init__(root)
        self.server = self.add("single", data_args([]))

    def start(self) -> "Single":
        self.server.start()
        return self

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.server.port}"


class Proxy:
    """The proxy as a subprocess (`python chaos_kit.py proxy …`), steered over its stdin."""

    def __init__(self, target_port: int):
        self.port = spare_port()
        self.target = target_port
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "proxy", str(self.port),
                                      str(target_port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, preexec_fn=sb._die_with_parent)
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            self.kill()
            raise RuntimeError(f"proxy did not start: {line!r}")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def _say(self, command: str) -> None:
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if answer != b"ok":
            raise RuntimeError(f"proxy: {command!r} answered {answer!r}")

    def latency(self, ms: int) -> None:
        self._say(f"latency {int(ms)}")

    def pause(self) -> None:
        self._say("pause")

    def resume(self) -> None:
        self._say("resume")

    def reset(self) -> None:
        self._say("reset")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


class _ProxyServer:
    """Forwards each accepted connection to the target. `latency`: every chunk is held that
    long before it goes on (order kept, per direction); `pause`: nothing is read or written,
    connections stay open; `reset`: every connection is closed with RST (SO_LINGER 0)."""

    def __init__(self, target: int):
        self.target = target
        self.delay = 0.0
        self.running = asyncio.Event()
        self.running.set()
        self.links: set = set()

    async def handle(self, reader, writer):
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        link = (writer, up_w)
        self.links.add(link)
        try:
            await asyncio.gather(self.pipe(reader, up_w), self.pipe(up_r, writer), return_exceptions=True)
        finally:
            self.links.discard(link)
            for w in link:
                w.transport.abort()

    async def pipe(self, reader, writer):
        queue: asyncio.Queue = asyncio.Queue()

        async def send():
            while True:
                due, data = await queue.get()
                if data is None:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self.running.wait()
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                await self.running.wait()
                data = await reader.read(65536)
                if not data:
                    break
                await self.running.wait()
                queue.put_nowait((time.monotonic() + self.delay, data))
        finally:
            queue.put_nowait((0, None))
            try:
                await asyncio.wait_for(sender, 10)
            except Exception:
                pass
            writer.transport.abort()

    def reset(self):
        for link in list(self.links):
            for w in link:
                sock = w.get_extra_info("socket")
                if sock is not None:
                    try:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    except OSError:
                        pass
                w.transport.abort()
        self.links.clear()


async def _proxy_main(listen: int, target: int) -> None:
    p = _ProxyServer(target)
    server = await asyncio.start_server(p.handle, "127.0.0.1", listen)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("ready", flush=True)
    async with server:
        while True:
            line = (await reader.readline()).decode().split()
            if not line:
                if reader.at_eof():
                    return
                continue
            if line[0] == "latency":
                p.delay = int(line[1]) / 1000.0
            elif line[0] == "pause":
                p.running.clear()
            elif line[0] == "resume":
                p.running.set()
            elif line[0] == "reset":
                p.reset()
            else:
                print(f"unknown {line[0]}", flush=True)
                continue
            print("ok", flush=True)


# --------------------------------------------------------------------------------------------
# Gateway nodes
# --------------------------------------------------------------------------------------------


class Nodes:
    """Gateway nodes on one broker; `live()` are those not killed by the run."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.servers: list[sb.Server] = []
        self.dead: set[int] = set()

    def start(self, broker_url: str, extra: list | None = None) -> sb.Server:
        i = len(self.servers)
        srv = sb.start_server(binary(), ["--broker", broker_url, "--node-id", f"n{i}", *(extra or [])],
                              os.path.join(self.log_dir, f"node{i}.stderr.log"), startup_timeout=20)
        self.servers.append(srv)
        return srv

    def live(self) -> list:
        return [(i, s) for i, s in enumerate(self.servers) if i not in self.dead]

    def kill(self, i: int) -> None:
        self.dead.add(i)
        self.servers[i].kill()

    def stop(self) -> None:
        for s in self.servers:
            s.kill()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "proxy":
        try:
            asyncio.run(_proxy_main(int(sys.argv[2]), int(sys.argv[3])))
        except KeyboardInterrupt:
            pass
    else:
        print(__doc__)
        sys.exit(2)
