// The Switchboard client: one connection carrying any number of subscriptions, commands with
// replies, automatic reconnects with recovery, and delivery batched per animation frame.
//
// Delivery guarantee: for each channel the application receives publications in offset order,
// each at most once. Across reconnects nothing is lost while the server's history reaches back
// to the client's last position; otherwise a `gap` event says so and the latest value (plus the
// new epoch's history, for non-point channels) is delivered instead. Point channels deliver only
// the latest publication per frame. Subscriptions the server makes for the connection (the
// application's connect hook, a `subscribed` push) are followed the same way.

import { Backoff } from './backoff.js';
import { defaultScheduler, FrameBatcher, type FrameBatch } from './batcher.js';
import { codecFor, type Codec } from './codec.js';
import { Emitter } from './emitter.js';
import { Heartbeat } from './heartbeat.js';
import type { ClientEvents, ClientState, SubscribedEvent } from './events.js';
import { createEntry, Recovery, type Entry } from './recovery.js';
import { Subscription, type SubscriptionOwner, type SubscriptionState } from './subscription.js';
import { baseUrlOf, type Transport, type TransportFactory } from './transport.js';
import {
  LocalCode,
  SwitchboardError,
  toPublication,
  type Command,
  type CommandBodies,
  type CommandName,
  type DisconnectBody,
  type ErrorBody,
  type Position,
  type ReplyBodies,
  type ServerMessage,
  type WireChannelResult,
  type WirePub,
} from './types.js';
import { fallbackTransport } from './fallback.js';
import { chunkChannels, MAX_CHANNELS_PER_SUBSCRIBE, shareFrames } from './framing.js';
import { DeltaChains } from './delta.js';
import {
  samplingKey,
  type ClientOptions,
  type ClientStats,
  type Credentials,
  type HistoryOptions,
  type HistoryResult,
  type PublishOptions,
  type SubscribeOptions,
} from './options.js';

export type { ClientOptions, ClientStats, Credentials, HistoryOptions, HistoryResult, PublishOptions, SubscribeOptions } from './options.js';


type Pending = {
  resolve: (v: unknown) => void;
  reject: (e: SwitchboardError) => void;
  timer: ReturnType<typeof setTimeout> | null;
};

// Refused (4003), or this client's frames broke RFC 6455 (1002, 1007) or carried no command
// (4010): reconnecting would only repeat it.
const NO_RECONNECT_CODES = new Set([1002, 1007, 4003, 4010]);
/** Channels per subscribe that asks for trends (an hour of 1 s buckets is ~250 KB per channel;
 * the server refuses channels past its reply budget with 413, and they are asked again). */
const TREND_CHANNELS_PER_SUBSCRIBE = 5;
const MAX_U32 = 0xffff_ffff;

export class Client implements SubscriptionOwner {
  private readonly opts: ClientOptions;
  private readonly baseUrl: string;
  private readonly codec: Codec;
  private readonly transportFactory: TransportFactory;
  private readonly events: Emitter<ClientEvents>;
  private readonly batcher: FrameBatcher;
  private readonly backoff: Backoff;
  private readonly isPoint: (ch: string) => boolean;
  private readonly recovery: Recovery;
  private readonly deltas: DeltaChains;
  /** Budget of one subscribe command's channel list, bytes. */
  private readonly subscribeBudget: number;

  private transport: Transport | null = null;
  private _state: ClientState = 'idle';
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  /** Commands waiting for a connection. */
  private waiting: Command[] = [];
  /** Commands to send at the end of this task. */
  private outgoing: Command[] = [];
  private flushQueued = false;
  private readonly entries = new Map<string, Entry>();
  private readonly toUnsubscribe = new Set<string>();
  private reconnectTimer: ReturnType<typeof setTimeout> | null = null;
  /** Channels refused for now (503) are asked again when this fires, after `retryBackoff`. */
  private retryTimer: ReturnType<typeof setTimeout> | null = null;
  private readonly retryBackoff: Backoff;
  private readonly heartbeat: Heartbeat;
  private connectedAt = 0;
  private disconnectBody: DisconnectBody | null = null;
  private session: { client: string; node: string; pingS: number } | null = null;
  private readonly _stats: ClientStats = { received: 0, delivered: 0, frames: 0, reconnects: 0, subscriptions: 0, deltaFailures: 0 };
  private connections = 0;
  private generation = 0;

  constructor(opts: ClientOptions) {
    this.opts = opts;
    this.baseUrl = baseUrlOf(opts.url);
    this.codec = codecFor(opts.format ?? 'json');
    this.transportFactory =
      opts.transport ??
      fallbackTransport({
        transports: opts.transports,
        WebSocket: opts.WebSocket,
        EventSource: opts.EventSource,
        fetch: opts.fetch,
      });
    this.events = new Emitter<ClientEvents>((e) => this.events.emit('error', asError(e)));
    this.batcher = new FrameBatcher((b) => this.deliver(b), opts.schedule ?? defaultScheduler);
    this.backoff = new Backoff(opts.reconnect === false ? {} : opts.reconnect, opts.random);
    this.retryBackoff = new Backoff({ minDelayMs: 200, maxDelayMs: 5_000 }, opts.random);
    this.isPoint = opts.isPointChannel ?? ((ch) => ch.startsWith('pt:'));
    this.recovery = new Recovery({
      events: this.events,
      batcher: this.batcher,
      entries: this.entries,
      fillOnEpochChange: opts.fillOnEpochChange ?? true,
      fillLimit: opts.fillLimit ?? 1000,
      history: (channel, since, limit) => this.request('history', { channel, since, limit }),
      deltaFailed: (e, p) => this.onDeltaFailed(e, p),
    });
    this.deltas = new DeltaChains(opts.maxDeltaBytes);
    this.heartbeat = new Heartbeat(
      // No pending entry: any message, this reply included, proves the path alive.
      () => this.enqueue({ id: this.allocId(), ping: {} }),
      () => {
        const t = this.transport;
        if (!t) return;
        t.close(4011, 'no reply');
        this.onTransportClose(t, { code: 4011, reason: 'server silent' });
      },
    );
    this.subscribeBudget = opts.maxSubscribeBytes ?? 40_000;
  }

  /** The server's base URL (`http://host:port`), for the HTTP API. */
  get url(): string {
    return this.baseUrl;
  }

  get state(): ClientState {
    return this._state;
  }

  /** The transport in use (`websocket`, `sse`, `poll`), or null while not connected. */
  get transportName(): string | null {
    return this._state === 'connected' ? (this.transport?.name ?? null) : null;
  }

  /** The connection's client id and node, once connected. */
  get info(): { client: string; node: string; pingS: number } | null {
    return this.session;
  }

  get stats(): Readonly<ClientStats> {
    this._stats.subscriptions = this.entries.size;
    return this._stats;
  }

  on<K extends keyof ClientEvents>(event: K, fn: (v: ClientEvents[K]) => void): () => void {
    return this.events.on(event, fn);
  }

  /** Starts connecting (and reconnecting); resolves once connected. */
  connect(): Promise<void> {
    const done = new Promise<void>((resolve, reject) => {
      if (this._state === 'connected') return resolve();
      const offs: Array<() => void> = [];
      const settle = (f: () => void) => {
        offs.forEach((o) => o());
        f();
      };
      offs.push(this.on('connected', () => settle(resolve)));
      offs.push(
        this.on('state', ({ state }) => {
          if (state === 'closed') settle(() => reject(new SwitchboardError(LocalCode.Closed, 'client closed')));
        }),
      );
    });
    if (this._state === 'idle' || this._state === 'closed') this.open();
    return done;
  }

  /** Closes the connection for good: pending commands reject, nothing is delivered anymore. */
  close(): void {
    if (this._state === 'closed') return;
    this.generation++;
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    this.reconnectTimer = null;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    this.heartbeat.stop();
    const t = this.transport;
    this.transport = null;
    t?.close(1000, 'client closed');
    this.failPending(LocalCode.Closed, 'client closed');
    for (const c of this.waiting) this.rejectCommand(c, LocalCode.Closed, 'client closed');
    this.waiting = [];
    this.outgoing = [];
    this.batcher.clear();
    for (const e of this.entries.values()) this.recovery.reset(e);
    this.setState('closed');
  }

  /**
   * Drops the current connection as if the network failed; the client reconnects and recovers.
   * For tests and for applications that know the network changed.
   */
  dropConnection(): void {
    const t = this.transport;
    if (!t) return;
    t.close(4999, 'dropped by client');
    this.onTransportClose(t, { code: 1006, reason: 'dropped by client' });
  }

  // ---------------------------------------------------------------------------------------
  // Subscriptions

  /** Subscribes to one channel. Handles of the same channel share one server subscription. */
  subscribe(channel: string, opts: SubscribeOptions = {}): Subscription {
    return this.subscribeMany([channel], opts)[0];
  }

  /** Subscribes to many channels; they go to the server in as few commands as fit its limits. */
  subscribeMany(channels: string[], opts: SubscribeOptions = {}): Subscription[] {
    const initial = opts.initial ?? true;
    const out: Subscription[] = [];
    for (const channel of channels) {
      const sub = new Subscription(this, channel, (e) => this.events.emit('error', asError(e)));
      if (opts.onPublication) sub.on('publication', opts.onPublication);
      let e = this.entries.get(channel);
      if (!e) {
        e = createEntry(channel, this.isPoint(channel), initial, opts.recover ?? null, samplingKey(opts));
        this.entries.set(channel, e);
        // A pending unsubscribe of this channel stays: flush() sends unsubscribes before
        // subscribes, so the server drops the old subscription before taking the new one.
        this.queueFlush();
      } else {
        e.initial ||= initial;
        if (e.status === 'subscribed' && e.position) {
          const ev: SubscribedEvent = { channel, position: { ...e.position }, resubscribed: false, recovered: 0 };
          const latest = e.latest;
          queueMicrotask(() => {
            sub.emit('subscribed', ev);
            if (initial && latest) sub.emit('publication', latest);
          });
        }
      }
      e.handles.add(sub);
      out.push(sub);
    }
    return out;
  }

  /** Unsubscribes every handle of these channels, and the channels the server subscribed. */
  unsubscribe(channels: string | string[]): void {
    for (const ch of Array.isArray(channels) ? channels : [channels]) {
      const e = this.entries.get(ch);
      if (!e) continue;
      for (const h of [...e.handles]) h.unsubscribe();
      if (this.entries.get(ch) === e) this.drop(e);
    }
  }

  /** Channels with a subscription (any state). */
  channels(): string[] {
    return [...this.entries.keys()];
  }

  /** @internal SubscriptionOwner */
  release(sub: Subscription): void {
    const e = this.entries.get(sub.channel);
    // A subscription the server made stays without handles (`unsubscribe` ends it).
    if (!e || !e.handles.delete(sub) || e.handles.size > 0 || e.server) return;
    this.drop(e);
  }

  /** Forgets a channel, unsubscribing it on the server when it has (or is about to have) it. */
  private drop(e: Entry): void {
    this.entries.delete(e.channel);
    e.fillToken++;
    if (e.status === 'sending' || e.status === 'subscribed') {
      this.toUnsubscribe.add(e.channel);
      this.queueFlush();
    }
  }

  /** @internal SubscriptionOwner */
  positionOf(channel: string): Position | null {
    const p = this.entries.get(channel)?.position;
    return p ? { ...p } : null;
  }

  /** @internal SubscriptionOwner */
  stateOf(channel: string): SubscriptionState {
    const s = this.entries.get(channel)?.status;
    if (s === 'subscribed' || s === 'error') return s;
    return s ? 'pending' : 'unsubscribed';
  }

  // ---------------------------------------------------------------------------------------
  // Commands

  /** Publishes `data` to a channel (the namespace must allow client publishing), with the
   * publication's `tags` (what subscriptions' `filter` compares) if given. */
  publish(channel: string, data: unknown, opts: PublishOptions = {}): Promise<{ offset: number; epoch: string }> {
    return this.request('publish', opts.tags ? { channel, data, tags: opts.tags } : { channel, data });
  }

  /** Publications after `since` (or the latest ones), oldest first. */
  async history(channel: string, opts: HistoryOptions = {}): Promise<HistoryResult> {
    const r = await this.request('history', { channel, since: opts.since, limit: opts.limit });
    return {
      publications: r.publications.map(toPublication),
      epoch: r.epoch,
      offset: r.offset,
      complete: r.complete ?? true,
      more: r.more ?? false,
    };
  }

  /** Who is in a channel (namespaces with presence). */
  async presence(channel: string): Promise<{ client: string; user: string }[]> {
    return (await this.request('presence', { channel })).clients;
  }

  /** A round trip through the server. */
  async ping(data?: unknown): Promise<unknown> {
    return (await this.request('ping', { data })).data;
  }

  /** Hands the server a fresh token for this connection. */
  refresh(token: string): Promise<{ expires: number }> {
    return this.request('refresh', { token });
  }

  /** Sends a command and resolves with its reply. Before `connect()` and while reconnecting it
   * waits (up to `commandTimeoutMs`); a connection lost after sending rejects it with
   * `LocalCode.Disconnected`, since the server may or may not have run it. */
  request<K extends Exclude<CommandName, 'subscribe' | 'unsubscribe' | 'connect'>>(
    name: K,
    body: CommandBodies[K],
  ): Promise<ReplyBodies[K]> {
    if (this._state === 'closed') return Promise.reject(new SwitchboardError(LocalCode.Closed, 'client closed'));
    const id = this.allocId();
    const cmd = { id, [name]: body } as Command;
    const p = this.expect(id, this.opts.commandTimeoutMs ?? 10_000, () => this.dropWaiting(cmd));
    if (this._state === 'connected') this.enqueue(cmd);
    else this.waiting.push(cmd);
    return p as Promise<ReplyBodies[K]>;
  }

  // ---------------------------------------------------------------------------------------
  // Connection lifecycle

  private open(): void {
    if (this.transport) return;
    this.reconnectTimer = null;
    this.setState('connecting');
    const gen = ++this.generation;
    let transport: Transport | null = null;
    try {
      transport = this.transportFactory({
        baseUrl: this.baseUrl,
        format: this.codec.format,
        codec: this.codec,
        handlers: {
          onOpen: () => {
            if (gen === this.generation) void this.onTransportOpen(transport!, gen);
          },
          onMessages: (msgs) => {
            if (gen === this.generation) this.onMessages(msgs);
          },
          onClose: (info) => {
            if (gen === this.generation && transport) this.onTransportClose(transport, info);
          },
        },
      });
    } catch (e) {
      this.events.emit('error', asError(e));
      this.scheduleReconnect({ code: 1006, reason: String(e) });
      return;
    }
    this.transport = transport;
  }

  private async onTransportOpen(transport: Transport, gen: number): Promise<void> {
    this.heartbeat.received();
    let token: string | undefined;
    let creds: Credentials | undefined;
    try {
      token = this.opts.getToken ? await this.opts.getToken() : this.opts.token;
      const c = this.opts.credentials;
      if (!token && c) creds = typeof c === 'function' ? await c() : c;
      // An empty user means none (a provider with nothing to give yet).
      if (!creds?.user) creds = undefined;
    } catch (e) {
      this.events.emit('error', asError(e));
      transport.close(1000, 'no token');
      this.onTransportClose(transport, { code: 4001, reason: 'token provider failed' });
      return;
    }
    if (gen !== this.generation) return;
    let info = { client: '', node: '', pingS: 25 };
    // `connect` is optional without authentication, but its reply names this client (for
    // presence) and the server's ping interval, so it always goes first.
    {
      const id = this.allocId();
      const reply = this.expect(id, this.opts.commandTimeoutMs ?? 10_000, () => {});
      const body = creds ? { user: creds.user, password: creds.password } : { token: token || undefined };
      transport.send([{ id, connect: { ...body, name: this.opts.name } }]);
      try {
        const r = (await reply) as ReplyBodies['connect'];
        info = { client: r.client, node: r.node, pingS: r.ping_s || 25 };
      } catch (e) {
        if (gen !== this.generation) return;
        const err = e as SwitchboardError;
        this.events.emit('error', err);
        transport.close(1000, 'connect refused');
        this.onTransportClose(transport, { code: err.code === 401 ? 4001 : 1006, reason: err.message });
        return;
      }
      if (gen !== this.generation) return;
    }
    this.session = info;
    this.connectedAt = Date.now();
    if (this.connections++ > 0) this._stats.reconnects++;
    this.setState('connected');
    this.heartbeat.start(info.pingS * 1000);
    // Every channel goes back to the server, recovering from its position, except those a
    // `subscribed` push of this connection took already (it comes before the connect reply;
    // every other entry was reset when the previous connection closed).
    for (const e of this.entries.values()) {
      if (e.status === 'subscribed' || e.status === 'sending') continue;
      e.status = 'pending';
      e.inflight = 0;
    }
    this.toUnsubscribe.clear();
    const waiting = this.waiting;
    this.waiting = [];
    for (const c of waiting) this.enqueue(c);
    this.queueFlush();
    this.events.emit('connected', { ...info, reconnects: this._stats.reconnects });
  }

  private onTransportClose(transport: Transport, info: { code: number; reason: string }): void {
    if (transport !== this.transport) return;
    this.transport = null;
    this.generation++;
    this.heartbeat.stop();
    this.session = null;
    this.failPending(LocalCode.Disconnected, `connection closed (${info.code} ${info.reason})`.trim());
    this.outgoing = [];
    for (const e of this.entries.values()) this.recovery.reset(e);
    this.toUnsubscribe.clear();
    this.deltas.clear();
    if (this.connectedAt && Date.now() - this.connectedAt >= (this.opts.stableAfterMs ?? 5_000)) this.backoff.reset();
    this.connectedAt = 0;
    const told = this.disconnectBody;
    this.disconnectBody = null;
    const code = told?.code ?? info.code;
    const reason = told?.reason ?? info.reason;
    let again = this.opts.reconnect !== false && !NO_RECONNECT_CODES.has(code);
    if (told && !told.reconnect) again = false;
    // An expired token can be replaced when there is a provider to ask.
    if (code === 4001) again = this.opts.reconnect !== false && this.opts.getToken !== undefined;
    this.scheduleReconnect({ code, reason }, again);
  }

  private scheduleReconnect(info: { code: number; reason: string }, again = this.opts.reconnect !== false): void {
    if (!again) {
      this.events.emit('disconnected', { code: info.code, reason: info.reason, reconnect: false, delayMs: 0 });
      for (const c of this.waiting) this.rejectCommand(c, LocalCode.Closed, 'client closed');
      this.waiting = [];
      this.setState('closed');
      return;
    }
    const delayMs = this.backoff.next();
    this.setState('disconnected');
    this.events.emit('disconnected', { code: info.code, reason: info.reason, reconnect: true, delayMs });
    this.reconnectTimer = setTimeout(() => this.open(), delayMs);
  }

  private setState(state: ClientState): void {
    const previous = this._state;
    if (previous === state) return;
    this._state = state;
    this.events.emit('state', { state, previous });
  }

  // ---------------------------------------------------------------------------------------
  // Sending

  private allocId(): number {
    const id = this.nextId;
    this.nextId = id >= MAX_U32 ? 1 : id + 1;
    return id;
  }

  private expect(id: number, timeoutMs: number, onTimeout: () => void): Promise<unknown> {
    return new Promise((resolve, reject) => {
      const timer =
        timeoutMs > 0
          ? setTimeout(() => {
              this.pending.delete(id);
              onTimeout();
              reject(new SwitchboardError(LocalCode.Timeout, `no reply within ${timeoutMs} ms`));
            }, timeoutMs)
          : null;
      this.pending.set(id, { resolve, reject, timer });
    });
  }

  private dropWaiting(cmd: Command): void {
    this.waiting = this.waiting.filter((c) => c !== cmd);
  }

  private rejectCommand(cmd: Command, code: number, message: string): void {
    if (cmd.id === undefined) return;
    const p = this.pending.get(cmd.id);
    if (!p) return;
    this.pending.delete(cmd.id);
    if (p.timer) clearTimeout(p.timer);
    p.reject(new SwitchboardError(code, message));
  }

  private failPending(code: number, message: string): void {
    const all = [...this.pending.values()];
    this.pending.clear();
    for (const p of all) {
      if (p.timer) clearTimeout(p.timer);
      p.reject(new SwitchboardError(code, message));
    }
  }

  private enqueue(cmd: Command): void {
    this.outgoing.push(cmd);
    this.queueFlush();
  }

  private queueFlush(): void {
    if (this.flushQueued) return;
    this.flushQueued = true;
    queueMicrotask(() => {
      this.flushQueued = false;
      this.flush();
    });
  }

  /** Sends what this task queued: unsubscribes, then subscribes, then other commands. */
  private flush(): void {
    const t = this.transport;
    if (!t || this._state !== 'connected') return;
    const frames: Command[][] = [];
    if (this.toUnsubscribe.size > 0) {
      const channels = [...this.toUnsubscribe];
      this.toUnsubscribe.clear();
      for (const chunk of chunkChannels(channels, this.subscribeBudget)) frames.push([{ unsubscribe: { channels: chunk } }]);
    }
    const pending = [...this.entries.values()].filter((e) => e.status === 'pending');
    // One subscribe per sampling asked for: sampling is per command on the wire.
    const groups = new Map<string, Entry[]>();
    for (const e of pending) {
      const group = groups.get(e.sampling);
      if (group) group.push(e);
      else groups.set(e.sampling, [e]);
    }
    for (const [sampling, due] of groups) {
      const recoverBytes = (e: Entry) => (e.position ? e.position.epoch.length + e.channel.length + 40 : 0);
      // A trend makes each channel's reply large (up to ~1,000 buckets): fewer channels per
      // subscribe keep every reply well within the server's per-connection queue bound.
      const most = sampling.includes('"trend"') ? TREND_CHANNELS_PER_SUBSCRIBE : MAX_CHANNELS_PER_SUBSCRIBE;
      const channels = due.map((e) => e.channel);
      for (const chunk of chunkChannels(channels, this.subscribeBudget, (ch) => recoverBytes(this.entries.get(ch)!), most)) {
        const id = this.allocId();
        const recover: Record<string, Position> = {};
        let anyRecover = false;
        for (const ch of chunk) {
          const e = this.entries.get(ch)!;
          e.status = 'sending';
          e.inflight = id;
          if (e.position) {
            recover[ch] = { ...e.position };
            anyRecover = true;
          }
        }
        this.expect(id, 0, () => {}).then(
          (r) => this.onSubscribeReply(id, chunk, r as ReplyBodies['subscribe'], null),
          (err: SwitchboardError) => this.onSubscribeReply(id, chunk, null, err),
        );
        const body: CommandBodies['subscribe'] = { channels: chunk, initial: true, ...(sampling ? JSON.parse(sampling) : {}) };
        if (anyRecover) body.recover = recover;
        frames.push([{ id, subscribe: body }]);
      }
    }
    frames.push(...shareFrames(this.outgoing));
    this.outgoing = [];
    try {
      for (const f of frames) t.send(f);
    } catch (e) {
      this.events.emit('error', asError(e));
    }
  }

  // ---------------------------------------------------------------------------------------
  // Receiving

  private onMessages(msgs: ServerMessage[]): void {
    this.heartbeat.received();
    for (const m of msgs) {
      if (m.pub) {
        this.onPub(m.pub);
      } else if (m.id !== undefined && (m.ok !== undefined || m.error !== undefined)) {
        this.onReply(m.id, m.ok, m.error);
      } else if (m.join) {
        this.events.emit('join', m.join);
      } else if (m.leave) {
        this.events.emit('leave', m.leave);
      } else if (m.disconnect) {
        this.disconnectBody = m.disconnect;
      } else if (m.unsubscribed) {
        this.onUnsubscribed(m.unsubscribed.ch);
      } else if (m.subscribed) {
        this.onServerSubscribed(m.subscribed.channels ?? {});
      }
    }
  }

  /** Subscriptions the server made for this connection (the connect hook's): each channel is
   * followed like the application's (`Recovery.adopt`), announced with a `subscribed` event
   * marked `server`; one the server could not subscribe is a `subscribeError`. */
  private onServerSubscribed(results: Record<string, WireChannelResult>): void {
    for (const [channel, r] of Object.entries(results)) {
      if ('error' in r) {
        this.events.emit('subscribeError', { channel, error: new SwitchboardError(r.error.code, r.error.message) });
        continue;
      }
      let e = this.entries.get(channel);
      if (!e) {
        e = createEntry(channel, this.isPoint(channel), false, null, '');
        e.server = true;
        this.entries.set(channel, e);
      }
      // The server holds the channel now: a subscribe of it in flight is answered 409, which
      // no longer concerns the entry.
      e.inflight = 0;
      this.recovery.adopt(e, r);
    }
  }

  /** The server ended one subscription (its broker shard may have lost publications of it);
   * the connection stays. The channel goes out again at once, recovering from its position;
   * while its shard is down that is answered 503 and retried later. */
  private onUnsubscribed(channel: string): void {
    const e = this.entries.get(channel);
    if (!e) return;
    this.recovery.reset(e);
    this.queueFlush();
  }

  private onReply(id: number, ok: unknown, error: ErrorBody | undefined): void {
    const p = this.pending.get(id);
    if (!p) {
      // Errors of commands sent without an id come back with id 0.
      if (error) this.events.emit('error', new SwitchboardError(error.code, error.message));
      return;
    }
    this.pending.delete(id);
    if (p.timer) clearTimeout(p.timer);
    if (error) p.reject(new SwitchboardError(error.code, error.message));
    else p.resolve(ok);
  }

  private onSubscribeReply(
    id: number,
    channels: string[],
    reply: ReplyBodies['subscribe'] | null,
    err: SwitchboardError | null,
  ): void {
    // A channel past the reply's byte budget (413) is asked again in the next subscribe, as
    // long as this reply took some channel (so the retries end: a 413 of a reply that took
    // none is the channel's own, e.g. a trend too large for any reply).
    const took = Object.values(reply?.channels ?? {}).some((r) => !('error' in r));
    let retry = false;
    let later = false;
    for (const ch of channels) {
      const e = this.entries.get(ch);
      if (!e || e.inflight !== id) continue;
      e.inflight = 0;
      if (err) {
        // The connection dropped before the reply: the entry was reset and goes out again.
        if (err.code === LocalCode.Disconnected || err.code === LocalCode.Closed) continue;
        this.recovery.refuse(e, err);
        continue;
      }
      const r: WireChannelResult | undefined = reply?.channels?.[ch];
      if (!r) this.recovery.refuse(e, new SwitchboardError(500, 'no result for this channel in the reply'));
      else if ('error' in r && r.error.code === 413 && took) {
        e.status = 'pending';
        e.early = [];
        retry = true;
      } else if ('error' in r && r.error.code === 503) {
        // The channel's broker shard is unavailable (a failover): the others go on, this one
        // is asked again, recovering from its position.
        e.status = 'waiting';
        e.early = [];
        later = true;
      } else if ('error' in r) this.recovery.refuse(e, new SwitchboardError(r.error.code, r.error.message));
      else this.recovery.accept(e, r);
    }
    if (retry) this.queueFlush();
    if (later) this.retryLater();
    else if (took) this.retryBackoff.reset();
  }

  /** Asks the channels refused for now again after a jittered delay that grows while they
   * keep being refused, so the clients of a failed shard do not retry in step. */
  private retryLater(): void {
    if (this.retryTimer) return;
    const delayMs = Math.max(50, this.retryBackoff.next());
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      for (const e of this.entries.values()) if (e.status === 'waiting') e.status = 'pending';
      this.queueFlush();
    }, delayMs);
  }

  private onPub(p: WirePub): void {
    this._stats.received++;
    let pub: WirePub;
    try {
      // In arrival order: each delta builds on the push before it.
      pub = this.deltas.decode(p);
    } catch (err) {
      // Taken in the channel's order (after its subscribe reply, if that is being applied).
      pub = { ch: p.ch, off: p.off, data: undefined, broken: err instanceof Error ? err.message : String(err) };
    }
    this.recovery.route(pub);
  }

  /** A publication of a `delta` subscription could not be rebuilt: the channel's stream has a
   * hole while the server still holds the subscription. It is unsubscribed and subscribed
   * again at once (the unsubscribe goes first), recovering from its position; pushes already
   * on their way are dropped meanwhile (they fail too, or would skip the hole). A hole history
   * no longer holds is a `gap` as any other. */
  private onDeltaFailed(e: Entry, p: WirePub): void {
    this._stats.deltaFailures++;
    this.events.emit('error', new SwitchboardError(LocalCode.Delta, `${p.ch}: publication ${p.off} could not be rebuilt: ${p.broken}`));
    this.recovery.reset(e);
    this.toUnsubscribe.add(e.channel);
    this.queueFlush();
  }

  private deliver(batch: FrameBatch): void {
    if (this._state === 'closed') return;
    this._stats.frames++;
    this._stats.delivered += batch.publications.length;
    this.events.emit('frame', batch);
    for (const p of batch.publications) {
      const e = this.entries.get(p.channel);
      if (!e) continue;
      for (const h of e.handles) if (h.wantsPublications()) h.emit('publication', p);
    }
  }
}

function asError(e: unknown): Error {
  return e instanceof Error ? e : new Error(String(e));
}
