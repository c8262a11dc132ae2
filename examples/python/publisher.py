"""Publishes one reading of the point pt:boiler.temp and one message to room:ops.

    python3 publisher.py VALUE TEXT [HOST:PORT]     (default 127.0.0.1:8700)

The reading goes over the HTTP API (`POST /api/publish`): clients may not publish to point
channels, whose values come from the plant side (a source, or a server-side publisher with an
API key when authentication is on). The message goes as a client publish, which the `room`
namespace allows.
"""

import asyncio
import json
import sys
import time
import urllib.request

from switchboard_client import Client


def publish_point(node: str, channel: str, value: float) -> dict:
    body = {"channel": channel, "data": {"v": value, "q": "good", "t": int(time.time() * 1000)}}
    req = urllib.request.Request(f"http://{node}/api/publish", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


async def main(value: float, text: str, node: str) -> None:
    print("pt:boiler.temp", publish_point(node, "pt:boiler.temp", value), flush=True)
    async with Client(f"ws://{node}/ws") as c:
        print("room:ops", await c.publish("room:ops", {"text": text}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1:8700"))
