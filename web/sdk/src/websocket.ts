// The WebSocket transport (`GET /ws`, SPEC §2).

import type { Transport, TransportContext, TransportFactory } from './transport.js';
import type { Command } from './types.js';

/** The parts of the WHATWG WebSocket the transport uses (browsers, Node's `ws`). */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  readonly protocol: string;
  send(data: string | ArrayBufferLike | Uint8Array): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
}

export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocketLike;

export interface WebSocketTransportOptions {
  /** The WebSocket implementation; defaults to `globalThis.WebSocket`. */
  WebSocket?: WebSocketConstructor;
  /** Path of the endpoint; default `/ws`. */
  path?: string;
}

/** The WebSocket URL for a base URL (`http://h` → `ws://h/ws`). */
export function wsUrl(baseUrl: string, path = '/ws'): string {
  return baseUrl.replace(/^http/, 'ws') + path;
}

export function websocketTransport(opts: WebSocketTransportOptions = {}): TransportFactory {
  return (ctx: TransportContext): Transport => {
    const Impl =
      opts.WebSocket ?? (globalThis as unknown as { WebSocket?: WebSocketConstructor }).WebSocket;
    if (!Impl) throw new Error('no WebSocket implementation: pass options.WebSocket (e.g. the `ws` package)');
    const ws = new Impl(wsUrl(ctx.baseUrl, opts.path), ctx.codec.subprotocol);
    ws.binaryType = 'arraybuffer';
    let closed = false;
    const finish = (code: number, reason: string) => {
      if (closed) return;
      closed = true;
      ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
      ctx.handlers.onClose({ code, reason });
    };
    ws.onopen = () => ctx.handlers.onOpen();
    ws.onmessage = (ev) => {
      let messages;
      try {
        messages = ctx.codec.decode(ev.data as string | ArrayBuffer);
      } catch (e) {
        // A frame we cannot read means we no longer know the stream's state: start over.
        try {
          ws.close(4010, 'undecodable frame');
        } catch {
          /* already closing */
        }
        finish(4010, `undecodable frame: ${(e as Error).message}`);
        return;
      }
      ctx.handlers.onMessages(messages);
    };
    ws.onclose = (ev) => finish(ev.code, ev.reason);
    // An error is always followed by a close event; the close carries the code.
    ws.onerror = () => {};
    return {
      name: 'websocket',
      send(commands: Command[]) {
        ws.send(ctx.codec.encode(commands));
      },
      close(code = 1000, reason = '') {
        if (closed) return;
        closed = true;
        ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
        try {
          ws.close(code, reason);
        } catch {
          /* not open yet or already closed */
        }
      },
    };
  };
}
