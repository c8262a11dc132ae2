// Prints every publication of a point (pt:boiler.temp) and a room (room:ops) as it arrives,
// and goes on across node restarts: the client reconnects and recovers by itself.
//
//   node subscriber.mjs [HOST:PORT]        (default 127.0.0.1:8700)
//
// Plain JavaScript (an ES module), so that it runs without a compile step. It imports the SDK
// built in this repository (web/sdk/dist, `make web-build`) and the `ws` package the SDK's
// workspace installed (web/node_modules); in an application you would write
//
//   import { Client } from "switchboard-sdk";
//   import WebSocket from "ws";
//
// Output, one line each:
//   subscribed to pt:boiler.temp and room:ops      once the server confirmed both
//   CHANNEL OFFSET DATA                            a publication, DATA as JSON
//   CHANNEL: gap from EPOCH:OFFSET to EPOCH:OFFSET (epoch changed)
//                                                  publications since EPOCH:OFFSET could not be
//                                                  replayed; printed before what follows them
//
// A point channel keeps no history: after a restart, or updates missed meanwhile, the gap is
// reported and the channel's latest value follows. A room keeps its messages: the client
// replays what it missed, and after a restart (a new epoch) reads the new epoch's history, so
// messages published before it was back are delivered too.

import { createRequire } from "node:module";
import { Client } from "../../web/sdk/dist/index.js";

// `ws` resolved from the SDK's own folder, so the example needs no npm install of its own.
const WebSocket = createRequire(new URL("../../web/sdk/package.json", import.meta.url))("ws");

const node = process.argv[2] ?? "127.0.0.1:8700";
const channels = ["pt:boiler.temp", "room:ops"];

const client = new Client({
  url: `ws://${node}/ws`,
  // Node has no global WebSocket (before v22): pass one in. A browser would use its own, and
  // fall back to Server-Sent Events or long-polling behind a proxy that refuses WebSockets;
  // a Node process has no such proxy, so it sticks to the WebSocket.
  WebSocket,
  transports: ["websocket"],
  name: "example-subscriber",
});

const pos = (p) => `${p.epoch}:${p.offset}`;
client.on("gap", (g) =>
  console.log(`${g.channel}: gap from ${pos(g.from)} to ${pos(g.to)}${g.epochChanged ? " (epoch changed)" : ""}`),
);
client.on("error", (e) => console.error("error:", e.message));
client.on("disconnected", (d) =>
  console.error(`disconnected (${d.code} ${d.reason})${d.reconnect ? `, reconnecting in ${d.delayMs} ms` : ""}`),
);
client.on("connected", (c) => console.error(`connected to ${node} (reconnects: ${c.reconnects})`));

// Each channel's latest publication first (`initial`, the default), then every new one; the
// SDK hands them over once per frame (~16 ms in Node), in offset order per channel.
const subs = client.subscribeMany(channels, {
  onPublication: (p) => console.log(`${p.channel} ${p.offset} ${JSON.stringify(p.data)}`),
});

const stop = () => {
  client.close();
  process.exit(0);
};
process.on("SIGINT", stop);
process.on("SIGTERM", stop);

await client.connect();
await Promise.all(subs.map((s) => s.ready));
console.log(`subscribed to ${channels.join(" and ")}`);
