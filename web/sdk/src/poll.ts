// The long-polling transport (SPEC §3, docs/protocol.md "Long-polling"), and the session
// plumbing the SSE transport shares: `POST /poll` opens a session, `POST /poll/{id}` carries
// commands, `GET /poll/{id}?ack=<seq>` is held until messages are pending and answers all of
// them in one batch. Replies come back in the polls, in order with the publications, so the
// client above sees exactly what a WebSocket would give it. JSON only.

import type { Transport, TransportContext, TransportFactory } from './transport.js';
import type { Command, ServerMessage } from './types.js';

export type FetchLike = (input: string, init?: RequestInit) => Promise<Response>;

export interface PollTransportOptions {
  /** The fetch implementation; defaults to `globalThis.fetch`. */
  fetch?: FetchLike;
  /** Longest a poll is held, seconds (the server's `poll_timeout_s` caps it). */
  timeoutS?: number;
}

/** Close codes for HTTP answers, as the client's reconnect logic understands them. */
export function closeCodeOf(status: number): number {
  switch (status) {
    case 400:
      return 4010; // not a command: as a bad WebSocket frame
    case 401:
      return 4001;
    case 403:
      return 4003;
    case 413:
      return 1009;
    case 429:
      return 4029;
    default:
      return 1006; // unknown session, server error, network: reconnect and recover
  }
}

async function reasonOf(r: Response): Promise<string> {
  try {
    const body = (await r.json()) as { error?: { message?: string } };
    return body.error?.message ?? `HTTP ${r.status}`;
  } catch {
    return `HTTP ${r.status}`;
  }
}

export function defaultFetch(opts: { fetch?: FetchLike }): FetchLike | null {
  if (opts.fetch) return opts.fetch;
  const f = (globalThis as { fetch?: FetchLike }).fetch;
  return f ? f.bind(globalThis) : null;
}

/**
 * A poll session's outgoing side: opens the session, sends commands one body after the other
 * (their order is the order of the replies), ends the session. Used by the long-polling and
 * the SSE transports.
 */
export class PollSession {
  id = '';
  private queue: Promise<void> = Promise.resolve();
  private ended = false;

  constructor(
    private readonly ctx: TransportContext,
    private readonly fetch: FetchLike,
    private readonly signal: AbortSignal,
    private readonly fail: (code: number, reason: string) => void,
  ) {}

  /** `POST /poll`; false (after `fail`) when the server refused. */
  async open(): Promise<boolean> {
    const r = await this.fetch(`${this.ctx.baseUrl}/poll`, { method: 'POST', signal: this.signal, cache: 'no-store' });
    if (!r.ok) {
      this.fail(closeCodeOf(r.status), await reasonOf(r));
      return false;
    }
    const body = (await r.json()) as { session?: string };
    if (!body.session) {
      this.fail(1006, 'no session in the answer');
      return false;
    }
    this.id = body.session;
    return true;
  }

  /** Queues commands behind those already sent. */
  send(commands: Command[]): void {
    const body = this.ctx.codec.encode(commands) as string;
    this.queue = this.queue.then(async () => {
      if (this.ended) return;
      try {
        // text/plain keeps the request simple (no CORS preflight); the server reads JSON.
        const r = await this.fetch(`${this.ctx.baseUrl}/poll/${this.id}`, {
          method: 'POST',
          body,
          headers: { 'content-type': 'text/plain;charset=UTF-8' },
          signal: this.signal,
        });
        if (r.status !== 202) this.fail(closeCodeOf(r.status), await reasonOf(r));
      } catch (e) {
        this.fail(1006, `command not sent: ${(e as Error).message}`);
      }
    });
  }

  /** Ends the session on the server (best effort). */
  end(): void {
    if (this.ended || !this.id) return;
    this.ended = true;
    this.fetch(`${this.ctx.baseUrl}/poll/${this.id}`, { method: 'DELETE', keepalive: true }).catch(() => {});
  }
}

export function pollTransport(opts: PollTransportOptions = {}): TransportFactory {
  return (ctx: TransportContext): Transport => {
    if (ctx.format !== 'json') throw new Error('long-polling carries JSON only');
    const fetch = defaultFetch(opts);
    if (!fetch) throw new Error('no fetch implementation: pass options.fetch');
    const abort = new AbortController();
    let closed = false;
    const finish = (code: number, reason: string) => {
      if (closed) return;
      closed = true;
      abort.abort();
      session.end();
      ctx.handlers.onClose({ code, reason });
    };
    const session = new PollSession(ctx, fetch, abort.signal, finish);
    const run = async () => {
      if (!(await session.open()) || closed) return;
      ctx.handlers.onOpen();
      let seq = 0;
      const timeout = opts.timeoutS !== undefined ? `&timeout=${opts.timeoutS}` : '';
      while (!closed) {
        const r = await fetch(`${ctx.baseUrl}/poll/${session.id}?ack=${seq}${timeout}`, {
          signal: abort.signal,
          cache: 'no-store',
        });
        // A newer poll of ours reached the server first (a retried request): harmless.
        if (r.status === 409) continue;
        if (!r.ok) return finish(closeCodeOf(r.status), await reasonOf(r));
        const batch = (await r.json()) as { seq: number; messages: ServerMessage[] };
        seq = batch.seq;
        if (batch.messages.length > 0 && !closed) ctx.handlers.onMessages(batch.messages);
      }
    };
    run().catch((e: Error) => finish(1006, e.message));
    return {
      name: 'poll',
      send(commands: Command[]) {
        if (!closed) session.send(commands);
      },
      close() {
        if (closed) return;
        closed = true;
        abort.abort();
        session.end();
      },
    };
  };
}
