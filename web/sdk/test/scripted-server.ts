// A scripted server for the client: the test reads the commands the client sends and writes
// what a node would answer, in frames it chooses. No process, no socket.

import { afterEach, expect } from 'vitest';
import { Client, type ClientOptions, type FrameBatch, type GapEvent, type SubscribedEvent, type TransportFactory } from '../src/index.js';
import type { Command, ServerMessage } from '../src/types.js';

/** One connection of the scripted server. */
export class Conn {
  readonly sent: Command[] = [];
  private taken = 0;
  closed = false;

  constructor(private readonly handlers: { onMessages(m: ServerMessage[]): void; onClose(i: { code: number; reason: string }): void }) {}

  /** Messages from the server, in one frame. */
  push(...msgs: ServerMessage[]): void {
    this.handlers.onMessages(msgs);
  }

  /** The connection fails. */
  drop(): void {
    this.closed = true;
    this.handlers.onClose({ code: 1006, reason: 'dropped' });
  }

  /** The next command the client sent (after those taken before), once it sent one. */
  async next(): Promise<Command> {
    await until(() => this.sent.length > this.taken, 'a command');
    return this.sent[this.taken++];
  }

  /** Commands sent and not taken yet. */
  untaken(): Command[] {
    return this.sent.slice(this.taken);
  }

  /** Answers the `connect` command. */
  async accept(): Promise<void> {
    const c = await this.next();
    expect(c.connect).toBeDefined();
    this.push({ id: c.id, ok: { client: 'c1', node: 'n1', ping_s: 25 } });
  }
}

export class ScriptedServer {
  readonly conns: Conn[] = [];

  readonly transport: TransportFactory = (ctx) => {
    const conn = new Conn(ctx.handlers);
    this.conns.push(conn);
    queueMicrotask(() => ctx.handlers.onOpen());
    return {
      name: 'scripted',
      send: (cmds) => conn.sent.push(...cmds),
      close: () => {
        conn.closed = true;
      },
    };
  };

  /** The `n`th connection the client opens, once it did. */
  async conn(n: number): Promise<Conn> {
    await until(() => this.conns.length >= n, `connection ${n}`);
    return this.conns[n - 1];
  }
}

export async function until(check: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 5_000;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 1));
  }
}

const clients: Client[] = [];
afterEach(() => {
  for (const c of clients.splice(0)) c.close();
});

/** A client on a scripted server whose frames are delivered when the test says (`flush`),
 * with what it emitted; closed after each test. */
export function scripted(opts: Partial<ClientOptions> = {}) {
  const server = new ScriptedServer();
  let run: (() => void) | null = null;
  const c = new Client({
    url: 'http://scripted',
    transport: server.transport,
    reconnect: { minDelayMs: 1, maxDelayMs: 2 },
    random: () => 0,
    schedule: (flush) => (run = flush),
    ...opts,
  });
  clients.push(c);
  const frames: FrameBatch[] = [];
  const gaps: GapEvent[] = [];
  const subscribed: SubscribedEvent[] = [];
  const errors: { code: number; message: string }[] = [];
  c.on('frame', (b) => frames.push(b));
  c.on('gap', (g) => gaps.push(g));
  c.on('subscribed', (s) => subscribed.push(s));
  c.on('error', (e) => errors.push({ code: (e as { code?: number }).code ?? -1, message: e.message }));
  /** Delivers the pending frame (once replies resolved, in microtasks, were applied); its
   * publications. */
  const flush = async () => {
    await new Promise((r) => setTimeout(r, 0));
    const f = run;
    run = null;
    f?.();
    const b = f ? frames[frames.length - 1] : undefined;
    return b?.publications ?? [];
  };
  return { server, c, frames, gaps, subscribed, errors, flush };
}
