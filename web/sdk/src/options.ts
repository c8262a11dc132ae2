// What a client is given: the options of the client, of a subscription and of a history read,
// the credentials of a Basic user, and the client's counters; and the wire form of a
// subscription's per-command options.

import type { BackoffOptions } from './backoff.js';
import type { Scheduler } from './batcher.js';
import type { Format } from './codec.js';
import type { TransportFactory } from './transport.js';
import type { CommandBodies, Filter, Position, Publication } from './types.js';
import type { WebSocketConstructor } from './websocket.js';
import type { TransportName } from './fallback.js';
import type { EventSourceConstructor } from './sse.js';
import type { FetchLike } from './poll.js';

/** A Basic user of the server's users file. */
export interface Credentials {
  user: string;
  password: string;
}

export interface ClientOptions {
  /** The server: `http://host:port`, `ws://host:port/ws` or `host:port`. */
  url: string;
  /** Wire format (default `json`). */
  format?: Format;
  /** A token sent in a `connect` command as the first command of each connection. */
  token?: string;
  /** Called before each connection for a fresh token; wins over `token`. */
  getToken?: () => string | Promise<string>;
  /**
   * A Basic user's name and password, sent in the `connect` command of each connection (a
   * browser cannot set `Authorization` on a WebSocket handshake). Used when no token is given.
   */
  credentials?: Credentials | (() => Credentials | Promise<Credentials>);
  /** Application name sent with `connect`. */
  name?: string;
  /** The transport (default: WebSocket, falling back to SSE, then long-polling). */
  transport?: TransportFactory;
  /** Transports the default transport tries, in order (default websocket, sse, poll). */
  transports?: TransportName[];
  /** WebSocket implementation for the default transport (Node: the `ws` package). */
  WebSocket?: WebSocketConstructor;
  /** EventSource and fetch implementations for the SSE and long-polling transports. */
  EventSource?: EventSourceConstructor;
  fetch?: FetchLike;
  /** Reconnect backoff; `false` disables reconnecting. */
  reconnect?: BackoffOptions | false;
  /** Random source for the backoff jitter (tests). */
  random?: () => number;
  /** A connection that lived this long resets the backoff (ms, default 5,000). */
  stableAfterMs?: number;
  /** Replies slower than this reject with code `LocalCode.Timeout` (ms, default 10,000). */
  commandTimeoutMs?: number;
  /** Point channels get only their latest publication per frame (default: the `pt:` namespace). */
  isPointChannel?: (channel: string) => boolean;
  /** When the frame batch is delivered (default: `requestAnimationFrame`, else a 16 ms timer). */
  schedule?: Scheduler;
  /** After an epoch change of a non-point channel whose recovery carried none of the new
   * epoch's publications, fetch the new epoch's history (default true). Publications a recovery
   * carries are always delivered. */
  fillOnEpochChange?: boolean;
  /** Most publications fetched by that fill (default 1,000). */
  fillLimit?: number;
  /** Budget of one subscribe command's channel list, bytes (the server's frame limit is 64 KiB). */
  maxSubscribeBytes?: number;
  /** The largest publication text a `delta` subscription's push may declare (bytes, default
   * 1 MiB); a larger one is refused before it is rebuilt and its channel recovered. */
  maxDeltaBytes?: number;
}

export interface SubscribeOptions {
  /** Deliver the channel's latest publication at once (default true). */
  initial?: boolean;
  /** Start from a known position (e.g. one the application stored): missed publications are
   * recovered, as after a reconnect. */
  recover?: Position;
  /** Called with each publication of the channel, in the per-frame delivery. */
  onPublication?: (p: Publication) => void;
  /** Server-side sampling: at most this many deliveries per second; the latest value always
   * arrives (within 1/maxRateHz s). Set by the channel's first subscriber. */
  maxRateHz?: number;
  /** Server-side deadband: numeric values that moved less are not sent. */
  deadband?: { abs: number } | { pct: number };
  /** The channel's trend over the last `windowS` seconds (buckets of `stepS`) comes with the
   * `subscribed` event, up to the position live publications continue from: a trend plot
   * opens full without a gap or duplicate. Asked again on each resubscription. */
  trend?: { windowS: number; stepS?: number };
  /** `'fossil'`: the server sends live publications as Fossil deltas of the previous one (less
   * to send for publications that change little); they are delivered rebuilt, as without it.
   * Refused (400) for a channel that conflates, or with `maxRateHz`, `deadband` or `filter`. */
  delta?: 'fossil';
  /** Only publications whose tags match (`publish(ch, data, { tags })`), live and recovered;
   * the offsets delivered then have holes that are not gaps. */
  filter?: Filter;
}

export interface HistoryOptions {
  since?: Position;
  limit?: number;
}

export interface HistoryResult {
  publications: Publication[];
  epoch: string;
  offset: number;
  complete: boolean;
  /** The reply reached the server's byte budget before `limit`: more publications follow;
   * read them with `since` set to the last publication's position. */
  more: boolean;
}

export interface ClientStats {
  /** Publications pushed live by the server. */
  received: number;
  /** Publications handed to the application (after per-frame reduction of point channels). */
  delivered: number;
  /** Frame batches delivered. */
  frames: number;
  reconnects: number;
  subscriptions: number;
  /** Publications of `delta` subscriptions that could not be rebuilt (each channel was then
   * subscribed again, recovering from its position). */
  deltaFailures: number;
}

export interface PublishOptions {
  /** Tags of the publication, what subscriptions' `filter` compares. */
  tags?: Record<string, string>;
}

/** The wire form of a subscription's per-command options (sampling, trend, delta, filter), as
 * a key ('' when none): subscribes with the same key share commands. */
export function samplingKey(opts: SubscribeOptions): string {
  const o: CommandBodies['subscribe'] = { channels: [] };
  if (opts.maxRateHz !== undefined) o.max_rate_hz = opts.maxRateHz;
  if (opts.deadband !== undefined) o.deadband = opts.deadband;
  if (opts.trend !== undefined) {
    o.trend = { window_s: opts.trend.windowS };
    if (opts.trend.stepS !== undefined) o.trend.step_s = opts.trend.stepS;
  }
  if (opts.delta !== undefined) o.delta = opts.delta;
  if (opts.filter !== undefined) o.filter = opts.filter;
  delete (o as { channels?: string[] }).channels;
  return Object.keys(o).length > 0 ? JSON.stringify(o) : '';
}
