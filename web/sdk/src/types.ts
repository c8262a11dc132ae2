// Wire types of the Switchboard WebSocket protocol v1 (docs/protocol.md) and the SDK's own
// public shapes built on them.

import type { AlarmState } from './alarms.js';

/** A channel's place in its stream: offsets count publications within one epoch. */
export interface Position {
  epoch: string;
  offset: number;
}

/**
 * A publication as the application sees it.
 *
 * `historical`: a value a plant source back-filled from before the channel's newest (a
 * Sparkplug B `is_historical` metric, an OPC UA back-fill after a gap). It has its own offset
 * and is delivered in offset order like any other publication, its data carries its own time
 * (`t` of a point), and it is never the channel's current value: a display of the current value
 * skips it, a plot by time puts it at its `t`. Absent on every other publication.
 */
export interface Publication {
  channel: string;
  offset: number;
  data: unknown;
  historical?: true;
  /** The publisher's tags (what a subscription's `filter` compares); absent when none. */
  tags?: Record<string, string>;
}

/** The compact publication form used everywhere on the WebSocket; `hist: true` marks a
 * historical one (absent otherwise). A push of a `delta: 'fossil'` subscription carries
 * `delta`, and its `data` is the publication's JSON text (`delta: false`) or a Fossil delta
 * from the previous push's (`true`): a string in JSON, bytes in MessagePack. */
export interface WirePub {
  ch: string;
  off: number;
  data: unknown;
  hist?: boolean;
  tags?: Record<string, string>;
  delta?: boolean;
  /** Never on the wire: set by the client on a delta push it could not rebuild, saying why,
   * so that the failure is taken in the channel's order like a publication. */
  broken?: string;
}

/**
 * A subscription's filter of the publications' tags: leaves compare one tag (`ex` / `nex`: it
 * exists or not; `in` / `nin` take `vals`; `gt`..`lte` compare numbers), nodes combine
 * (`not` has one node). Only matching publications are sent, live and recovered.
 */
export type Filter =
  | { key: string; cmp: 'eq' | 'neq' | 'gt' | 'gte' | 'lt' | 'lte'; val: string }
  | { key: string; cmp: 'in' | 'nin'; vals: string[] }
  | { key: string; cmp: 'ex' | 'nex' }
  | { op: 'and' | 'or' | 'not'; nodes: Filter[] };

export interface ErrorBody {
  code: number;
  message: string;
}

/** One bucket of a channel's trend: the numeric values published in [t, t + step) (t: unix ms). */
export interface TrendBucket {
  t: number;
  min: number;
  max: number;
  last: number;
  n: number;
}

/** One tier of a namespace's trend: buckets of `step_s` seconds reaching back `window_s`. */
export interface TrendTier {
  step_s: number;
  window_s: number;
}

/** A channel's downsampled trend (`GET /api/channels/{ch}/trend`, the `trend` subscribe option). */
export interface TrendReply {
  step_s: number;
  buckets: TrendBucket[];
  /** The tiers the channel's namespace keeps, finest first. */
  tiers: TrendTier[];
}

/** One channel's entry of a subscribe reply (and of a `subscribed` push). */
export type WireChannelResult =
  | {
      epoch: string;
      offset: number;
      last?: WirePub | null;
      recovered?: WirePub[];
      complete?: boolean;
      trend?: TrendReply;
    }
  | { error: ErrorBody };

/** A command body by command name (client → server). */
export interface CommandBodies {
  connect: { token?: string; user?: string; password?: string; name?: string };
  subscribe: {
    channels: string[];
    initial?: boolean;
    recover?: Record<string, Position>;
    /** At most this many deliveries per second per channel; the latest value always arrives. */
    max_rate_hz?: number;
    /** Numeric values that moved less than the band from the last one sent are not sent. */
    deadband?: { abs: number } | { pct: number };
    /** Return the channel's trend over this window in the reply (point channels). */
    trend?: { window_s: number; step_s?: number };
    /** Live publications as Fossil deltas of the previous one. */
    delta?: 'fossil';
    /** Only publications whose tags match. */
    filter?: Filter;
  };
  unsubscribe: { channels: string[] };
  publish: { channel: string; data: unknown; tags?: Record<string, string> };
  history: { channel: string; since?: Position; limit?: number };
  presence: { channel: string };
  ping: { data?: unknown };
  refresh: { token: string };
  /** Acknowledges an alarm as the connection's user (docs/alarms.md); `comment` ≤ 500 bytes. */
  alarm_ack: { alarm: string; comment?: string };
  /** Shelves an alarm for `for_s` seconds (1–86,400). */
  alarm_shelve: { alarm: string; for_s: number; comment?: string };
  alarm_unshelve: { alarm: string; comment?: string };
}

export type CommandName = keyof CommandBodies;

/** One command as sent: `{"id": 3, "publish": {...}}`. */
export type Command = { id?: number } & { [K in CommandName]?: CommandBodies[K] };

/** Ok replies by command name. */
export interface ReplyBodies {
  connect: { client: string; node: string; ping_s: number };
  subscribe: { channels: Record<string, WireChannelResult> };
  unsubscribe: Record<string, never>;
  publish: { offset: number; epoch: string };
  history: { publications: WirePub[]; epoch: string; offset: number; complete?: boolean; more?: boolean };
  presence: { clients: PresenceClient[] };
  ping: { data?: unknown };
  refresh: { expires: number };
  /** The alarm commands answer with the alarm's new state. */
  alarm_ack: AlarmState;
  alarm_shelve: AlarmState;
  alarm_unshelve: AlarmState;
}

export interface PresenceClient {
  client: string;
  user: string;
}

export interface PresenceEvent {
  ch: string;
  client: string;
  user: string;
}

export interface DisconnectBody {
  code: number;
  reason: string;
  reconnect: boolean;
}

/** The server ended the subscription of `ch`; the client subscribes it again with recovery. */
export interface UnsubscribedBody {
  ch: string;
  code: number;
  reason: string;
  resubscribe: boolean;
}

/** Anything the server sends. */
export interface ServerMessage {
  id?: number;
  ok?: unknown;
  error?: ErrorBody;
  pub?: WirePub;
  join?: PresenceEvent;
  leave?: PresenceEvent;
  disconnect?: DisconnectBody;
  unsubscribed?: UnsubscribedBody;
  /** Subscriptions the server made for this connection (the application's connect hook),
   * with the same per-channel results as a subscribe reply. */
  subscribed?: { channels: Record<string, WireChannelResult> };
}

/** A reply error or a failure of the connection, with the protocol's code (0 when local). */
export class SwitchboardError extends Error {
  readonly code: number;
  constructor(code: number, message: string) {
    super(message);
    this.name = 'SwitchboardError';
    this.code = code;
  }
}

/** Codes the SDK uses for failures that never reached the server. */
export const LocalCode = {
  /** The connection closed before the reply arrived; the command may or may not have run. */
  Disconnected: 0,
  /** No reply within `commandTimeoutMs`. */
  Timeout: 1,
  /** The client was closed. */
  Closed: 2,
  /** A publication of a `delta` subscription could not be rebuilt; its channel is subscribed
   * again, recovering from its position. */
  Delta: 3,
} as const;

export function toPublication(p: WirePub): Publication {
  const pub: Publication = { channel: p.ch, offset: p.off, data: p.data };
  if (p.hist === true) pub.historical = true;
  if (p.tags) pub.tags = p.tags;
  return pub;
}
