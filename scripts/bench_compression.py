#!/usr/bin/env python3
"""What permessage-deflate costs and saves a node (docs/operations.md and docs/benchmarks.md,
"WebSocket compression"): ~1 KiB JSON publications to many subscribers, plain vs deflate.

For each case a fresh node (`limits.compression_min_bytes` left at its default), N subscribers
of one channel on the `websockets` library (asyncio; `compression=None` for `plain`, its default
permessage-deflate offer for `deflate`, whose answer is checked), then P publications of ~1 KiB
JSON documents over `POST /api/publish` (batches of 50), paced at RATE per second. It waits for
every subscriber to have every publication, and reads from the node: the bytes it wrote to
client sockets (`switchboard_bytes_out_total`) and its CPU time (/proc/PID/stat) over the
publishing.

Usage: scripts/bench_compression.py [--subscribers 200] [--publications 2000] [--rate 500]
                                    [--bin target/release/switchboard]
Prints one line per case: bytes written per delivery, node CPU per publication and per delivery.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.request

import websockets

REPO = pathlib.Path(__file__).resolve().parents[1]
CHANNEL = "bench:deflate"

sys.path.insert(0, str(REPO / "tests" / "python"))
from sb import plant_document as document  # noqa: E402


def start_node(binary: str) -> tuple[subprocess.Popen, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    proc = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--data-dir",
                             os.path.join(os.environ.get("TMPDIR", "/tmp"), f"bench-deflate-{os.getpid()}")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    line = proc.stdout.readline().decode()
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if not m:
        proc.kill()
        sys.exit(f"node did not start: {line!r}")
    return proc, int(m.group(1))


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bytes_out(port: int) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    m = re.search(r"^switchboard_bytes_out_total (\d+)", text, re.M)
    return int(m.group(1))


def publish(port: int, batch: list) -> None:
    body = json.dumps({"batch": [{"channel": CHANNEL, "data": d} for d in batch]}, separators=(",", ":")).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/publish", data=body, method="POST")
    urllib.request.urlopen(req, timeout=30).read()


async def subscriber(port: int, deflate: bool, want: int, ready: asyncio.Event, counts: list, i: int) -> None:
    async with websockets.connect(f"ws://127.0.0.1:{port}/ws", compression="deflate" if deflate else None,
                                  max_size=None, ping_interval=None, proxy=None) as ws:
        ext = ws.response.headers.get("Sec-WebSocket-Extensions")
        assert (ext is not None) == deflate, ext
        await ws.send(json.dumps({"id": 1, "subscribe": {"channels": [CHANNEL]}}))
        await ws.recv()
        counts[i] = 0
        ready.set()
        while counts[i] < want:
            frame = await ws.recv()
            counts[i] += frame.count('"pub"')


async def case(binary: str, deflate: bool, subscribers: int, publications: int, rate: float) -> dict:
    proc, port = start_node(binary)
    try:
        counts = [None] * subscribers
        readies = [asyncio.Event() for _ in range(subscribers)]
        tasks = []
        for i in range(subscribers):
            tasks.append(asyncio.create_task(subscriber(port, deflate, publications, readies[i], counts, i)))
            await readies[i].wait()
        docs = [document(i) for i in range(publications)]
        size = sum(len(json.dumps(d, separators=(",", ":"))) for d in docs) / len(docs)
        cpu0, out0, t0 = cpu_s(proc.pid), bytes_out(port), time.monotonic()
        step = 50
        for k in range(0, publications, step):
            await asyncio.to_thread(publish, port, docs[k:k + step])
            await asyncio.sleep(max(0.0, t0 + (k + step) / rate - time.monotonic()))
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)
        took = time.monotonic() - t0
        cpu, out = cpu_s(proc.pid) - cpu0, bytes_out(port) - out0
        deliveries = subscribers * publications
        return {"case": "deflate" if deflate else "plain", "doc_bytes": size, "bytes_per_delivery": out / deliveries,
                "cpu_us_per_publication": cpu / publications * 1e6, "cpu_us_per_delivery": cpu / deliveries * 1e6,
                "node_cpu_s": cpu, "seconds": took}
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--subscribers", type=int, default=200)
    ap.add_argument("--publications", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--bin", default=os.environ.get("SWITCHBOARD_BIN", str(REPO / "target/release/switchboard")))
    a = ap.parse_args()
    print(f"{a.subscribers} subscribers, {a.publications} publications at {a.rate:.0f}/s")
    for deflate in (False, True):
        r = asyncio.run(case(a.bin, deflate, a.subscribers, a.publications, a.rate))
        print(f"{r['case']:8} document {r['doc_bytes']:.0f} B: {r['bytes_per_delivery']:7.1f} B written per delivery, "
              f"node CPU {r['node_cpu_s']:.2f} s = {r['cpu_us_per_publication']:.1f} µs per publication, "
              f"{r['cpu_us_per_delivery']:.2f} µs per delivery ({r['seconds']:.1f} s)")


if __name__ == "__main__":
    main()
