// switchboard-sdk: the TypeScript client of the Switchboard push gateway.
//
//   const client = new Client({ url: 'http://127.0.0.1:8700' });
//   client.on('frame', (batch) => render(batch.publications));
//   client.subscribeMany(['pt:boiler.temp', 'room:ops']);
//   await client.connect();
//
// # Layout
// - client.ts: the connection's lifecycle (connect, reconnect with backoff.ts, heartbeats),
//   commands and their replies, subscriptions by channel; options.ts and events.ts are what
//   it is given and what it emits.
// - recovery.ts: each channel's position and what a reply, a `subscribed` push, a publication
//   or an epoch change does to it (in order, at most once, `gap` when history does not reach
//   back; a historical publication never the latest value).
// - subscription.ts: the handles an application holds (several may share a channel).
// - batcher.ts: delivery once per animation frame, point channels conflated.
// - delta.ts: publications of `delta: 'fossil'` subscriptions rebuilt from their text or
//   Fossil delta (the `fossil-delta` package), before recovery sees them.
// - framing.ts: commands cut into frames under the server's frame limit; heartbeat.ts: the
//   check of a silent connection.
// - transport.ts: the transport interface; websocket.ts, sse.ts and poll.ts implement it, and
//   fallback.ts tries them in order. codec.ts frames JSON and MessagePack.
// - types.ts: wire types of protocol v1; emitter.ts: the typed event emitter.
// - alarms.ts: the server's alarm states and journal entries, their order, and `AlarmBook`
//   (one state per alarm from `alarm:all` and `GET /api/alarms`).

export { Client } from './client.js';
export type { ClientOptions, Credentials, SubscribeOptions, HistoryOptions, HistoryResult, ClientStats, PublishOptions } from './options.js';
export { Subscription } from './subscription.js';
export type { SubscriptionEvents, SubscriptionState } from './subscription.js';
export type {
  ClientEvents,
  ClientState,
  ConnectedEvent,
  DisconnectedEvent,
  GapEvent,
  SubscribedEvent,
} from './events.js';
export { FrameBatcher, defaultScheduler } from './batcher.js';
export type { FrameBatch, Scheduler } from './batcher.js';
export { Backoff } from './backoff.js';
export type { BackoffOptions } from './backoff.js';
export { JsonCodec, MsgpackCodec, codecFor } from './codec.js';
export type { Codec, Format } from './codec.js';
export { baseUrlOf } from './transport.js';
export type { Transport, TransportContext, TransportFactory, TransportHandlers } from './transport.js';
export { websocketTransport, wsUrl } from './websocket.js';
export { sseTransport } from './sse.js';
export type { EventSourceConstructor, EventSourceLike, SseTransportOptions } from './sse.js';
export { pollTransport } from './poll.js';
export type { FetchLike, PollTransportOptions } from './poll.js';
export { fallbackTransport, DEFAULT_TRANSPORTS } from './fallback.js';
export type { FallbackOptions, TransportName } from './fallback.js';
export type { WebSocketConstructor, WebSocketLike, WebSocketTransportOptions } from './websocket.js';
export { SwitchboardError, LocalCode } from './types.js';
export { AlarmBook, ALARMS_CHANNEL, ALARM_JOURNAL_KINDS, compareAlarms, isAlarmState, needsAttention } from './alarms.js';
export type { AlarmJournalEntry, AlarmJournalKind, AlarmPriority, AlarmSeverity, AlarmState, AlarmStateName } from './alarms.js';
export type { Filter, Position, Publication, PresenceClient, PresenceEvent, ErrorBody, TrendBucket, TrendReply, TrendTier } from './types.js';
export { DeltaChains, DEFAULT_MAX_DELTA_BYTES } from './delta.js';
