// permessage-deflate with Debian's Chromium, which offers it on every WebSocket: a page's own
// WebSocket to the node negotiates the extension (`ws.extensions`), receives publications of
// about 1 KiB identical to what was published over HTTP, and its own messages, which Chromium
// compresses, are read by the node (docs/protocol.md, "Compression").

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { launch, newPage, Server } from './harness.mjs';

let browser;
let server;

before(async () => {
  browser = await launch();
  server = await new Server().start();
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

/** A JSON document of about 1 KiB: a plant's readings. */
function document(i) {
  const points = [];
  for (let k = 0; k < 16; k++) {
    const v = Math.round((20 + k * 0.37 + i * 0.01) * 1000) / 1000;
    points.push({ id: `boiler${k}.temp`, v, q: 'good', t: 1_700_000_000_000 + i * 1000 + k });
  }
  return { seq: i, site: 'plant1', points };
}

describe('WebSocket compression in Chromium', () => {
  it('negotiates permessage-deflate and receives identical publications', async () => {
    const ch = `room:deflate.${process.pid}`;
    const page = await newPage(browser, { width: 800, height: 600 });
    await page.goto(`${server.url}/healthz`);
    const extensions = await page.evaluate(async (ch) => {
      const ws = new WebSocket(`${location.origin.replace('http', 'ws')}/ws`, 'switchboard.v1.json');
      window.ws = ws;
      window.got = [];
      window.replies = {};
      ws.onmessage = (e) => {
        for (const line of e.data.split('\n')) {
          const m = JSON.parse(line);
          if (m.pub) window.got.push(m.pub);
          if (m.id) window.replies[m.id] = m;
        }
      };
      await new Promise((ok, fail) => {
        ws.onopen = ok;
        ws.onerror = fail;
      });
      ws.send(JSON.stringify({ id: 1, subscribe: { channels: [ch] } }));
      return ws.extensions;
    }, ch);
    assert.equal(extensions, 'permessage-deflate; server_no_context_takeover; client_no_context_takeover');
    await page.waitForFunction(() => window.replies[1]?.ok, null, { timeout: 10_000 });

    const docs = Array.from({ length: 30 }, (_, i) => document(i));
    assert.ok(JSON.stringify(docs[0]).length > 900);
    for (const d of docs) await server.publish(ch, d);
    // A message Chromium compresses: a publish command carrying a document.
    const mine = document(999);
    await page.evaluate((m) => window.ws.send(JSON.stringify({ id: 2, publish: m })), { channel: ch, data: mine });
    const all = docs.length + 1;
    await page.waitForFunction((n) => window.got.length === n && window.replies[2], all, { timeout: 10_000 });

    const got = await page.evaluate(() => window.got);
    assert.deepEqual(got.map((p) => p.data), [...docs, mine]);
    assert.ok((await page.evaluate(() => window.replies[2].ok)).offset > 0);
    assert.deepEqual(page.errors, []);
    await page.close();
  });
});
