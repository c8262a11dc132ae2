// The TypeScript SDK in Debian's Chromium with the WebSocket unavailable: the transport
// fallback picks SSE (the browser's own EventSource), or long-polling when EventSource is gone
// too, transparently to the page; subscriptions, commands and recovery across a dropped
// connection work the same on every transport. The SDK is bundled from its sources with
// esbuild (web/'s dev dependency) and loaded into a page of the server's own origin.

import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { launch, newPage, REPO, Server } from './harness.mjs';

let browser;
let server;
let bundle;
let n = 0;

before(async () => {
  const esbuild = createRequire(join(REPO, 'web/package.json'))('esbuild');
  const out = await esbuild.build({
    entryPoints: [join(REPO, 'web/sdk/src/index.ts')],
    bundle: true,
    format: 'iife',
    globalName: 'Switchboard',
    platform: 'browser',
    write: false,
  });
  bundle = out.outputFiles[0].text;
  browser = await launch();
  server = await new Server().start();
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

/** What the page's WebSocket and EventSource look like. */
const ENVIRONMENTS = {
  // A proxy that breaks the upgrade: the browser reports an error and a 1006 close.
  'WebSocket refused by a proxy': () => {
    window.WebSocket = class {
      constructor() {
        this.readyState = 0;
        window.refusedWebSockets = (window.refusedWebSockets ?? 0) + 1;
        setTimeout(() => {
          this.readyState = 3;
          this.onerror?.({});
          this.onclose?.({ code: 1006, reason: '' });
        }, 10);
      }
      send() {
        throw new Error('not open');
      }
      close() {}
    };
  },
  'no WebSocket at all': () => {
    delete window.WebSocket;
  },
  'neither WebSocket nor EventSource': () => {
    delete window.WebSocket;
    delete window.EventSource;
  },
};

async function page(environment) {
  const p = await newPage(browser, { width: 800, height: 600 });
  await p.addInitScript(ENVIRONMENTS[environment]);
  await p.goto(`${server.url}/healthz`);
  await p.addScriptTag({ content: bundle });
  return p;
}

/** Connects a client in the page, subscribed to `ch`; returns the transport it ended up on. */
function connect(p, ch) {
  return p.evaluate(async (ch) => {
    const c = new Switchboard.Client({ url: location.origin, reconnect: { minDelayMs: 200, maxDelayMs: 400 } });
    window.client = c;
    window.offsets = [];
    c.on('frame', (b) => window.offsets.push(...b.publications.filter((x) => x.channel === ch).map((x) => x.offset)));
    const sub = c.subscribe(ch);
    await c.connect();
    await sub.ready;
    return c.transportName;
  }, ch);
}

const offsets = (p) => p.evaluate(() => window.offsets);
const until = (p, fn, arg) => p.waitForFunction(fn, arg, { timeout: 15_000 });

for (const [environment, expected] of [
  ['WebSocket refused by a proxy', 'sse'],
  ['no WebSocket at all', 'sse'],
  ['neither WebSocket nor EventSource', 'poll'],
]) {
  describe(`SDK with ${environment}`, () => {
    it(`falls back to ${expected}: initial value, live publications, commands, recovery across a reconnect`, async () => {
      const ch = `ev:browser.${process.pid}.${++n}`;
      const room = `room:browser.${process.pid}.${n}`;
      await server.publish(ch, { i: 0 });
      const p = await page(environment);
      assert.equal(await connect(p, ch), expected);
      await until(p, () => window.offsets.length === 1);
      for (let i = 1; i <= 10; i++) await server.publish(ch, { i });
      await until(p, () => window.offsets.length === 11);

      // Commands and their replies over the same transport.
      const echoed = await p.evaluate(async (room) => {
        const c = window.client;
        const sub = c.subscribe(room);
        await sub.ready;
        const r = await c.publish(room, { hello: 'browser' });
        return { ping: await c.ping({ n: 7 }), offset: r.offset };
      }, room);
      assert.deepEqual(echoed, { ping: { n: 7 }, offset: 1 });

      // The connection drops; what is published meanwhile arrives once, in order.
      await p.evaluate(() => window.client.dropConnection());
      for (let i = 11; i <= 40; i++) await server.publish(ch, { i });
      await until(p, () => window.offsets.length >= 41 && window.client.state === 'connected');
      assert.deepEqual(await offsets(p), Array.from({ length: 41 }, (_, i) => i + 1));
      assert.equal(await p.evaluate(() => window.client.transportName), expected);
      assert.ok((await p.evaluate(() => window.client.stats.reconnects)) >= 1);
      if (environment === 'WebSocket refused by a proxy') {
        // Tried once; the transport that worked is kept for the reconnect.
        assert.equal(await p.evaluate(() => window.refusedWebSockets), 1);
      }
      assert.deepEqual(p.errors, []);
      await p.evaluate(() => window.client.close());
      await p.close();
    });
  });
}
