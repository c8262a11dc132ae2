"""OPC UA ingest through a node (docs/sources.md, "OPC UA source", "Measured").

Starts S asyncua servers (tests/python/opcua_server.py, N/S variables each changing at HZ; one
Python server tops out near 6,000 writes/s) and a release switchboard with one OPC UA source per
server (browse `Objects/Plant/Bench` into `pt:s<i>.P<nnnn>`), opens D WebSocket dashboards that
split the channels between them, and for DURATION seconds reports: values the servers wrote/s,
values the sources received/s (switchboard_source_messages_total), deliveries/s, latency from
the value's source timestamp to its arrival at a dashboard (includes the 100 ms publishing
interval), the node's CPU (utime + stime of /proc/<pid>/stat) per ingested value, and the
servers' CPU. Bounded: DURATION seconds plus the warm-up.

    .venv/bin/python scripts/bench_opcua.py --bin target/release/switchboard --points 1000 --hz 10 \
        --servers 2 --dashboards 10 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dashboards import Dashboards, percentile  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TICK = os.sysconf("SC_CLK_TCK")
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def get(url: str) -> str:
    with _opener.open(url, timeout=10) as r:
        return r.read().decode()


def source_messages(base: str) -> int:
    text = get(base + "/metrics")
    return sum(int(m) for m in re.findall(r'^switchboard_source_messages_total\{source="bench\d+",kind="opcua"\} (\d+)$',
                                          text, re.M))


class OpcServer:
    """One opcua_server.py; collects its `wrote N in S` lines."""

    def __init__(self, points: int, hz: float):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests", "python", "opcua_server.py"), "--port", str(self.port),
             "--points", str(points), "--hz", str(hz)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + 120
        while not select.select([fd], [], [], 0.5)[0]:
            assert time.monotonic() < deadline and self.proc.poll() is None, "opcua_server.py did not start"
        assert self.proc.stdout.readline().startswith("ready "), "opcua_server.py did not start"
        self.wrote: list = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            m = re.match(r"wrote (\d+) in ([\d.]+)", line)
            if m:
                self.wrote.append((time.monotonic(), int(m.group(1)), float(m.group(2))))

    def rate_since(self, t0: float) -> float:
        rows = [(n, s) for (t, n, s) in self.wrote if t >= t0 + 5]  # windows wholly after t0
        return sum(n for n, _ in rows) / max(1e-9, sum(s for _, s in rows))

    @property
    def url(self) -> str:
        return f"opc.tcp://127.0.0.1:{self.port}/switchboard/"

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


async def measure(args, base, ws_url, pid, servers, channels):
    # Latency from the value's source timestamp (the point's `t`, unix ms).
    dash = Dashboards(ws_url, channels, args.dashboards, lambda data, now_ns: now_ns / 1e6 - data["t"])
    ready = asyncio.Semaphore(0)
    task = asyncio.create_task(dash.run(ready))
    for _ in range(args.dashboards):
        await asyncio.wait_for(ready.acquire(), 60)
    await asyncio.sleep(3)  # warm-up
    dash.recording = True
    t_start = time.monotonic()
    c0, m0, s0 = cpu_s(pid), source_messages(base), sum(cpu_s(s.proc.pid) for s in servers)
    await asyncio.sleep(args.duration)
    c1, m1, s1 = cpu_s(pid), source_messages(base), sum(cpu_s(s.proc.pid) for s in servers)
    secs = time.monotonic() - t_start
    dash.recording = False
    dash.stop.set()
    await task
    lat = sorted(dash.lat_ms)
    ingested = m1 - m0
    return {
        "wrote_per_s": sum(s.rate_since(t_start) for s in servers),
        "ingested_per_s": ingested / secs,
        "deliveries_per_s": dash.received / secs,
        "p50_ms": percentile(lat, 50),
        "p90_ms": percentile(lat, 90),
        "p99_ms": percentile(lat, 99),
        "max_ms": lat[-1] if lat else float("nan"),
        "cpu_pct": 100 * (c1 - c0) / secs,
        "cpu_us_per_value": 1e6 * (c1 - c0) / max(1, ingested),
        "servers_cpu_pct": 100 * (s1 - s0) / secs,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/switchboard")
    ap.add_argument("--points", type=int, default=1000)
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--dashboards", type=int, default=10)
    ap.add_argument("--duration", type=float, default=30)
    args = ap.parse_args()
    assert args.duration <= 600 and args.points <= 20000 and args.servers <= 8, "bounded runs only"
    per = args.points // args.servers
    work = tempfile.mkdtemp(prefix="bench-opcua-")
    servers = [OpcServer(per, args.hz) for _ in range(args.servers)]
    port = free_port()
    cfg = os.path.join(work, "sb.toml")
    with open(cfg, "w") as f:
        for i, s in enumerate(servers):
            f.write(f'[[sources]]\nkind = "opcua"\nname = "bench{i}"\nurl = "{s.url}"\nbrowse = "Objects/Plant/Bench"\n'
                    f'sampling_ms = {max(1, int(500 / args.hz))}\npublishing_ms = 100\nchannel = "pt:s{i}.{{name}}"\n\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    srv = subprocess.Popen([args.bin, "serve", "--config", cfg, "--listen", f"127.0.0.1:{port}"],
                           stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "sb.log"), "wb"), env=env)
    base, ws_url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/ws"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if get(base + "/api/info").replace(" ", "").count('"connected":true') >= args.servers:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the node's OPC UA sources did not connect"
            time.sleep(0.2)
        channels = [f"pt:s{i}.P{j:04d}" for i in range(args.servers) for j in range(per)]
        r = asyncio.run(measure(args, base, ws_url, srv.pid, servers, channels))
        print(f"{per * args.servers} OPC UA variables at {args.hz:g} Hz on {args.servers} asyncua server(s) into "
              f"{args.dashboards} WebSocket dashboards, {args.duration:.0f} s")
        print(f"{'wrote/s':>8} {'ingested/s':>10} {'deliv/s':>8} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} "
              f"{'max ms':>7} {'node CPU':>8} {'CPU/value':>9} {'servers CPU':>11}")
        print(f"{r['wrote_per_s']:8.0f} {r['ingested_per_s']:10.0f} {r['deliveries_per_s']:8.0f} {r['p50_ms']:7.1f} "
              f"{r['p90_ms']:7.1f} {r['p99_ms']:7.1f} {r['max_ms']:7.1f} {r['cpu_pct']:7.1f}% "
              f"{r['cpu_us_per_value']:7.2f}µs {r['servers_cpu_pct']:10.0f}%")
    finally:
        srv.send_signal(signal.SIGKILL)
        srv.wait()
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
