"""MQTT ingest against the HTTP batch path (docs/benchmarks.md, "MQTT ingest").

Starts a mosquitto and a release switchboard with an MQTT source on spare loopback ports, opens
D WebSocket "dashboards" that split the K point channels between them (each channel has one
subscriber), then for each mode publishes K topics at HZ for DURATION seconds:

- mqtt: QoS 0 MQTT publishes to `bench/p<i>` (one socket, K/10 topics every tenth of a period),
  ingested by the node's MQTT source into `pt:bench.p<i>`;
- http: the same points as `POST /api/publish` batches of K/10 items, one per tenth.

Each point carries its publish time in microseconds (`ts`, passed through with the point), so
latency is publish → arrival at the dashboard, across the MQTT broker and the source. Reports per
mode: points ingested/s, deliveries/s, latency percentiles, and the node's CPU (utime + stime of
/proc/<pid>/stat) per ingested point. Bounded: DURATION seconds per mode plus a 3 s warm-up.

    .venv/bin/python scripts/bench_mqtt.py --bin target/release/switchboard --topics 10000 --hz 1 \
        --dashboards 100 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from mqtt_kit import Mosquitto, Publisher, free_port  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dashboards import Dashboards, percentile  # noqa: E402


TICK = os.sysconf("SC_CLK_TCK")
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def get(url: str) -> str:
    with _opener.open(url, timeout=10) as r:
        return r.read().decode()


def source_messages(base: str) -> int:
    m = re.search(r'^switchboard_source_messages_total\{source="bench",kind="mqtt"\} (\d+)$',
                  get(base + "/metrics"), re.M)
    return int(m.group(1)) if m else 0


def publish_mqtt(port: int, k: int, hz: float, seconds: float, stop: threading.Event):
    pub = Publisher(port, "bench-pub")
    slices, period = 10, 1.0 / hz
    start = time.monotonic()
    n = 0
    while not stop.is_set() and time.monotonic() - start < seconds:
        for s in range(slices):
            ts = time.time_ns() // 1000
            ms = ts // 1000
            items = [(f"bench/p{i}", json.dumps({"v": n, "t": ms, "q": "good", "ts": ts}, separators=(",", ":")))
                     for i in range(s, k, slices)]
            pub.publish_many(items, qos=0)
            time.sleep(max(0.0, start + n * period + (s + 1) * period / slices - time.monotonic()))
        n += 1
    pub.close()


def publish_http(base: str, k: int, hz: float, seconds: float, stop: threading.Event):
    slices, period = 10, 1.0 / hz
    start = time.monotonic()
    n = 0
    while not stop.is_set() and time.monotonic() - start < seconds:
        for s in range(slices):
            ts = time.time_ns() // 1000
            batch = [{"channel": f"pt:bench.p{i}", "data": {"v": n, "t": ts // 1000, "q": "good", "ts": ts}}
                     for i in range(s, k, slices)]
            req = urllib.request.Request(base + "/api/publish", data=json.dumps({"batch": batch}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            _opener.open(req, timeout=30).read()
            time.sleep(max(0.0, start + n * period + (s + 1) * period / slices - time.monotonic()))
        n += 1


async def run_mode(mode, args, base, ws_url, mq_port, pid):
    channels = [f"pt:bench.p{i}" for i in range(args.topics)]
    # The publisher stamps `ts` (unix µs) beside the point's `t`.
    dash = Dashboards(ws_url, channels, args.dashboards,
                      lambda data, now_ns: (now_ns // 1000 - data["ts"]) / 1000 if data.get("ts") else None)
    ready = asyncio.Semaphore(0)
    task = asyncio.create_task(dash.run(ready))
    for _ in range(args.dashboards):
        await asyncio.wait_for(ready.acquire(), 60)
    stop = threading.Event()
    total = args.duration + 3
    if mode == "mqtt":
        t = threading.Thread(target=publish_mqtt, args=(mq_port, args.topics, args.hz, total, stop))
    else:
        t = threading.Thread(target=publish_http, args=(base, args.topics, args.hz, total, stop))
    t.start()
    await asyncio.sleep(3)  # warm-up
    dash.recording = True
    c0, m0, t0 = cpu_s(pid), source_messages(base), time.monotonic()
    await asyncio.sleep(args.duration)
    c1, m1, t1 = cpu_s(pid), source_messages(base), time.monotonic()
    dash.recording = False
    stop.set()
    t.join()
    dash.stop.set()
    await task
    secs = t1 - t0
    ingested = (m1 - m0) if mode == "mqtt" else args.topics * args.hz * secs
    lat = sorted(dash.lat_ms)
    return {
        "mode": mode,
        "ingested_per_s": ingested / secs,
        "deliveries_per_s": dash.received / secs,
        "p50_ms": percentile(lat, 50),
        "p90_ms": percentile(lat, 90),
        "p99_ms": percentile(lat, 99),
        "max_ms": lat[-1] if lat else float("nan"),
        "cpu_pct": 100 * (c1 - c0) / secs,
        "cpu_us_per_point": 1e6 * (c1 - c0) / max(1, ingested),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/switchboard")
    ap.add_argument("--topics", type=int, default=10000)
    ap.add_argument("--hz", type=float, default=1.0)
    ap.add_argument("--dashboards", type=int, default=100)
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--modes", default="mqtt,http")
    args = ap.parse_args()
    assert args.duration <= 600 and args.topics <= 100000, "bounded runs only"
    work = tempfile.mkdtemp(prefix="bench-mqtt-")
    mq = Mosquitto(work).start()
    port = free_port()
    cfg = os.path.join(work, "sb.toml")
    with open(cfg, "w") as f:
        f.write(f'[[sources]]\nkind = "mqtt"\nname = "bench"\nurl = "{mq.url}"\ntopics = ["bench/#"]\n'
                f'channel = "pt:{{topic}}"\nqos = 0\nclean_session = true\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    srv = subprocess.Popen([args.bin, "serve", "--config", cfg, "--listen", f"127.0.0.1:{port}"],
                           stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "sb.log"), "wb"), env=env)
    base, ws_url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/ws"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if '"connected":true' in get(base + "/api/info").replace(" ", ""):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the node's MQTT source did not connect"
            time.sleep(0.1)
        print(f"{args.topics} topics at {args.hz} Hz into {args.dashboards} WebSocket dashboards, "
              f"{args.duration:.0f} s per mode")
        print(f"{'mode':5} {'ingested/s':>10} {'deliv/s':>9} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} "
              f"{'max ms':>7} {'node CPU':>8} {'CPU/point':>10}")
        for mode in args.modes.split(","):
            r = asyncio.run(run_mode(mode, args, base, ws_url, mq.port, srv.pid))
            print(f"{r['mode']:5} {r['ingested_per_s']:10.0f} {r['deliveries_per_s']:9.0f} {r['p50_ms']:7.2f} "
                  f"{r['p90_ms']:7.2f} {r['p99_ms']:7.2f} {r['max_ms']:7.1f} {r['cpu_pct']:7.1f}% "
                  f"{r['cpu_us_per_point']:8.2f}µs")
    finally:
        srv.send_signal(signal.SIGKILL)
        srv.wait()
        mq.stop()


if __name__ == "__main__":
    main()
