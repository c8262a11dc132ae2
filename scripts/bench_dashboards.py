"""WebSocket dashboards for the ingest benchmarks (bench_mqtt.py, bench_opcua.py): D connections,
each subscribed to its share of the channels, timing every publication that arrives while
recording."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Callable, Optional

import websockets


def percentile(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    return sorted_vals[min(len(sorted_vals) - 1, int(p / 100 * len(sorted_vals)))]


class Dashboards:
    """`latency_ms(data, now_ns)` gives a publication's latency in ms from its data (None: not
    timed); the latencies of what arrives while `recording` go to `lat_ms`."""

    def __init__(self, url: str, channels: list, d: int, latency_ms: Callable[[dict, int], Optional[float]]):
        self.url, self.channels, self.d, self.latency_ms = url, channels, d, latency_ms
        self.lat_ms: list = []
        self.recording = False
        self.received = 0
        self.stop = asyncio.Event()

    async def one(self, chans, ready):
        async with websockets.connect(self.url, max_size=None, ping_interval=None, compression=None) as ws:
            for i in range(0, len(chans), 1000):
                await ws.send(json.dumps({"id": i + 1, "subscribe": {"channels": chans[i:i + 1000]}}))
                while True:
                    frame = await ws.recv()
                    if any('"id":' in part and '"ok"' in part for part in frame.split("\n")):
                        break
            ready.release()
            while not self.stop.is_set():
                try:
                    frame = await asyncio.wait_for(ws.recv(), 0.5)
                except asyncio.TimeoutError:
                    continue
                now = time.time_ns()
                for part in frame.split("\n"):
                    if self.recording and part.startswith('{"pub"'):
                        lat = self.latency_ms(json.loads(part)["pub"]["data"], now)
                        if lat is not None:
                            self.lat_ms.append(lat)
                            self.received += 1

    async def run(self, ready):
        per = -(-len(self.channels) // self.d)
        await asyncio.gather(*(self.one(self.channels[i * per:(i + 1) * per], ready) for i in range(self.d)))
