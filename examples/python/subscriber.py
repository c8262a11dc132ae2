"""Prints every publication of a point (pt:boiler.temp) and a room (room:ops) as it arrives,
and goes on across node restarts: the client reconnects and resumes by itself.

    python3 subscriber.py [HOST:PORT]        (default 127.0.0.1:8700; needs switchboard-client)

A point channel keeps no history, so a restart or updates missed meanwhile cannot be replayed:
the next value arrives with `after_gap` set and iteration goes on. A room keeps its messages;
when some are lost for good the iterator raises `Gap` first, and iterating again goes on.
"""

import asyncio
import sys

from switchboard_client import Client, Gap


async def main(node: str) -> None:
    async with Client(f"ws://{node}/ws") as c:
        sub = await c.subscribe(["pt:boiler.temp", "room:ops"], initial=True)
        print("subscribed to pt:boiler.temp and room:ops", flush=True)
        while True:
            try:
                async for pub in sub:
                    note = "  <- values were missed before this one" if pub.after_gap else ""
                    print(f"{pub.channel} {pub.offset} {pub.data}{note}", flush=True)
                return  # the subscription ended (the client closed)
            except Gap as gap:
                print(f"{gap.channel}: messages may have been lost ({gap})", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8700"))
