// Transport fallback: WebSocket, then SSE, then long-polling (configurable order). Each
// connection attempt tries the transports in order until one opens; a transport that fails
// before opening (a proxy that refuses the WebSocket upgrade, an environment without
// EventSource) hands over to the next at once. The one that opened is tried first on later
// reconnects. Above it, the client does not know which is in use: commands, replies,
// publications and recovery are the same on all three.

import { pollTransport, defaultFetch, type FetchLike } from './poll.js';
import { defaultEventSource, sseTransport, type EventSourceConstructor } from './sse.js';
import type { Transport, TransportContext, TransportFactory } from './transport.js';
import type { Command } from './types.js';
import { websocketTransport, type WebSocketConstructor } from './websocket.js';

export type TransportName = 'websocket' | 'sse' | 'poll';

export const DEFAULT_TRANSPORTS: TransportName[] = ['websocket', 'sse', 'poll'];

export interface FallbackOptions {
  /** Transports to try, in order (default: websocket, sse, poll). */
  transports?: TransportName[];
  WebSocket?: WebSocketConstructor;
  EventSource?: EventSourceConstructor;
  fetch?: FetchLike;
  /** A transport that has not opened within this many ms is given up for the next (default 8,000). */
  openTimeoutMs?: number;
}

export function fallbackTransport(opts: FallbackOptions = {}): TransportFactory {
  const order = (opts.transports ?? DEFAULT_TRANSPORTS).slice();
  if (order.length === 0) throw new Error('no transport to try');
  const factories: Record<TransportName, TransportFactory> = {
    websocket: websocketTransport({ WebSocket: opts.WebSocket }),
    sse: sseTransport({ EventSource: opts.EventSource, fetch: opts.fetch }),
    poll: pollTransport({ fetch: opts.fetch }),
  };
  const usable = (name: TransportName, ctx: TransportContext): boolean => {
    switch (name) {
      case 'websocket':
        return !!(opts.WebSocket ?? (globalThis as { WebSocket?: unknown }).WebSocket);
      case 'sse':
        return ctx.format === 'json' && !!defaultEventSource(opts) && !!defaultFetch(opts);
      case 'poll':
        return ctx.format === 'json' && !!defaultFetch(opts);
    }
  };
  // Where the next attempt starts: the transport that opened last time.
  let preferred = 0;
  return (ctx: TransportContext): Transport => {
    let current: Transport | null = null;
    let closed = false;
    let timer: ReturnType<typeof setTimeout> | null = null;
    const tried = new Set<number>();
    const next = (from: number, last: { code: number; reason: string }) => {
      if (closed) return;
      for (let k = 0; k < order.length; k++) {
        const i = (from + k) % order.length;
        if (!tried.has(i) && usable(order[i], ctx)) return attempt(i);
      }
      ctx.handlers.onClose(last);
    };
    const attempt = (i: number) => {
      tried.add(i);
      let opened = false;
      let done = false;
      const giveUp = (info: { code: number; reason: string }) => {
        if (done) return;
        done = true;
        if (timer) clearTimeout(timer);
        timer = null;
        if (!closed) next(i + 1, info);
      };
      let t: Transport;
      try {
        t = factories[order[i]]({
          ...ctx,
          handlers: {
            onOpen: () => {
              if (done || closed) return;
              opened = true;
              if (timer) clearTimeout(timer);
              timer = null;
              preferred = i;
              ctx.handlers.onOpen();
            },
            onMessages: (m) => {
              if (!done && !closed) ctx.handlers.onMessages(m);
            },
            onClose: (info) => {
              if (done || closed) return;
              if (opened) {
                done = true;
                ctx.handlers.onClose(info);
              } else {
                giveUp(info);
              }
            },
          },
        });
      } catch (e) {
        return giveUp({ code: 1006, reason: (e as Error).message });
      }
      current = t;
      timer = setTimeout(() => {
        if (opened || done || closed) return;
        t.close(4999, 'open timed out');
        giveUp({ code: 1006, reason: `${t.name} did not open` });
      }, opts.openTimeoutMs ?? 8_000);
    };
    // Not before the factory returned: the client learns about its transport from the return.
    queueMicrotask(() => next(preferred, { code: 1006, reason: 'no usable transport' }));
    return {
      get name() {
        return current?.name ?? 'none';
      },
      send(commands: Command[]) {
        current?.send(commands);
      },
      close(code?: number, reason?: string) {
        if (closed) return;
        closed = true;
        if (timer) clearTimeout(timer);
        current?.close(code, reason);
      },
    };
  };
}
