// Events the client emits.

import type { FrameBatch } from './batcher.js';
import type { Position, PresenceEvent, SwitchboardError, TrendReply } from './types.js';

export type ClientState = 'idle' | 'connecting' | 'connected' | 'disconnected' | 'closed';

export interface ConnectedEvent {
  client: string;
  node: string;
  pingS: number;
  /** 0 for the first connection, then counting reconnects. */
  reconnects: number;
}

export interface DisconnectedEvent {
  code: number;
  reason: string;
  /** Whether the client will reconnect, and after how long. */
  reconnect: boolean;
  delayMs: number;
}

export interface SubscribedEvent {
  channel: string;
  position: Position;
  /** A re-subscription after a reconnect (or an epoch change) rather than the first one. */
  resubscribed: boolean;
  /** Publications delivered from recovery (the missed ones). */
  recovered: number;
  /** The channel's trend up to `position`, when the subscription asked for one (`trend`). */
  trend?: TrendReply;
}

/**
 * The server could not replay everything since the client's last position (`complete: false`):
 * its history no longer reaches back that far, or the channel's epoch changed (the server or
 * broker restarted without persistence). The client delivered the channel's latest publication
 * and, after an epoch change on a non-point channel, the new epoch's history so far.
 */
export interface GapEvent {
  channel: string;
  /** Where the client was. */
  from: Position;
  /** Where the channel is now. */
  to: Position;
  epochChanged: boolean;
}

export interface ClientEvents {
  state: { state: ClientState; previous: ClientState };
  connected: ConnectedEvent;
  disconnected: DisconnectedEvent;
  /** Publications of all channels, once per animation frame. */
  frame: FrameBatch;
  subscribed: SubscribedEvent;
  subscribeError: { channel: string; error: SwitchboardError };
  gap: GapEvent;
  join: PresenceEvent;
  leave: PresenceEvent;
  /** Anything else that went wrong: refused token, undecodable frame, listener errors. */
  error: Error;
}
