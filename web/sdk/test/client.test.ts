// The SDK against a real switchboard server: subscriptions with initial values, publish,
// history, presence, many channels on one connection, per-frame batching, recovery across a
// dropped connection and across a server restart, JSON and MessagePack.

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import {
  Client,
  websocketTransport,
  type ClientOptions,
  type FrameBatch,
  type GapEvent,
  type Publication,
  type SubscribedEvent,
  type TransportFactory,
  type WebSocketConstructor,
} from '../src/index.js';
import { Server, until } from './server.js';

const WS = WebSocket as unknown as WebSocketConstructor;
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

/** A client that records every delivered frame and publication. */
function client(opts: Partial<ClientOptions> = {}) {
  const c = new Client({ url: server.url, WebSocket: WS, reconnect: { minDelayMs: 50, maxDelayMs: 500 }, ...opts });
  clients.push(c);
  const got = new Map<string, Publication[]>();
  const frames: FrameBatch[] = [];
  const gaps: GapEvent[] = [];
  const subscribed: SubscribedEvent[] = [];
  c.on('frame', (b) => {
    frames.push(b);
    for (const p of b.publications) {
      let list = got.get(p.channel);
      if (!list) got.set(p.channel, (list = []));
      list.push(p);
    }
  });
  c.on('gap', (g) => gaps.push(g));
  c.on('subscribed', (s) => subscribed.push(s));
  const offsets = (ch: string) => (got.get(ch) ?? []).map((p) => p.offset);
  return { c, got, frames, gaps, subscribed, offsets };
}

/** A transport that can be cut off: while `down`, every connection attempt fails at once. */
function gated(gate: { down: boolean }): TransportFactory {
  const real = websocketTransport({ WebSocket: WS });
  return (ctx) => {
    if (!gate.down) return real(ctx);
    setTimeout(() => ctx.handlers.onClose({ code: 1006, reason: 'network down' }), 5);
    return {
      name: 'down',
      send() {
        throw new Error('network down');
      },
      close() {},
    };
  };
}

let seq = 0;
const unique = (prefix: string) => `${prefix}${process.pid}.${++seq}`;

describe('subscriptions', () => {
  it('delivers the initial value, then live publications in order', async () => {
    const ch = unique('ev:init.');
    await server.publish(ch, { v: 1 });
    const { c, got, offsets } = client();
    const sub = c.subscribe(ch);
    await c.connect();
    const ready = await sub.ready;
    expect(ready.position.offset).toBe(1);
    await until(() => offsets(ch).length === 1, 'initial value');
    expect(got.get(ch)![0].data).toEqual({ v: 1 });
    for (let i = 2; i <= 5; i++) await server.publish(ch, { v: i });
    await until(() => offsets(ch).length === 5, 'live publications');
    expect(offsets(ch)).toEqual([1, 2, 3, 4, 5]);
    expect(got.get(ch)!.map((p) => (p.data as { v: number }).v)).toEqual([1, 2, 3, 4, 5]);
    expect(sub.position).toEqual({ epoch: ready.position.epoch, offset: 5 });
  });

  it('initial: false skips the stored value', async () => {
    const ch = unique('ev:noinit.');
    await server.publish(ch, 'old');
    const { c, got } = client();
    const sub = c.subscribe(ch, { initial: false });
    await c.connect();
    await sub.ready;
    await server.publish(ch, 'new');
    await until(() => (got.get(ch) ?? []).length === 1, 'the live publication');
    expect(got.get(ch)!.map((p) => p.data)).toEqual(['new']);
  });

  it('carries thousands of channels on one connection and subscribes and unsubscribes at any time', async () => {
    const n = 3000;
    const chans = Array.from({ length: n }, (_, i) => unique(`many.${i}.`));
    const { c, offsets } = client();
    await c.connect();
    const subs = c.subscribeMany(chans);
    await Promise.all(subs.map((s) => s.ready));
    expect(c.stats.subscriptions).toBe(n);
    await server.publishBatch(chans.map((channel, i) => ({ channel, data: i })));
    await until(() => chans.every((ch) => offsets(ch).length === 1), 'one publication on each channel');

    // Drop the first half; the second half keeps streaming on the same connection.
    c.unsubscribe(chans.slice(0, n / 2));
    const late = unique('late.');
    const lateSub = c.subscribe(late);
    await lateSub.ready;
    await server.publishBatch([...chans.map((channel) => ({ channel, data: 'again' })), { channel: late, data: 'end' }]);
    await until(() => offsets(late).length === 1, 'the sentinel after the batch');
    await until(() => chans.slice(n / 2).every((ch) => offsets(ch).length === 2), 'the second half');
    expect(chans.slice(0, n / 2).every((ch) => offsets(ch).length === 1)).toBe(true);
    expect(c.stats.reconnects).toBe(0);
  });

  it('handles of one channel share a subscription and each gets the publications', async () => {
    const ch = unique('shared.');
    const { c } = client();
    await c.connect();
    const a: unknown[] = [];
    const b: unknown[] = [];
    const sa = c.subscribe(ch, { onPublication: (p) => a.push(p.data) });
    await sa.ready;
    const sb = c.subscribe(ch, { onPublication: (p) => b.push(p.data) });
    await sb.ready;
    await server.publish(ch, 1);
    await until(() => a.length === 1 && b.length === 1, 'both handles');
    sa.unsubscribe();
    expect(sb.state).toBe('subscribed');
    await server.publish(ch, 2);
    await until(() => b.length === 2, 'the remaining handle');
    expect(a).toEqual([1]);
  });

  it('takes a channel back at once after unsubscribing it', async () => {
    const ch = unique('ev:again.');
    const { c, offsets, gaps } = client();
    await c.connect();
    const first = c.subscribe(ch);
    await first.ready;
    first.unsubscribe();
    const again = c.subscribe(ch);
    await expect(again.ready).resolves.toMatchObject({ channel: ch });
    await server.publish(ch, 'x');
    await until(() => offsets(ch).length === 1, 'a publication on the new subscription');
    expect(again.state).toBe('subscribed');
    expect(gaps).toEqual([]);
  });

  it('reports a refused channel on its handle without failing the others', async () => {
    const { c } = client();
    await c.connect();
    const [bad, good] = c.subscribeMany(['no spaces allowed', unique('fine.')]);
    await expect(bad.ready).rejects.toMatchObject({ code: 400 });
    expect(bad.state).toBe('error');
    await expect(good.ready).resolves.toMatchObject({ resubscribed: false });
  });
});

describe('trends', () => {
  it('brings the trend in the subscribed event, then live values continue it once', async () => {
    const ch = unique('pt:sdk-trend.');
    for (const v of [1, 4, 2]) await server.publish(ch, { v });
    const { c, got, subscribed } = client();
    await c.connect();
    c.subscribe(ch, { trend: { windowS: 60, stepS: 7 } });
    await until(() => subscribed.some((s) => s.channel === ch), 'subscribed');
    const ev = subscribed.find((s) => s.channel === ch)!;
    expect(ev.trend!.step_s).toBe(7);
    const b = ev.trend!.buckets;
    expect(b.reduce((n, x) => n + x.n, 0)).toBe(3);
    expect(Math.min(...b.map((x) => x.min))).toBe(1);
    expect(Math.max(...b.map((x) => x.max))).toBe(4);
    expect(b[b.length - 1].last).toBe(2);
    await until(() => (got.get(ch) ?? []).length === 1, 'the initial value');
    await server.publish(ch, { v: 9 });
    await until(() => (got.get(ch) ?? []).some((p) => (p.data as { v: number }).v === 9), 'live value');
    expect((got.get(ch) ?? []).map((p) => p.offset).join(',')).toBe('3,4');
  });
});

describe('per-frame delivery', () => {
  it('gives point channels their latest value per frame and other channels every publication', async () => {
    // A default-namespace channel treated as a point channel by the client: the server sends
    // every publication (no server-side conflation there), the client reduces them per frame.
    const pt = unique('burst.point.');
    const ev = unique('ev:burst.');
    const { c, got, frames } = client({ isPointChannel: (ch) => ch.includes('.point.') });
    await c.connect();
    await Promise.all(c.subscribeMany([pt, ev]).map((s) => s.ready));
    const batch = [];
    for (let i = 1; i <= 200; i++) batch.push({ channel: pt, data: { v: i } }, { channel: ev, data: i });
    await server.publishBatch(batch);
    await until(() => (got.get(ev) ?? []).length === 200, 'all 200 event publications');
    await until(() => (got.get(pt) ?? []).some((p) => (p.data as { v: number }).v === 200), 'the latest point');
    expect(got.get(ev)!.map((p) => p.data)).toEqual(Array.from({ length: 200 }, (_, i) => i + 1));
    // 400 publications arrived in a handful of frames, and the point channel was reduced.
    const pts = got.get(pt)!.map((p) => p.offset);
    expect(pts.length).toBeLessThan(200);
    expect([...pts].sort((a, b) => a - b)).toEqual(pts);
    expect(frames.length).toBeLessThan(100);
    expect(c.stats.received).toBeGreaterThan(c.stats.delivered);
  });
});

describe('commands', () => {
  it('publishes, reads history and presence in a room', async () => {
    const room = unique('room:r');
    const { c, got } = client({ name: 'sdk-test/1' });
    const other = client().c;
    await Promise.all([c.connect(), other.connect()]);
    await c.subscribe(room).ready;
    await other.subscribe(room).ready;
    const p1 = await c.publish(room, { text: 'hello' });
    const p2 = await c.publish(room, { text: 'again' });
    expect(p2.offset).toBe(p1.offset + 1);
    await until(() => (got.get(room) ?? []).length === 2, 'own publications');
    const h = await c.history(room, { since: { epoch: p1.epoch, offset: 0 } });
    expect(h.publications.map((p) => p.data)).toEqual([{ text: 'hello' }, { text: 'again' }]);
    expect(h.complete).toBe(true);
    const who = await c.presence(room);
    expect(who.map((x) => x.client).sort()).toEqual([c.info!.client, other.info!.client].sort());
    expect(await c.ping({ n: 1 })).toEqual({ n: 1 });
  });

  it('rejects with the server code when a command is refused', async () => {
    const { c } = client();
    await c.connect();
    // The default namespace does not allow client publishing.
    await expect(c.publish(unique('nopub.'), 1)).rejects.toMatchObject({ code: 403 });
    await expect(c.presence(unique('nopresence.'))).rejects.toMatchObject({ code: 403 });
  });

  it('sends the token in a connect command first when one is given', async () => {
    let asked = 0;
    const { c } = client({
      getToken: () => {
        asked++;
        return 'opaque-token';
      },
    });
    await c.connect();
    expect(asked).toBe(1);
    expect(c.info!.client).not.toBe('');
    c.dropConnection();
    await until(() => c.state === 'connected', 'reconnect');
    expect(asked).toBe(2);
  });
});

describe('recovery', () => {
  it('recovers exactly the publications missed while the connection was down', async () => {
    const ch = unique('ev:rec.');
    const gate = { down: false };
    const { c, offsets, subscribed } = client({ transport: gated(gate) });
    await c.connect();
    await c.subscribe(ch).ready;
    for (let i = 0; i < 3; i++) await server.publish(ch, i);
    await until(() => offsets(ch).length === 3, 'first publications');

    gate.down = true;
    c.dropConnection();
    for (let i = 3; i < 13; i++) await server.publish(ch, i);
    await new Promise((r) => setTimeout(r, 200));
    expect(c.state).not.toBe('connected');
    gate.down = false;

    await until(() => offsets(ch).length === 13, 'the missed publications');
    expect(offsets(ch)).toEqual(Array.from({ length: 13 }, (_, i) => i + 1));
    const again = subscribed.filter((s) => s.channel === ch && s.resubscribed);
    expect(again).toHaveLength(1);
    expect(again[0].recovered).toBe(10);
    expect(c.stats.reconnects).toBe(1);
    await server.publish(ch, 13);
    await until(() => offsets(ch).length === 14, 'live again');
  });

  it('recovers after close() and connect() too, for every channel', async () => {
    const chans = [unique('ev:cc.'), unique('ev:cc.')];
    const { c, offsets } = client();
    await c.connect();
    await Promise.all(c.subscribeMany(chans).map((s) => s.ready));
    c.close();
    for (const ch of chans) for (let i = 0; i < 5; i++) await server.publish(ch, i);
    await c.connect();
    await until(() => chans.every((ch) => offsets(ch).length === 5), 'recovered publications');
    for (const ch of chans) expect(offsets(ch)).toEqual([1, 2, 3, 4, 5]);
  });

  it('surfaces complete: false as a gap event when history no longer reaches back', async () => {
    const ch = unique('ev:gap.');
    const { c, offsets, gaps } = client();
    await c.connect();
    await c.subscribe(ch).ready;
    c.close();
    // The default namespace keeps 100 publications.
    await server.publishBatch(Array.from({ length: 150 }, (_, i) => ({ channel: ch, data: i })));
    await c.connect();
    await until(() => gaps.length === 1, 'the gap event');
    expect(gaps[0]).toMatchObject({ channel: ch, epochChanged: false, from: { offset: 0 }, to: { offset: 150 } });
    // What history still holds is recovered; the gap says the first 50 are gone.
    await until(() => offsets(ch).includes(150), 'the latest value');
    expect(offsets(ch)).toEqual(Array.from({ length: 100 }, (_, i) => 51 + i));
  });

  it('ends a gap with the latest value: the gap event first, then the value, once', async () => {
    // A point channel keeps no history: what was published while the client was away is gone,
    // and the latest value stands for it.
    const pt = unique('pt:gap.');
    const { c, got, gaps } = client();
    const order: string[] = [];
    c.on('gap', (g) => order.push(`gap ${g.channel}`));
    c.on('frame', (b) => {
      for (const p of b.publications) order.push(`pub ${p.channel} ${p.offset}`);
    });
    await c.connect();
    await c.subscribe(pt).ready;
    await server.publish(pt, { v: 1 });
    await until(() => (got.get(pt) ?? []).length === 1, 'the first value');
    c.close();
    for (let v = 2; v <= 4; v++) await server.publish(pt, { v });
    await c.connect();
    await until(() => (got.get(pt) ?? []).length === 2, 'the latest value after the gap');
    expect(got.get(pt)!.map((p) => [p.offset, p.data])).toEqual([
      [1, { v: 1 }],
      [4, { v: 4 }],
    ]);
    expect(gaps).toMatchObject([{ channel: pt, epochChanged: false, from: { offset: 1 }, to: { offset: 4 } }]);
    expect(order.indexOf(`gap ${pt}`)).toBeLessThan(order.indexOf(`pub ${pt} 4`));

    // One missed publication that is the latest value itself: delivered, and nothing was lost.
    c.close();
    await server.publish(pt, { v: 5 });
    await c.connect();
    await until(() => (got.get(pt) ?? []).length === 3, 'the one missed value');
    expect(got.get(pt)![2]).toMatchObject({ offset: 5, data: { v: 5 } });
    expect(gaps).toHaveLength(1);
  });

  it('survives a server restart: reconnects, reports the new epoch, loses nothing published since', async () => {
    const own = new Server();
    await own.start();
    try {
      const ch = unique('ev:restart.');
      const pt = unique('pt:restart.');
      const gate = { down: false };
      const c = new Client({
        url: own.url,
        transport: gated(gate),
        reconnect: { minDelayMs: 100, maxDelayMs: 400 },
      });
      clients.push(c);
      const got: Publication[] = [];
      const pts: Publication[] = [];
      const gaps: GapEvent[] = [];
      c.on('frame', (b) => {
        for (const p of b.publications) (p.channel === ch ? got : pts).push(p);
      });
      c.on('gap', (g) => gaps.push(g));
      const resubscribed: SubscribedEvent[] = [];
      c.on('subscribed', (ev) => {
        if (ev.channel === ch && ev.resubscribed) resubscribed.push(ev);
      });
      await c.connect();
      await Promise.all(c.subscribeMany([ch, pt]).map((s) => s.ready));
      await own.publish(ch, 'before');
      await until(() => got.length === 1, 'the first publication');
      const oldEpoch = c.subscribe(ch).position!.epoch;

      await own.kill();
      await until(() => c.state !== 'connected', 'the client to notice');
      // The client cannot get through until the publications below are made, so they can only
      // arrive through its recovery: the new epoch's history.
      gate.down = true;
      await own.start(); // same port, new process: every channel gets a new epoch
      for (let i = 1; i <= 20; i++) await own.publish(ch, `after-${i}`);
      await own.publish(pt, { v: 42 });
      gate.down = false;

      await until(() => got.length === 21, 'every publication after the restart');
      expect(got.slice(1).map((p) => p.data)).toEqual(Array.from({ length: 20 }, (_, i) => `after-${i + 1}`));
      expect(got.slice(1).map((p) => p.offset)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
      expect(gaps.find((g) => g.channel === ch)).toMatchObject({ epochChanged: true, from: { epoch: oldEpoch } });
      // The recovery from the old epoch carried the new epoch's publications: delivered from it.
      expect(resubscribed.map((ev) => ev.recovered)).toEqual([20]);
      await until(() => pts.some((p) => (p.data as { v: number }).v === 42), 'the point value');
      // Never published before the restart, complete in the new epoch: nothing was missed.
      expect(gaps.find((g) => g.channel === pt)).toBeUndefined();
      await own.publish(ch, 'live');
      await until(() => got.length === 22, 'live after the restart');
      expect(got[21]).toMatchObject({ offset: 21, data: 'live' });
    } finally {
      await own.stop();
    }
  });

  it('stops reconnecting when the server says not to', async () => {
    const own = new Server();
    await own.start();
    try {
      const c = new Client({ url: own.url, WebSocket: WS, reconnect: { minDelayMs: 50 } });
      clients.push(c);
      const events: { reconnect: boolean; code: number }[] = [];
      c.on('disconnected', (d) => events.push(d));
      await c.connect();
      // SIGTERM: the server says goodbye with 4000 and `reconnect: true`.
      await own.kill('SIGTERM');
      await until(() => events.length >= 1, 'the disconnect');
      expect(events[0]).toMatchObject({ code: 4000, reconnect: true });
    } finally {
      await own.stop();
    }
  });
});

describe('msgpack', () => {
  it('speaks the MessagePack subprotocol for every command and delivery', async () => {
    const room = unique('room:mp');
    const pt = unique('pt:mp.');
    await server.publish(pt, { v: [1.5, 2.5, 3.5], q: 'good' });
    const { c, got, offsets } = client({ format: 'msgpack' });
    await c.connect();
    await Promise.all(c.subscribeMany([room, pt]).map((s) => s.ready));
    await until(() => (got.get(pt) ?? []).length === 1, 'the initial point');
    expect(got.get(pt)![0].data).toEqual({ v: [1.5, 2.5, 3.5], q: 'good' });
    const r = await c.publish(room, { text: 'binary', n: 7, ok: true, nested: { a: [null, 'x'] } });
    expect(r.offset).toBe(1);
    await until(() => offsets(room).length === 1, 'own publication');
    expect(got.get(room)![0].data).toEqual({ text: 'binary', n: 7, ok: true, nested: { a: [null, 'x'] } });
    const h = await c.history(room, { since: { epoch: r.epoch, offset: 0 } });
    expect(h.publications.map((p) => p.offset)).toEqual([1]);
    expect((await c.presence(room)).length).toBe(1);

    c.close();
    await server.publish(room, { text: 'while away' });
    await c.connect();
    await until(() => offsets(room).length === 2, 'recovered over msgpack');
    expect(got.get(room)![1].data).toEqual({ text: 'while away' });
  });
});
