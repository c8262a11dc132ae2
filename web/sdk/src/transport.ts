// The transport interface: how commands reach the server and messages come back. The client
// owns everything above it (replies, subscriptions, recovery, reconnects), so a transport only
// moves protocol messages. Implementations: WebSocket (websocket.ts), SSE (sse.ts) and
// long-polling (poll.ts, SPEC §3); fallback.ts tries them in order.

import type { Codec, Format } from './codec.js';
import type { Command, ServerMessage } from './types.js';

export interface TransportHandlers {
  /** The transport is ready to send. */
  onOpen(): void;
  /** Messages from the server, in arrival order. */
  onMessages(messages: ServerMessage[]): void;
  /** The transport closed (called once; never after `close()` was called by the client). */
  onClose(info: { code: number; reason: string }): void;
}

export interface Transport {
  readonly name: string;
  /** Sends commands, in order, as one unit when the transport can. Only after `onOpen`. */
  send(commands: Command[]): void;
  /** Closes without calling `onClose`. */
  close(code?: number, reason?: string): void;
}

export interface TransportContext {
  /** The server's base URL (`http://host:port`). */
  baseUrl: string;
  format: Format;
  codec: Codec;
  handlers: TransportHandlers;
}

export type TransportFactory = (ctx: TransportContext) => Transport;

/** Normalizes `ws://h/ws`, `http://h`, `h:port` into the base URL `http(s)://h[:port]`. */
export function baseUrlOf(url: string): string {
  let u = url.trim();
  if (!/^[a-z]+:\/\//i.test(u)) u = 'http://' + u;
  const parsed = new URL(u);
  const scheme = parsed.protocol === 'wss:' || parsed.protocol === 'https:' ? 'https:' : 'http:';
  let path = parsed.pathname.replace(/\/+$/, '');
  if (path.endsWith('/ws')) path = path.slice(0, -3);
  return `${scheme}//${parsed.host}${path}`;
}
