// The SDK over long-polling and through the transport fallback, against the real server:
// subscriptions, commands and recovery across reconnects exactly as on a WebSocket. (SSE needs
// an EventSource, which Node lacks: the browser tests in tests/browser cover it.)

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { Client, pollTransport, type ClientOptions, type Publication, type WebSocketConstructor } from '../src/index.js';
import { Server, until } from './server.js';

const server = new Server();
const clients: Client[] = [];

beforeAll(async () => {
  await server.start();
});
afterAll(async () => {
  await server.stop();
});
afterEach(() => {
  for (const c of clients.splice(0)) c.close();
});

let seq = 0;
const unique = (prefix: string) => `${prefix}${process.pid}.${++seq}`;

function client(opts: Partial<ClientOptions> = {}) {
  const c = new Client({ url: server.url, reconnect: { minDelayMs: 50, maxDelayMs: 300 }, ...opts });
  clients.push(c);
  const got = new Map<string, Publication[]>();
  c.on('frame', (b) => {
    for (const p of b.publications) {
      let list = got.get(p.channel);
      if (!list) got.set(p.channel, (list = []));
      list.push(p);
    }
  });
  const offsets = (ch: string) => (got.get(ch) ?? []).map((p) => p.offset);
  return { c, got, offsets };
}

/** A WebSocket that a proxy refuses: it never opens and closes with 1006. */
class RefusedWebSocket {
  binaryType = 'arraybuffer';
  readyState = 3;
  protocol = '';
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: { code: number; reason: string }) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;
  static attempts = 0;
  constructor() {
    RefusedWebSocket.attempts++;
    setTimeout(() => {
      this.onerror?.({});
      this.onclose?.({ code: 1006, reason: '' });
    }, 5);
  }
  send() {
    throw new Error('not open');
  }
  close() {}
}

describe('long-polling', () => {
  it('subscribes, receives initial and live publications, and runs commands', async () => {
    const ch = unique('lp:');
    const room = unique('room:lp.');
    await server.publish(ch, 'first');
    const { c, got, offsets } = client({ transport: pollTransport() });
    const sub = c.subscribe(ch);
    await c.connect();
    expect(c.transportName).toBe('poll');
    await sub.ready;
    await until(() => offsets(ch).length === 1, 'initial value');
    for (let i = 0; i < 20; i++) await server.publish(ch, i);
    await until(() => offsets(ch).length === 21, 'live publications');
    expect(offsets(ch)).toEqual(Array.from({ length: 21 }, (_, i) => i + 1));
    expect(got.get(ch)![0].data).toBe('first');
    expect(await c.ping({ x: 1 })).toEqual({ x: 1 });
    const roomSub = c.subscribe(room);
    await roomSub.ready;
    expect((await c.publish(room, 'hi')).offset).toBe(1);
    await until(() => offsets(room).length === 1, 'own publication');
  });

  // Regression: publications in the same batch as their subscribe reply were dropped (the reply
  // is applied a microtask later).
  it('recovers what was published while the connection was down', async () => {
    const ch = unique('lp:rec.');
    const { c, offsets } = client({ transport: pollTransport() });
    const sub = c.subscribe(ch);
    await c.connect();
    await sub.ready;
    await server.publish(ch, 0);
    await until(() => offsets(ch).length === 1, 'first');
    c.dropConnection();
    for (let i = 1; i <= 30; i++) await server.publish(ch, i);
    await until(() => c.state === 'connected' && offsets(ch).length === 31, 'recovered publications');
    expect(offsets(ch)).toEqual(Array.from({ length: 31 }, (_, i) => i + 1));
    expect(c.stats.reconnects).toBeGreaterThanOrEqual(1);
  });
});

describe('fallback', () => {
  it('uses the WebSocket when it works', async () => {
    const { c } = client({ WebSocket: WebSocket as unknown as WebSocketConstructor });
    await c.connect();
    expect(c.transportName).toBe('websocket');
  });

  it('falls back to long-polling when the WebSocket is refused, transparently to the app', async () => {
    RefusedWebSocket.attempts = 0;
    const ch = unique('fb:');
    const { c, offsets } = client({ WebSocket: RefusedWebSocket as unknown as WebSocketConstructor });
    const sub = c.subscribe(ch);
    await c.connect();
    // Node has no EventSource: SSE is skipped, long-polling takes over.
    expect(c.transportName).toBe('poll');
    expect(RefusedWebSocket.attempts).toBe(1);
    await sub.ready;
    await server.publish(ch, 'a');
    await until(() => offsets(ch).length === 1, 'publication over the fallback');
    // The transport that worked is tried first on the next connection.
    c.dropConnection();
    await server.publish(ch, 'b');
    await until(() => c.state === 'connected' && offsets(ch).length === 2, 'recovered after the reconnect');
    expect(c.transportName).toBe('poll');
    expect(RefusedWebSocket.attempts).toBe(1);
    expect(offsets(ch)).toEqual([1, 2]);
  });

  it('an order without WebSocket never tries it', async () => {
    RefusedWebSocket.attempts = 0;
    const { c } = client({ WebSocket: RefusedWebSocket as unknown as WebSocketConstructor, transports: ['poll'] });
    await c.connect();
    expect(c.transportName).toBe('poll');
    expect(RefusedWebSocket.attempts).toBe(0);
  });
});
