// The client against a scripted server: the test reads the commands the client sends and
// writes what a node would answer, including what a node sends only in some setups —
// historical publications (a plant source's back-fill) and `subscribed` pushes (the
// application's connect hook). No process, no socket.

import { describe, expect, it } from 'vitest';
import type { Publication } from '../src/index.js';
import type { WirePub } from '../src/types.js';
import { scripted as scriptedClient, until } from './scripted-server.js';

/** `scripted()` of scripted-server.ts, with the `subscribeError`s as `{ channel, code }` and
 * `flush` giving the frame's publications as `channel@offset` (`h` marks historical). */
function scripted() {
  const s = scriptedClient();
  const errors: { channel: string; code: number }[] = [];
  s.c.on('subscribeError', (e) => errors.push({ channel: e.channel, code: e.error.code }));
  const flush = async (): Promise<string[]> =>
    (await s.flush()).map((p) => `${p.channel}@${p.offset}${p.historical ? 'h' : ''}`);
  return { ...s, errors, flush };
}

const point = (ch: string, off: number, v: number, t: number, hist = false): WirePub =>
  hist ? { ch, off, data: { v, t, q: 'good' }, hist: true } : { ch, off, data: { v, t, q: 'good' } };

describe('historical publications', () => {
  it('are delivered in offset order with the flag, move the position, and never become the latest value', async () => {
    const { server, c, gaps, flush } = scripted();
    const sub = c.subscribe('pt:a');
    void c.connect();
    const conn = await server.conn(1);
    await conn.accept();
    const s = await conn.next();
    expect(s.subscribe?.channels).toEqual(['pt:a']);
    conn.push(
      { id: s.id, ok: { channels: { 'pt:a': { epoch: 'e', offset: 5, last: point('pt:a', 5, 10, 5_000), recovered: [], complete: true } } } },
      { pub: point('pt:a', 6, 11, 6_000) },
      { pub: point('pt:a', 7, 3, 1_000, true) },
    );
    expect(await flush(), 'the latest live value of the frame, then the back-filled one').toEqual(['pt:a@6', 'pt:a@7h']);
    expect(sub.position).toEqual({ epoch: 'e', offset: 7 });
    expect(c.stats.received).toBe(2);

    // In one frame of a point channel the live value supersedes the live one before it, never
    // a historical one; the order stays the offsets'.
    conn.push({ pub: point('pt:a', 8, 12, 8_000) }, { pub: point('pt:a', 9, 4, 2_000, true) }, { pub: point('pt:a', 10, 13, 10_000) });
    expect(await flush()).toEqual(['pt:a@9h', 'pt:a@10']);
    conn.push({ pub: point('pt:a', 11, 5, 3_000, true) });
    expect(await flush()).toEqual(['pt:a@11h']);

    // A handle added later starts from the current value: the newest live one, not the back-fill.
    const late: Publication[] = [];
    c.subscribe('pt:a').on('publication', (p) => late.push(p));
    await until(() => late.length > 0, 'the initial value');
    expect(late.map((p) => [p.offset, (p.data as { v: number }).v, p.historical])).toEqual([[10, 13, undefined]]);

    // Recovery resumes after the historical one, and takes recovered historical ones the same way.
    conn.drop();
    const again = await server.conn(2);
    await again.accept();
    const r = await again.next();
    expect(r.subscribe?.recover).toEqual({ 'pt:a': { epoch: 'e', offset: 11 } });
    again.push({
      id: r.id,
      ok: { channels: { 'pt:a': { epoch: 'e', offset: 12, last: null, recovered: [point('pt:a', 12, 6, 4_000, true)], complete: true } } },
    });
    expect(await flush()).toEqual(['pt:a@12h']);
    expect(gaps).toEqual([]);
    expect(sub.position).toEqual({ epoch: 'e', offset: 12 });
    const later: Publication[] = [];
    c.subscribe('pt:a').on('publication', (p) => later.push(p));
    await until(() => later.length > 0, 'the initial value');
    expect(later[0].offset).toBe(10);
  });

  it('come with the flag from history reads', async () => {
    const { server, c } = scripted();
    void c.connect();
    const conn = await server.conn(1);
    await conn.accept();
    const read = c.history('room:h', { limit: 10 });
    const h = await conn.next();
    conn.push({ id: h.id, ok: { publications: [{ ch: 'room:h', off: 1, data: 'a' }, { ch: 'room:h', off: 2, data: 'b', hist: true }], epoch: 'e', offset: 2 } });
    const r = await read;
    expect(r.publications.map((p) => [p.offset, p.historical])).toEqual([
      [1, undefined],
      [2, true],
    ]);
  });
});

describe('subscribed push', () => {
  it('follows the channels the server subscribed: events, deliveries, recovery from history across reconnects', async () => {
    const { server, c, subscribed, errors, gaps, flush } = scripted();
    void c.connect();
    const conn = await server.conn(1);
    const hello = await conn.next();
    // The connect hook's channels are subscribed before the connect reply.
    conn.push(
      {
        subscribed: {
          channels: {
            'room:s': { epoch: 'e', offset: 3, last: null, recovered: [], complete: true },
            'room:x': { error: { code: 400, message: 'bad channel name' } },
          },
        },
      },
      { id: hello.id, ok: { client: 'c1', node: 'n1', ping_s: 25 } },
    );
    expect(subscribed).toEqual([{ channel: 'room:s', position: { epoch: 'e', offset: 3 }, resubscribed: false, recovered: 0, server: true }]);
    expect(errors).toEqual([{ channel: 'room:x', code: 400 }]);
    await until(() => c.state === 'connected', 'connected');
    conn.push({ pub: { ch: 'room:s', off: 4, data: 'four' } });
    expect(await flush()).toEqual(['room:s@4']);
    expect(c.channels()).toEqual(['room:s']);

    // A handle on it shares the server's subscription: no subscribe goes out.
    const got: number[] = [];
    const sub = c.subscribe('room:s', { initial: false });
    sub.on('publication', (p) => got.push(p.offset));
    await sub.ready;
    conn.push({ pub: { ch: 'room:s', off: 5, data: 'five' } });
    await flush();
    expect(got).toEqual([5]);
    sub.unsubscribe();
    await new Promise((r) => setTimeout(r, 5));
    expect(conn.untaken()).toEqual([]);
    expect(c.channels()).toEqual(['room:s']);

    // Reconnected: the server subscribes it again without recovery; what was published
    // meanwhile is read from history, live publications wait for it, nothing is a gap.
    conn.drop();
    const again = await server.conn(2);
    const hello2 = await again.next();
    again.push(
      { subscribed: { channels: { 'room:s': { epoch: 'e', offset: 7, last: null, recovered: [], complete: true } } } },
      { id: hello2.id, ok: { client: 'c1', node: 'n1', ping_s: 25 } },
    );
    const h = await again.next();
    expect(h.history).toEqual({ channel: 'room:s', since: { epoch: 'e', offset: 5 }, limit: 2 });
    again.push({ pub: { ch: 'room:s', off: 8, data: 'eight' } });
    again.push({
      id: h.id,
      ok: { publications: [6, 7].map((off) => ({ ch: 'room:s', off, data: off })), epoch: 'e', offset: 8 },
    });
    await until(() => subscribed.length === 2, 'the second subscribed event');
    expect(await flush()).toEqual(['room:s@6', 'room:s@7', 'room:s@8']);
    expect(subscribed[1]).toMatchObject({ channel: 'room:s', resubscribed: true, recovered: 2, server: true });
    expect(gaps).toEqual([]);
    expect(again.untaken()).toEqual([]);

    // History no longer holding what was missed is a gap, reported before what it still had.
    again.drop();
    const third = await server.conn(3);
    const hello3 = await third.next();
    third.push(
      { subscribed: { channels: { 'room:s': { epoch: 'e', offset: 12, last: null, recovered: [], complete: true } } } },
      { id: hello3.id, ok: { client: 'c1', node: 'n1', ping_s: 25 } },
    );
    const h3 = await third.next();
    third.push({ id: h3.id, ok: { publications: [{ ch: 'room:s', off: 12, data: 12 }], epoch: 'e', offset: 12, complete: false } });
    await until(() => gaps.length === 1, 'the gap');
    expect(gaps[0]).toEqual({ channel: 'room:s', from: { epoch: 'e', offset: 8 }, to: { epoch: 'e', offset: 12 }, epochChanged: false });
    expect(await flush()).toEqual(['room:s@12']);

    // The application ends it like any subscription.
    c.unsubscribe('room:s');
    const u = await third.next();
    expect(u.unsubscribe).toEqual({ channels: ['room:s'] });
    expect(c.channels()).toEqual([]);
  });

  it('takes over a channel the application subscribed before: no second subscribe, its handles get the publications', async () => {
    const { server, c, subscribed, flush } = scripted();
    const got: number[] = [];
    c.subscribe('room:both', { onPublication: (p) => got.push(p.offset) });
    void c.connect();
    const conn = await server.conn(1);
    const hello = await conn.next();
    conn.push(
      { subscribed: { channels: { 'room:both': { epoch: 'e', offset: 2, last: null, recovered: [], complete: true } } } },
      { id: hello.id, ok: { client: 'c1', node: 'n1', ping_s: 25 } },
    );
    await until(() => c.state === 'connected', 'connected');
    conn.push({ pub: { ch: 'room:both', off: 3, data: 3 } });
    await flush();
    expect(got).toEqual([3]);
    expect(subscribed.map((s) => s.server)).toEqual([true]);
    await new Promise((r) => setTimeout(r, 5));
    expect(conn.untaken()).toEqual([]);
  });
});
