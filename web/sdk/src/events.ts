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
  /** The server made this subscription for the connection (the application's connect hook,
   * announced by a `subscribed` push) rather than the application. */
  server?: true;
}

/**
 * Publications since the client's last position could not be replayed: the channel's history
 * no longer reaches back that far (or it keeps none, as point channels), or the channel's epoch
 * changed (the server or broker restarted without persistence) after the client had received
 * publications of the old one. Emitted before what could still be delivered: what history
 * holds, then the channel's latest publication (and, after an epoch change on a non-point
 * channel, the new epoch's history so far). Not emitted when nothing was missed, e.g. for a
 * channel never published before a restart.
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
  /** A channel's subscription was confirmed: one the application asked for, or one the server
   * made (`server`), whose publications are then delivered like any other (`frame`, and the
   * handles `subscribe` adds for it). */
  subscribed: SubscribedEvent;
  /** A channel was refused: one the application asked for, or one the server could not
   * subscribe for the connection. */
  subscribeError: { channel: string; error: SwitchboardError };
  gap: GapEvent;
  join: PresenceEvent;
  leave: PresenceEvent;
  /** Anything else that went wrong: refused token, undecodable frame, listener errors. */
  error: Error;
}
