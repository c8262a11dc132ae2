// Wire types of the Switchboard WebSocket protocol v1 (docs/protocol.md) and the SDK's own
// public shapes built on them.

import type { AlarmState } from './alarms.js';

/** A channel's place in its stream: offsets count publications within one epoch. */
export interface Position {
  epoch: string;
  offset: number;
}

/** A publication as the application sees it. */
export interface Publication {
  channel: string;
  offset: number;
  data: unknown;
}

/** The compact publication form used everywhere on the WebSocket. */
export interface WirePub {
  ch: string;
  off: number;
  data: unknown;
}

export interface ErrorBody {
  code: number;
  message: string;
}

/** One channel's entry of a subscribe reply. */
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
  };
  unsubscribe: { channels: string[] };
  publish: { channel: string; data: unknown };
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
} as const;

export function toPublication(p: WirePub): Publication {
  return { channel: p.ch, offset: p.off, data: p.data };
}
