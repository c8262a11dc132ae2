#!/usr/bin/env python3
"""Connect storms against nodes with and without the application's hooks (docs/backend.md,
docs/benchmarks.md "The application's hooks").

Starts a hook backend (asyncio, keep-alive HTTP/1.1, answers `{"result": ...}` at once), then
for each case a fresh node and `switchboard bench connect` against it:

- `none`: no hooks, anonymous connections (channel `bench:connect`, a namespace without
  presence: a presence namespace would measure the joins sent to every member instead);
- `connect`: the connect hook decides every connection (asked on its first command, the
  bench's subscribe);
- `connect+subscribe`: the same, and the channel is in a `proxy_subscribe` namespace, so its
  subscribe is asked about too.

Usage: scripts/bench_hooks.py [--conns 2000] [--rate 1000] [--bin target/release/switchboard]
Prints one line per case: handshakes/s, handshake + subscribe latency p50 / p99, hook calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counts: dict) -> None:
    counts["tcp connections"] = counts.get("tcp connections", 0) + 1
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode()
            m = re.search(rb"(?i)content-length:\s*(\d+)", head)
            body = json.loads(await reader.readexactly(int(m.group(1)))) if m else {}
            counts[path] = counts.get(path, 0) + 1
            if path.endswith("/connect"):
                answer = {"result": {"user": f"u{body['client']}"}}
            else:
                answer = {"result": {}}
            out = json.dumps(answer).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(out), out))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def start_backend(counts: dict) -> int:
    ready = threading.Event()
    port = []

    def run():
        async def main():
            srv = await asyncio.start_server(lambda r, w: handle(r, w, counts), "127.0.0.1", 0, backlog=4096)
            port.append(srv.sockets[0].getsockname()[1])
            ready.set()
            await srv.serve_forever()
        asyncio.run(main())

    threading.Thread(target=run, daemon=True).start()
    ready.wait(10)
    return port[0]


def start_node(binary: str, config: str) -> tuple[subprocess.Popen, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    p = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--config", config],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    line = p.stdout.readline().decode()
    return p, int(line.rsplit(":", 1)[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--subscribes", type=int, default=2000)
    ap.add_argument("--bin", default=str(REPO / "target" / "release" / "switchboard"))
    args = ap.parse_args()
    counts: dict = {}
    backend = f"http://127.0.0.1:{start_backend(counts)}"
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-hooks-"))
    limits = "[limits]\nmax_connections = 100000\n"
    cases = {
        "none": ("bench:connect", limits),
        "connect": ("bench:connect", f'{limits}[proxy]\nconnect_url = "{backend}/connect"\n'),
        "connect+subscribe": ("app:bench", f'{limits}[proxy]\nconnect_url = "{backend}/connect"\n'
                              f'subscribe_url = "{backend}/subscribe"\n[namespaces.app]\nproxy_subscribe = true\n'),
    }
    for name, (channel, text) in cases.items():
        cfg = tmp / f"{name}.toml"
        cfg.write_text(text)
        node, port = start_node(args.bin, str(cfg))
        before = dict(counts)
        out = tmp / name
        try:
            subprocess.run([args.bin, "bench", "connect", "--target", f"ws://127.0.0.1:{port}/ws",
                            "--conns", str(args.conns), "--rate", str(args.rate), "--channel", channel,
                            "--server-pid", str(node.pid), "--out", str(out), "--quiet"],
                           check=False, stdout=subprocess.DEVNULL)
            r = json.loads((out / "result.json").read_text())
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        finally:
            node.send_signal(signal.SIGKILL)
            node.wait()
        calls = {k: counts.get(k, 0) - before.get(k, 0) for k in counts}
        lat = r["latency_ms"]
        hs = round(r.get("extra", {}).get("handshakes_per_s", 0))
        errors = sum(int(v) for v in re.findall(r'switchboard_hook_errors_total\{hook="\w+"\} (\d+)', metrics))
        ex = r.get("extra", {})
        print(f"{name:18} established {r['connections']['established']}/{r['connections']['target']} "
              f"handshakes/s {hs} p50 {lat['p50']:.1f} ms p99 {lat['p99']:.1f} ms max {lat['max']:.1f} ms "
              f"(handshake alone p50 {ex.get('handshake_ms_p50', 0):.1f} p99 {ex.get('handshake_ms_p99', 0):.1f} ms) "
              f"server cpu {r['server'].get('cpu_s')} s hook calls {calls} hook errors {errors} pass {r['pass']}")
        sys.stdout.flush()
        time.sleep(1)
    subscribe_latency(args.bin, backend, tmp, args.subscribes)
    return 0


def subscribe_latency(binary: str, backend: str, tmp: pathlib.Path, n: int) -> None:
    """One connection subscribing `n` fresh channels one after the other, in a namespace the
    subscribe hook decides (`app:`) and in one it does not (`room:`): the hook's cost per
    subscribe, client round trip included."""
    from websockets.sync.client import connect

    cfg = tmp / "subscribe.toml"
    cfg.write_text(f'[proxy]\nsubscribe_url = "{backend}/subscribe"\n[namespaces.app]\nproxy_subscribe = true\n')
    node, port = start_node(binary, str(cfg))
    try:
        with connect(f"ws://127.0.0.1:{port}/ws", subprotocols=["switchboard.v1.json"], proxy=None) as ws:
            for ns in ("bench", "app", "bench", "app"):
                took = []
                for i in range(n):
                    t = time.perf_counter()
                    ws.send(json.dumps({"id": i + 1, "subscribe": {"channels": [f"{ns}:s{time.time_ns()}"]}}))
                    while '"id":%d,' % (i + 1) not in ws.recv():
                        pass
                    took.append((time.perf_counter() - t) * 1000)
                took.sort()
                print(f"subscribe {ns + ':':6} {'hook' if ns == 'app' else 'no hook':8} n={n} "
                      f"p50 {took[n // 2]:.2f} ms p99 {took[int(n * 0.99)]:.2f} ms max {took[-1]:.2f} ms")
    finally:
        node.send_signal(signal.SIGKILL)
        node.wait()


if __name__ == "__main__":
    sys.exit(main())
