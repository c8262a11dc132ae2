// Per-channel recovery: what a subscribe reply, a live publication and an epoch change do to one
// channel's position and deliveries. For each channel, publications are delivered in offset order
// and at most once: recovered ones first, then live ones; those that arrive before their
// subscribe reply is applied wait for it, and after an epoch change without recovered
// publications the new epoch's history is read first (live ones held meanwhile). A gap — what
// history no longer holds — is reported (the `gap` event) before what could still be delivered,
// and ends with the channel's latest value; a channel whose stream shows nothing missed reports
// no gap. A subscription the server made for the connection (a `subscribed` push) is taken the
// same way, what it missed since the channel's position read from history. Historical
// publications (back-filled values) are delivered in offset order like the others but never
// become the channel's latest value. A subscription with a `filter` is sent only matching
// publications, live and recovered: holes in its offsets are not gaps, only the server's
// `complete: false` (or an old epoch's publications) is one, and a new epoch's history is not
// read for it (history is not filtered).

import type { FrameBatcher } from './batcher.js';
import type { Emitter } from './emitter.js';
import type { ClientEvents, SubscribedEvent } from './events.js';
import type { Subscription } from './subscription.js';
import {
  toPublication,
  type SwitchboardError,
  type Position,
  type Publication,
  type ReplyBodies,
  type WireChannelResult,
  type WirePub,
} from './types.js';

/** Per-channel state, shared by the channel's handles. */
export interface Entry {
  channel: string;
  point: boolean;
  handles: Set<Subscription>;
  /** `pending`: to be sent; `sending`: awaiting its reply; `waiting`: refused for now (503,
   * its broker shard is failing over), asked again after a delay. */
  status: 'pending' | 'sending' | 'waiting' | 'subscribed' | 'error';
  /** Position of the latest publication delivered (or covered by a subscribe reply). */
  position: Position | null;
  /** Id of the subscribe command awaiting its reply. */
  inflight: number;
  initial: boolean;
  everSubscribed: boolean;
  /** Live publications held while the new epoch's history is fetched. */
  filling: boolean;
  fillToken: number;
  buffer: WirePub[];
  /** Publications that arrived before their subscribe reply was applied: a reply resolves in a
   * microtask, and the publications after it in the same frame (or poll batch) come first. */
  early: WirePub[];
  /** The latest live publication delivered, for handles added later with `initial`: never a
   * historical one, which is not the channel's current value. */
  latest: Publication | null;
  /** The options asked for per command (`max_rate_hz`, `deadband`, `trend`, `delta`,
   * `filter`), as JSON; '' for none. */
  sampling: string;
  /** The subscription has a `filter`: holes in its offsets are not gaps. */
  filtered: boolean;
  /** The server made this subscription (a `subscribed` push): the entry stays without handles
   * until the application unsubscribes the channel. */
  server: boolean;
}

/** A new channel's entry, to be sent (`pending`); from `recover` when given. */
export function createEntry(channel: string, point: boolean, initial: boolean, recover: Position | null, sampling: string): Entry {
  return {
    channel,
    point,
    handles: new Set(),
    status: 'pending',
    position: recover ? { ...recover } : null,
    inflight: 0,
    initial,
    everSubscribed: false,
    filling: false,
    fillToken: 0,
    buffer: [],
    early: [],
    latest: null,
    sampling,
    filtered: sampling !== '' && 'filter' in (JSON.parse(sampling) as object),
    server: false,
  };
}

/** A channel's result in a subscribe reply or a `subscribed` push, when it was subscribed. */
export type ChannelOk = Exclude<WireChannelResult, { error: unknown }>;

/** What recovery needs of its client. */
export interface RecoveryHost {
  readonly events: Emitter<ClientEvents>;
  readonly batcher: FrameBatcher;
  readonly entries: Map<string, Entry>;
  /** Read the new epoch's history after an epoch change (non-point channels). */
  readonly fillOnEpochChange: boolean;
  /** Most publications read by that fill. */
  readonly fillLimit: number;
  history(channel: string, since: Position, limit: number): Promise<ReplyBodies['history']>;
  /** A delta push of a subscribed channel could not be rebuilt (`p.broken`), at an offset past
   * its position: its stream has a hole the client recovers. */
  deltaFailed(e: Entry, p: WirePub): void;
}

/** Whether publications after offset `from` up to `upTo` are missing from `pubs` (in offset
 * order, repeats and older ones ignored): what a resubscription could not deliver. */
function missed(from: number, pubs: WirePub[], upTo: number): boolean {
  let at = from;
  for (const p of pubs) {
    if (p.off <= at) continue;
    if (p.off !== at + 1) return true;
    at = p.off;
  }
  return upTo > at;
}

export class Recovery {
  constructor(private readonly host: RecoveryHost) {}

  refuse(e: Entry, err: SwitchboardError): void {
    e.status = 'error';
    e.early = [];
    this.host.events.emit('subscribeError', { channel: e.channel, error: err });
    for (const h of e.handles) h.emit('error', err);
  }

  /** Applies a channel's subscribe result; `server`: the server made the subscription (a
   * `subscribed` push), which the `subscribed` event says. */
  accept(e: Entry, r: ChannelOk, server = false): void {
    const prev = e.position ? { ...e.position } : null;
    const resubscribed = e.everSubscribed || prev !== null;
    e.status = 'subscribed';
    e.everSubscribed = true;
    let recovered = 0;
    const now: Position = { epoch: r.epoch, offset: r.offset };
    if (prev && prev.epoch === r.epoch) {
      // Ahead of the channel in its own epoch: the broker lost its newest publications, and
      // the channel's next offsets are new ones, not repeats.
      const behind = r.complete === false && r.offset < prev.offset;
      if (behind) e.position = { ...now };
      const last = r.complete === false && r.last ? [r.last] : [];
      // The gap first, then what history still has, then the latest value. A filtered
      // subscription's holes are publications that did not match: only the server knows.
      const holes = e.filtered || missed(e.position!.offset, [...(r.recovered ?? []), ...last], r.offset);
      if (r.complete === false && (behind || holes)) {
        this.gap(e, prev, now, false);
      }
      recovered = this.replay(e, r.recovered ?? []);
      if (r.complete === false && r.last && r.last.off > e.position!.offset) this.deliver(e, r.last);
      if (r.offset > e.position!.offset) e.position = { epoch: r.epoch, offset: r.offset };
    } else if (prev) {
      const fresh = r.recovered ?? [];
      // The old epoch's publications after the last one delivered may be lost with it; a
      // channel never published before the change and complete in the new epoch lost nothing.
      const holes = !e.filtered && missed(0, [...fresh, ...(r.last ? [r.last] : [])], r.offset);
      if (prev.offset > 0 || holes) this.gap(e, prev, now, true);
      e.position = { epoch: r.epoch, offset: 0 };
      if (fresh.length > 0) {
        // A recovery from another epoch carries what the new epoch holds, oldest first.
        recovered = this.replay(e, fresh);
        if (r.last && r.last.off > e.position.offset) this.deliver(e, r.last);
        if (r.offset > e.position.offset) e.position = now;
      } else if (!e.point && !e.filtered && this.host.fillOnEpochChange && r.offset > 0) {
        this.fill(e, now, r.last ?? null);
      } else {
        if (r.last) this.deliver(e, r.last);
        e.position = now;
      }
    } else {
      if (e.initial && r.last) this.deliver(e, r.last);
      e.position = now;
    }
    const ev: SubscribedEvent = { channel: e.channel, position: { ...now }, resubscribed, recovered };
    if (r.trend) ev.trend = r.trend;
    if (server) ev.server = true;
    this.host.events.emit('subscribed', ev);
    for (const h of e.handles) h.emit('subscribed', ev);
    const early = e.early;
    e.early = [];
    for (const p of early) this.route(p);
  }

  /**
   * A subscription the server made for this connection (a `subscribed` push: the connect
   * hook's channels). The server asked no recovery: a channel first seen starts at its
   * position like a first subscribe; one followed on an earlier connection that fell behind
   * in the same epoch reads what it missed from history (live publications held meanwhile),
   * then goes on as a recovery would, a gap reported for what history no longer holds.
   */
  adopt(e: Entry, r: ChannelOk): void {
    const prev = e.position;
    if (!prev || prev.epoch !== r.epoch || r.offset <= prev.offset) {
      // Ahead of the channel in its own epoch: the broker lost its newest publications (what
      // `complete: false` says to a recovery).
      const behind = prev !== null && prev.epoch === r.epoch && r.offset < prev.offset;
      this.accept(e, behind ? { ...r, complete: false } : r, true);
      return;
    }
    // Marked `sending`: live publications wait in `early` until the history read's result is
    // applied, so they are delivered after what it recovers, in offset order.
    e.status = 'sending';
    const token = ++e.fillToken;
    const from = { epoch: prev.epoch, offset: Math.max(prev.offset, r.offset - this.host.fillLimit) };
    void this.read(e, from, r.offset - from.offset, token).then((pubs) => {
      if (this.host.entries.get(e.channel) !== e || e.fillToken !== token) return;
      const got = pubs.filter((p) => p.off <= r.offset);
      this.accept(e, { ...r, recovered: got, complete: !missed(prev.offset, got, r.offset) }, true);
    });
  }

  /** Delivers the recovered publications past the channel's position; how many that was. */
  private replay(e: Entry, pubs: WirePub[]): number {
    let n = 0;
    for (const p of pubs) {
      if (p.off > e.position!.offset) {
        this.deliver(e, p);
        n++;
      }
    }
    return n;
  }

  private gap(e: Entry, from: Position, to: Position, epochChanged: boolean): void {
    this.host.events.emit('gap', { channel: e.channel, from: { ...from }, to: { ...to }, epochChanged });
    for (const h of e.handles) h.emit('gap', { channel: e.channel, from: { ...from }, to: { ...to }, epochChanged });
  }

  /** After an epoch change: delivers the new epoch's publications up to `upTo` from history,
   * holding live ones meanwhile, then the held ones. */
  private fill(e: Entry, upTo: Position, last: WirePub | null): void {
    e.filling = true;
    e.buffer = [];
    const token = ++e.fillToken;
    const limit = this.host.fillLimit;
    const since = { epoch: upTo.epoch, offset: Math.max(0, upTo.offset - limit) };
    const finish = (pubs: WirePub[]) => {
      if (this.host.entries.get(e.channel) !== e || e.fillToken !== token) return;
      for (const p of pubs) if (p.off <= upTo.offset && p.off > e.position!.offset) this.deliver(e, p);
      if (last && last.off > e.position!.offset) this.deliver(e, last);
      if (e.position!.offset < upTo.offset) e.position = { ...upTo };
      e.filling = false;
      const held = e.buffer;
      e.buffer = [];
      for (const p of held) if (p.off > e.position!.offset) this.deliver(e, p);
    };
    void this.read(e, since, limit, token).then(finish);
  }

  /** The channel's publications after `since`, at most `limit`; on a failure, those read until
   * then. A history reply past the server's byte budget holds fewer and says `more`: read on
   * from its last publication while `token` is the entry's fill token. */
  private async read(e: Entry, since: Position, limit: number, token: number): Promise<WirePub[]> {
    const pubs: WirePub[] = [];
    let from = since;
    let left = limit;
    try {
      while (left > 0) {
        const r = await this.host.history(e.channel, from, left);
        pubs.push(...r.publications);
        const tail = r.publications[r.publications.length - 1];
        if (!r.more || !tail || left <= r.publications.length || e.fillToken !== token) break;
        from = { epoch: from.epoch, offset: tail.off };
        left -= r.publications.length;
      }
    } catch {
      // A failed read ends here: the caller goes on with what was read.
    }
    return pubs;
  }

  route(p: WirePub): void {
    const e = this.host.entries.get(p.ch);
    if (e?.status === 'sending') {
      e.early.push(p);
      return;
    }
    if (!e || e.status !== 'subscribed') return;
    // Covered by the subscribe reply: a delta failure there too is an older subscription's.
    if (e.position && p.off <= e.position.offset) return;
    if (p.broken !== undefined) {
      this.host.deltaFailed(e, p);
      return;
    }
    if (e.filling) {
      e.buffer.push(p);
      return;
    }
    this.deliver(e, p);
  }

  private deliver(e: Entry, p: WirePub): void {
    if (e.position) e.position.offset = p.off;
    const pub = toPublication(p);
    // A historical publication counts for the position, but the current value stays the
    // newest live one.
    if (!pub.historical) e.latest = pub;
    this.host.batcher.push(pub, e.point);
  }

  reset(e: Entry): void {
    e.status = 'pending';
    e.inflight = 0;
    e.filling = false;
    e.buffer = [];
    e.early = [];
    e.fillToken++;
  }
}
