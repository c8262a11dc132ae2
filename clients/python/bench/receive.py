"""How many publications per second one Python process receives through `switchboard_client`.

One connection subscribes to one channel (default namespace: queued, not conflated, so every
publication is delivered); a publisher in another process sends `POST /api/publish {"batch":
[...]}` as fast as the receiver keeps up (at most `--window` publications in flight, so the
node's per-connection bound is never reached). The receiver counts what `async for pub in sub`
yields over `--duration` seconds after a warm-up, checks that every offset arrived once and in
order, and reports the rate and the receiving process's CPU use. `--raw` adds a baseline that
reads the same stream with bare `websockets` and `json`/`msgpack` (no client).

    .venv/bin/python clients/python/bench/receive.py --bin target/release/switchboard \\
        --raw --out /tmp/pyclient-bench.md

Against a running node: `--url ws://host:8700/ws` (the HTTP API is the same host and port).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing as mp
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid

from switchboard_client import Client

# A point value as a plant publishes it; offsets, not the data, tell publications apart.
DATA = {"v": 21.5, "t": 1767225600000, "q": "good"}
DATA_BYTES = len(json.dumps(DATA, separators=(",", ":")))
MAX_PENDING = 16 << 20


def publisher(http_base: str, channel: str, received, stop, batch: int, window: int, threads: int) -> None:
    """Publishes batches from `threads` HTTP connections (one round trip at a time each, so
    several keep the node busy) while fewer than `window` publications are unreceived. The
    body is encoded once: the publisher costs little CPU."""
    u = urllib.parse.urlsplit(http_base)
    body = json.dumps({"batch": [{"channel": channel, "data": DATA}] * batch}).encode()
    sent = [0]
    lock = threading.Lock()
    failed: list[str] = []

    def loop() -> None:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        while not stop.is_set() and not failed:
            with lock:
                if sent[0] - received.value > window - batch:
                    wait = True
                else:
                    wait = False
                    sent[0] += batch
            if wait:
                time.sleep(0.0005)
                continue
            conn.request("POST", "/api/publish", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            answer = resp.read()
            if resp.status != 200:
                failed.append(f"publish: HTTP {resp.status} {answer[:200]!r}")

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if failed:
        raise SystemExit(failed[0])


async def receive_client(url: str, fmt: str, channel: str, received, warmup: float, duration: float,
                         watch: dict) -> dict:
    async with Client(url, format=fmt, compression=None) as c:
        sub = await c.subscribe(channel)
        return await count(sub_offsets(sub), received, warmup, duration, watch)


async def sub_offsets(sub):
    async for pub in sub:
        yield pub.offset


async def receive_raw(url: str, fmt: str, channel: str, received, warmup: float, duration: float,
                      watch: dict) -> dict:
    """The same stream read with bare websockets: the floor of what a client costs."""
    from websockets.asyncio.client import connect

    proto = "switchboard.v1.msgpack" if fmt == "msgpack" else "switchboard.v1.json"
    async with connect(url, subprotocols=[proto], compression=None, max_size=None) as ws:
        if fmt == "msgpack":
            import msgpack
            await ws.send(msgpack.packb({"id": 1, "subscribe": {"channels": [channel]}}))
        else:
            await ws.send(json.dumps({"id": 1, "subscribe": {"channels": [channel]}}))

        async def offsets():
            async for frame in ws:
                if fmt == "msgpack":
                    up = msgpack.Unpacker(raw=False)
                    up.feed(frame)
                    msgs = list(up)
                else:
                    msgs = [json.loads(p) for p in frame.split("\n") if p]
                for m in msgs:
                    if "pub" in m:
                        yield m["pub"]["off"]

        return await count(offsets(), received, warmup, duration, watch)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def count(offsets, received, warmup: float, duration: float, watch: dict) -> dict:
    """Counts offsets for `duration` s after `warmup` s; checks they follow each other. The CPU
    use of this process and of the `watch` processes (name → pid) over the same window."""
    n = 0
    last = 0
    t0 = time.monotonic()
    start_n = start_t = start_cpu = None
    async for off in offsets:
        if off != last + 1:
            raise SystemExit(f"offset {off} after {last}: a publication was lost or repeated")
        last = off
        n += 1
        if n & 255 == 0:
            received.value = n
            now = time.monotonic()
            if start_t is None and now - t0 >= warmup:
                start_n, start_t, start_cpu = n, now, time.process_time()
                others = {name: cpu_seconds(pid) for name, pid in watch.items()}
            elif start_t is not None and now - start_t >= duration:
                break
    elapsed = time.monotonic() - start_t
    result = {"rate": (n - start_n) / elapsed, "cpu": (time.process_time() - start_cpu) / elapsed, "received": n}
    for name, pid in watch.items():
        result[f"cpu_{name}"] = (cpu_seconds(pid) - others[name]) / elapsed
    return result


def run_case(url: str, http_base: str, fmt: str, mode: str, args, node_pid: int | None) -> dict:
    channel = f"bench.pyclient.{uuid.uuid4().hex[:10]}"
    ctx = mp.get_context("spawn")
    received = ctx.Value("q", 0, lock=False)
    stop = ctx.Event()
    pub = ctx.Process(target=publisher, args=(http_base, channel, received, stop, args.batch, args.window,
                                              args.publishers))
    receiver = receive_client if mode == "client" else receive_raw

    async def main():
        watch: dict = {} if node_pid is None else {"node": node_pid}
        task = asyncio.create_task(receiver(url, fmt, channel, received, args.warmup, args.duration, watch))
        await asyncio.sleep(0.5)  # subscribed before the first publication
        pub.start()
        watch["publisher"] = pub.pid
        deadline = time.monotonic() + args.warmup + args.duration + 60
        while not task.done():
            if not pub.is_alive() or time.monotonic() > deadline:
                task.cancel()
                raise SystemExit(f"publisher exited ({pub.exitcode}) or no end in sight")
            await asyncio.wait([task], timeout=0.5)
        return task.result()

    try:
        result = asyncio.run(main())
    finally:
        stop.set()
        pub.join(10)
        if pub.is_alive():
            os.kill(pub.pid, signal.SIGKILL)
    result.update(format=fmt, mode=mode)
    return result


def start_node(binary: str):
    # A larger per-connection bound than the default 1 MiB: the window decides what is in flight.
    proc = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--max-pending-bytes", str(MAX_PENDING)],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    line = proc.stdout.readline().decode()
    if "listening on http://" not in line:
        proc.kill()
        raise SystemExit(f"node did not start: {line!r}")
    http_base = line.strip().split("listening on ", 1)[1]
    return proc, http_base


def command_line() -> str:
    """This run's command, the interpreter relative to the working directory when inside it."""
    exe = sys.executable
    if exe.startswith(os.getcwd() + os.sep):
        exe = os.path.relpath(exe)
    return " ".join([exe] + sys.argv)


def machine() -> str:
    def sh(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return "?"
    import websockets

    return (f"nproc: {sh('nproc')}\n\n```\n{sh('lscpu | head')}\n```\n\n"
            f"Python {platform.python_version()}, websockets {websockets.__version__}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", help="switchboard binary to start a node with (killed at the end)")
    ap.add_argument("--url", help="WebSocket URL of a running node instead")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds measured per case")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=500, help="publications per HTTP batch")
    ap.add_argument("--window", type=int, default=20000, help="most publications in flight")
    ap.add_argument("--publishers", type=int, default=2, help="HTTP connections of the publisher")
    ap.add_argument("--formats", default="json,msgpack")
    ap.add_argument("--raw", action="store_true", help="also measure bare websockets (no client)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per case (the median is reported)")
    ap.add_argument("--out", help="write a Markdown report here")
    args = ap.parse_args()
    if bool(args.bin) == bool(args.url):
        ap.error("give --bin or --url")
    proc = None
    if args.bin:
        proc, http_base = start_node(args.bin)
        url = http_base.replace("http://", "ws://") + "/ws"
    else:
        url = args.url
        http_base = url.replace("ws://", "http://").replace("wss://", "https://").rsplit("/ws", 1)[0]
    cases = []
    try:
        for fmt in args.formats.split(","):
            for mode in (["client", "raw"] if args.raw else ["client"]):
                runs = sorted((run_case(url, http_base, fmt, mode, args, proc.pid if proc else None)
                               for _ in range(args.repeat)), key=lambda r: r["rate"])
                cases.append(runs)
                print(f"{mode:6} {fmt:7} {describe(runs)}", flush=True)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(10)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report(args, cases))


def median(runs: list) -> dict:
    return runs[len(runs) // 2]


def describe(runs: list) -> str:
    m = median(runs)
    spread = f" (runs {runs[0]['rate']:,.0f} to {runs[-1]['rate']:,.0f})" if len(runs) > 1 else ""
    cpus = "  ".join(f"{k[4:]} CPU {m[k]:.0%}" for k in ("cpu_node", "cpu_publisher") if k in m)
    return f"{m['rate']:>9,.0f} publications/s{spread}  receiver CPU {m['cpu']:.0%}  {cpus}"


def report(args, cases: list) -> str:
    reader = {"client": "switchboard_client", "raw": "bare websockets"}
    rows = []
    for runs in cases:
        m = median(runs)
        spread = f"{runs[0]['rate']:,.0f} – {runs[-1]['rate']:,.0f}"
        others = " | ".join(f"{m[k]:.0%}" if k in m else "—" for k in ("cpu_node", "cpu_publisher"))
        rows.append(f"| {reader[m['mode']]} | {m['format']} | {m['rate']:,.0f} | {spread} | {m['cpu']:.0%} | {others} |")
    data = json.dumps(DATA, separators=(",", ":"))
    return f"""# Python client: publications received per second (one process, one connection)

Command (from the repository root, release build):

```sh
{command_line()}
```

One connection subscribed to one channel of the default namespace (queued: every publication
delivered); another process publishes with `POST /api/publish {{"batch": [...]}}` over
{args.publishers} connections ({args.batch} per batch, at most {args.window} unreceived), data
`{data}` ({DATA_BYTES} bytes). Each case ran {args.repeat} time(s): {args.duration:g} s measured
after {args.warmup:g} s of warm-up; every offset arrived once, in order. The node, the
publisher and the receiver share the machine's cores; CPU is the share of one core each used
over the measured window (the median run's).

| reader | format | publications/s (median) | runs | receiver CPU | node CPU | publisher CPU |
|---|---|---:|---:|---:|---:|---:|
{chr(10).join(rows)}

Machine: {machine()}
"""


if __name__ == "__main__":
    main()
