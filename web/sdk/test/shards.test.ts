// The SDK against a real switchboard server on two real Redis shards, one of which goes down:
// the channels of the live shard are served and stream on, the channels of the dead one are
// refused for now (503) and asked again by the SDK until their shard is back.

import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import WebSocket from 'ws';
import { Client, type Publication, type Subscription, type WebSocketConstructor } from '../src/index.js';
import { Server, until } from './server.js';

const WS = WebSocket as unknown as WebSocketConstructor;

async function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once('error', fail);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => ok(port));
    });
  });
}

async function accepts(port: number): Promise<boolean> {
  return new Promise((ok) => {
    const c = createConnection({ host: '127.0.0.1', port }, () => {
      c.destroy();
      ok(true);
    });
    c.once('error', () => ok(false));
  });
}

/** A `redis-server` without persistence on a fixed port, killed and restarted by PID. */
class Redis {
  private proc: ChildProcess | null = null;
  private readonly dir = mkdtempSync(join(tmpdir(), 'sb-sdk-redis-'));
  constructor(readonly port: number) {}

  async start(): Promise<void> {
    const proc = spawn(
      'redis-server',
      ['--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', this.dir],
      { stdio: 'ignore' },
    );
    this.proc = proc;
    let waited = 0;
    while (!(await accepts(this.port))) {
      if (proc.exitCode !== null || waited++ > 500) throw new Error('redis-server did not start');
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  async kill(): Promise<void> {
    const p = this.proc;
    this.proc = null;
    if (!p || p.exitCode !== null) return;
    await new Promise<void>((ok) => {
      p.once('exit', () => ok());
      p.kill('SIGKILL');
    });
  }

  async stop(): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

const shards: Redis[] = [];
let server: Server;

beforeAll(async () => {
  for (let i = 0; i < 2; i++) {
    const r = new Redis(await freePort());
    await r.start();
    shards.push(r);
  }
  server = new Server(['--broker', shards.map((r) => `redis://127.0.0.1:${r.port}`).join(',')]);
  await server.start();
});
afterAll(async () => {
  await server?.stop();
  for (const r of shards) await r.stop();
});

it('serves the channels of a live shard while the dead shard\'s channels wait, then takes those too', async () => {
  const c = new Client({ url: server.url, WebSocket: WS, reconnect: { minDelayMs: 50, maxDelayMs: 500 } });
  try {
    const got = new Map<string, Publication[]>();
    c.on('frame', (b) => {
      for (const p of b.publications) got.set(p.channel, [...(got.get(p.channel) ?? []), p]);
    });
    await c.connect();
    const channels = Array.from({ length: 16 }, (_, i) => `room:sh${process.pid}.${i}`);
    // Every channel exists before the shard goes: each is published once.
    await server.publishBatch(channels.map((channel) => ({ channel, data: { n: 0 } })));

    await shards[1].kill();
    const subs: Subscription[] = c.subscribeMany(channels);
    // The dead shard's channels are refused for now and the live shard's served: which is
    // which shows in what publishing them answers.
    const results = await server.publishBatch(channels.map((channel) => ({ channel, data: { n: 1 } })));
    const live = channels.filter((_, i) => !('error' in (results[i] as object)));
    const dead = channels.filter((_, i) => 'error' in (results[i] as object));
    expect(live.length).toBeGreaterThan(0);
    expect(dead.length).toBeGreaterThan(0);
    const byName = new Map(subs.map((s) => [s.channel, s]));
    await until(() => live.every((ch) => byName.get(ch)!.state === 'subscribed'), 'the live shard\'s channels served');
    await until(() => live.every((ch) => (got.get(ch) ?? []).some((p) => (p.data as { n: number }).n === 1)), 'live publications');
    // Asked again and again while their shard is down: never given up, never subscribed.
    for (const ch of dead) expect(byName.get(ch)!.state).toBe('pending');
    expect(c.state).toBe('connected');

    await shards[1].start();
    await until(() => dead.every((ch) => byName.get(ch)!.state === 'subscribed'), 'the restarted shard\'s channels', 20_000);
    await server.publishBatch(channels.map((channel) => ({ channel, data: { n: 2 } })));
    await until(
      () => channels.every((ch) => (got.get(ch) ?? []).some((p) => (p.data as { n: number }).n === 2)),
      'publications on every channel after the shard came back',
    );
    // One connection all along: the dead shard's channels did not cost the others a reconnect.
    expect(c.stats.reconnects).toBe(0);
  } finally {
    c.close();
  }
});

it('keeps the connection when a shard fails under its subscriptions: only that shard\'s channels subscribe again', async () => {
  const c = new Client({ url: server.url, WebSocket: WS, reconnect: { minDelayMs: 50, maxDelayMs: 500 } });
  try {
    const got = new Map<string, number[]>();
    c.on('frame', (b) => {
      for (const p of b.publications) got.set(p.channel, [...(got.get(p.channel) ?? []), (p.data as { n: number }).n]);
    });
    await c.connect();
    const channels = Array.from({ length: 16 }, (_, i) => `room:sf${process.pid}.${i}`);
    await server.publishBatch(channels.map((channel) => ({ channel, data: { n: 0 } })));
    const subs = c.subscribeMany(channels);
    const byName = new Map(subs.map((s) => [s.channel, s]));
    await until(() => subs.every((s) => s.state === 'subscribed'), 'every channel subscribed');
    await server.publishBatch(channels.map((channel) => ({ channel, data: { n: 1 } })));
    await until(() => channels.every((ch) => (got.get(ch) ?? []).includes(1)), 'publications before the fault');

    await shards[1].kill();
    const results = await server.publishBatch(channels.map((channel) => ({ channel, data: { n: 2 } })));
    const live = channels.filter((_, i) => !('error' in (results[i] as object)));
    const dead = channels.filter((_, i) => 'error' in (results[i] as object));
    expect(live.length).toBeGreaterThan(0);
    expect(dead.length).toBeGreaterThan(0);
    // The server ends the dead shard's subscriptions alone; the SDK asks them again.
    await until(() => dead.every((ch) => byName.get(ch)!.state === 'pending'), 'the dead shard\'s channels asked again');
    await server.publishBatch(live.map((channel) => ({ channel, data: { n: 3 } })));
    await until(() => live.every((ch) => (got.get(ch) ?? []).includes(3)), 'the live shard streams on');

    await shards[1].start();
    await until(() => dead.every((ch) => byName.get(ch)!.state === 'subscribed'), 'the restarted shard\'s channels', 20_000);
    await server.publishBatch(channels.map((channel) => ({ channel, data: { n: 4 } })));
    await until(() => channels.every((ch) => (got.get(ch) ?? []).includes(4)), 'every channel after the shard came back');
    // The live shard's channels got each publication once, in order, on one connection.
    for (const ch of live) expect(got.get(ch)).toEqual([0, 1, 2, 3, 4]);
    expect(c.stats.reconnects).toBe(0);
  } finally {
    c.close();
  }
});
