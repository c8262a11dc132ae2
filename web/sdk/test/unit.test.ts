// Pieces that need no server: backoff jitter, frame codecs, per-frame batching, the alarm book.

import { describe, expect, it } from 'vitest';
import { AlarmBook, Backoff, FrameBatcher, JsonCodec, MsgpackCodec, baseUrlOf, type AlarmState, type FrameBatch } from '../src/index.js';

describe('backoff', () => {
  it('draws each delay uniformly from a window that doubles up to the cap', () => {
    const b = new Backoff({ minDelayMs: 100, maxDelayMs: 1000 }, () => 0.999);
    const delays = Array.from({ length: 6 }, () => b.next());
    expect(delays).toEqual([99, 199, 399, 799, 999, 999]);
    b.reset();
    expect(b.window()).toBe(100);
    const zero = new Backoff({ minDelayMs: 100 }, () => 0);
    expect(zero.next()).toBe(0);
  });
});

describe('codecs', () => {
  it('splits a JSON frame of several messages, including strings with escaped newlines', () => {
    const c = new JsonCodec();
    const frame = '{"pub":{"ch":"a","off":1,"data":"x\\ny"}}\n{"id":2,"ok":{}}\n';
    expect(c.decode(frame)).toEqual([{ pub: { ch: 'a', off: 1, data: 'x\ny' } }, { id: 2, ok: {} }]);
    expect(c.encode([{ id: 1, ping: {} }, { id: 2, ping: {} }]).split('\n')).toHaveLength(2);
  });

  it('round-trips concatenated MessagePack maps', () => {
    const c = new MsgpackCodec();
    const bytes = c.encode([{ id: 1, publish: { channel: 'a', data: { v: 1 } } }, { id: 2, ping: {} }]);
    // Decoding reads the same structures back (the server's replies use the same framing).
    expect(c.decode(bytes)).toEqual([{ id: 1, publish: { channel: 'a', data: { v: 1 } } }, { id: 2, ping: {} }]);
  });

  it('normalizes server URLs', () => {
    expect(baseUrlOf('ws://h:1/ws')).toBe('http://h:1');
    expect(baseUrlOf('https://h/base/')).toBe('https://h/base');
    expect(baseUrlOf('127.0.0.1:8700')).toBe('http://127.0.0.1:8700');
  });
});

describe('frame batcher', () => {
  it('keeps the latest point per frame at its first place and every other publication', () => {
    const frames: FrameBatch[] = [];
    let run: (() => void) | null = null;
    const b = new FrameBatcher((f) => frames.push(f), (flush) => (run = flush));
    b.push({ channel: 'pt:a', offset: 1, data: 1 }, true);
    b.push({ channel: 'ev', offset: 1, data: 'x' }, false);
    b.push({ channel: 'pt:a', offset: 2, data: 2 }, true);
    b.push({ channel: 'ev', offset: 2, data: 'y' }, false);
    expect(frames).toHaveLength(0);
    run!();
    expect(frames).toHaveLength(1);
    expect(frames[0].received).toBe(4);
    expect(frames[0].publications.map((p) => `${p.channel}@${p.offset}`)).toEqual(['pt:a@2', 'ev@1', 'ev@2']);
  });

  it('keeps every historical publication of a point and its latest live one after them, in offset order', () => {
    const frames: FrameBatch[] = [];
    let run: (() => void) | null = null;
    const b = new FrameBatcher((f) => frames.push(f), (flush) => (run = flush));
    const shown = () => frames[frames.length - 1].publications.map((p) => `${p.channel}@${p.offset}${p.historical ? 'h' : ''}`);
    b.push({ channel: 'pt:a', offset: 1, data: 1 }, true);
    b.push({ channel: 'pt:a', offset: 2, data: 0, historical: true }, true);
    run!();
    expect(shown(), 'a back-fill never replaces the live value').toEqual(['pt:a@1', 'pt:a@2h']);
    b.push({ channel: 'pt:a', offset: 3, data: 3 }, true);
    b.push({ channel: 'pt:b', offset: 1, data: 1 }, true);
    b.push({ channel: 'pt:a', offset: 4, data: 0, historical: true }, true);
    b.push({ channel: 'pt:a', offset: 5, data: 0, historical: true }, true);
    b.push({ channel: 'pt:a', offset: 6, data: 6 }, true);
    b.push({ channel: 'pt:a', offset: 7, data: 7 }, true);
    run!();
    expect(frames[1].received).toBe(6);
    expect(shown()).toEqual(['pt:b@1', 'pt:a@4h', 'pt:a@5h', 'pt:a@7']);
  });
});

describe('alarm book', () => {
  const state = (id: string, seq: number, over: Partial<AlarmState> = {}): AlarmState => ({
    id,
    def: id,
    channel: `pt:${id}`,
    state: 'active_unacked',
    active: true,
    severity: 'hi',
    priority: 'medium',
    value: 1,
    since: 1000,
    message: '',
    acked_by: null,
    acked_at: null,
    comment: null,
    shelved_until: null,
    seq,
    ...over,
  });

  it('keeps the state with the higher seq, whichever arrives first', () => {
    const b = new AlarmBook();
    expect(b.apply(state('a', 3, { state: 'active_acked', acked_by: 'user:ana' }))).toBe(true);
    // The list read after subscribing may be older than a publication already applied.
    expect(b.applyAll([state('a', 2), state('b', 1)])).toBe(true);
    expect(b.get('a')?.state).toBe('active_acked');
    expect(b.apply(state('a', 3))).toBe(false);
    expect(b.apply(state('a', 4, { state: 'normal', active: false }))).toBe(true);
    expect(b.get('a')?.state).toBe('normal');
    expect(b.apply({ not: 'a state' } as unknown as AlarmState)).toBe(false);
    expect(b.size).toBe(2);
    // A removed definition's last state drops the alarm, and an older state does not bring it back.
    expect(b.apply(state('b', 2, { removed: true }))).toBe(true);
    expect(b.get('b')).toBeUndefined();
    expect(b.applyAll([state('b', 1)])).toBe(false);
    expect(b.list().map((a) => a.id)).toEqual(['a']);
    expect(b.size).toBe(1);
  });

  it('lists worst first: unacknowledged, active, priority, newest', () => {
    const b = new AlarmBook();
    b.applyAll([
      state('acked-critical', 1, { state: 'active_acked', priority: 'critical' }),
      state('rtn-high', 1, { state: 'rtn_unacked', active: false, priority: 'high' }),
      state('unacked-low-old', 1, { priority: 'low', since: 1 }),
      state('unacked-low-new', 1, { priority: 'low', since: 2 }),
      state('unacked-critical', 1, { priority: 'critical' }),
      state('shelved', 1, { state: 'shelved', priority: 'critical' }),
      state('normal', 1, { state: 'normal', active: false, priority: 'critical' }),
    ]);
    expect(b.list().map((a) => a.id)).toEqual([
      'unacked-critical',
      'unacked-low-new',
      'unacked-low-old',
      'rtn-high',
      'acked-critical',
      'shelved',
      'normal',
    ]);
  });
});
