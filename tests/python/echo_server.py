"""A tiny JSON echo server for `switchboard bench echo --protocol json-echo`, written with the
third-party `websockets` library (nothing from the project).

Like the echo service of the WebSocket benchmarking experiment, it answers each
`{"data": "ping", "timestamp": ...}` message by sending it back unchanged; anything else is
not answered. It listens on 127.0.0.1 with a port chosen by the OS, prints `port N` once
listening, and on SIGTERM prints `pings P connections C` (what it saw) and exits.

    python echo_server.py
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys

from websockets.asyncio.server import serve

stats = {"pings": 0, "connections": 0}


async def echo(ws) -> None:
    stats["connections"] += 1
    async for message in ws:
        try:
            msg = json.loads(message)
        except (TypeError, ValueError):
            continue
        if isinstance(msg, dict) and msg.get("data") == "ping" and "timestamp" in msg:
            stats["pings"] += 1
            await ws.send(message)


async def main() -> None:
    stop = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set_result, None)
    async with serve(echo, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"port {port}", flush=True)
        await stop
    print(f"pings {stats['pings']} connections {stats['connections']}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
