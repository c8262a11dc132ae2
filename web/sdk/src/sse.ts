// The Server-Sent Events transport: a poll session (poll.ts) whose messages stream over
// `GET /sse?session=<id>` (docs/protocol.md "Server-Sent Events"); commands go by
// `POST /poll/<id>`. Each event's data is one protocol message, as on a WebSocket. JSON only.
//
// EventSource reconnects by itself; this transport does not let it: a dropped stream is a
// closed transport, and the client reconnects and recovers every channel from its position,
// the same way for every transport.

import { defaultFetch, PollSession, type FetchLike } from './poll.js';
import type { Transport, TransportContext, TransportFactory } from './transport.js';
import type { Command, ServerMessage } from './types.js';

/** The parts of the WHATWG EventSource the transport uses. */
export interface EventSourceLike {
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  close(): void;
}

export type EventSourceConstructor = new (url: string) => EventSourceLike;

export interface SseTransportOptions {
  /** The EventSource implementation; defaults to `globalThis.EventSource`. */
  EventSource?: EventSourceConstructor;
  fetch?: FetchLike;
}

export function defaultEventSource(opts: SseTransportOptions): EventSourceConstructor | null {
  return opts.EventSource ?? (globalThis as { EventSource?: EventSourceConstructor }).EventSource ?? null;
}

export function sseTransport(opts: SseTransportOptions = {}): TransportFactory {
  return (ctx: TransportContext): Transport => {
    if (ctx.format !== 'json') throw new Error('SSE carries JSON only');
    const Impl = defaultEventSource(opts);
    if (!Impl) throw new Error('no EventSource implementation: pass options.EventSource');
    const fetch = defaultFetch(opts);
    if (!fetch) throw new Error('no fetch implementation: pass options.fetch');
    const abort = new AbortController();
    let closed = false;
    let es: EventSourceLike | null = null;
    const stop = () => {
      if (es) {
        es.onopen = es.onmessage = es.onerror = null;
        es.close();
        es = null;
      }
      abort.abort();
      session.end();
    };
    const finish = (code: number, reason: string) => {
      if (closed) return;
      closed = true;
      stop();
      ctx.handlers.onClose({ code, reason });
    };
    const session = new PollSession(ctx, fetch, abort.signal, finish);
    const run = async () => {
      if (!(await session.open()) || closed) return;
      const source = new Impl(`${ctx.baseUrl}/sse?session=${encodeURIComponent(session.id)}`);
      es = source;
      let opened = false;
      source.onopen = () => {
        if (opened || closed) return;
        opened = true;
        ctx.handlers.onOpen();
      };
      source.onmessage = (ev) => {
        let m: ServerMessage;
        try {
          m = JSON.parse(ev.data) as ServerMessage;
        } catch (e) {
          return finish(4010, `undecodable event: ${(e as Error).message}`);
        }
        if (!closed) ctx.handlers.onMessages([m]);
      };
      // The stream ended (a `disconnect` came first, if the server said why) or failed.
      source.onerror = () => finish(1006, opened ? 'event stream ended' : 'event stream refused');
    };
    run().catch((e: Error) => finish(1006, e.message));
    return {
      name: 'sse',
      send(commands: Command[]) {
        if (!closed) session.send(commands);
      },
      close() {
        if (closed) return;
        closed = true;
        stop();
      },
    };
  };
}
