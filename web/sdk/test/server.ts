// Starts the real switchboard binary for the tests: `serve --listen 127.0.0.1:0`, and learns
// its address from the `switchboard listening on http://ADDR` line on stdout.

import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';

const REPO = resolve(import.meta.dirname, '../../..');
export const BIN = process.env.SWITCHBOARD_BIN ?? join(REPO, 'target/debug/switchboard');

export class Server {
  url = '';
  private proc: ChildProcess | null = null;
  readonly dataDir = mkdtempSync(join(tmpdir(), 'sb-sdk-test-'));

  constructor(private readonly extraArgs: string[] = []) {}

  /** Starts the server; `listen` defaults to a free port, or the previous one on a restart. */
  async start(listen = this.url ? this.url.replace('http://', '') : '127.0.0.1:0'): Promise<string> {
    const proc = spawn(BIN, ['serve', '--listen', listen, '--data-dir', this.dataDir, ...this.extraArgs], {
      stdio: ['ignore', 'pipe', 'pipe'],
      // Every SWITCHBOARD_* variable is a configuration key to the server (SWITCHBOARD_BIN is not).
      env: Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SWITCHBOARD_'))),
    });
    this.proc = proc;
    proc.stderr!.on('data', () => {});
    const lines = createInterface({ input: proc.stdout! });
    this.url = await new Promise<string>((ok, fail) => {
      const timer = setTimeout(() => fail(new Error('server did not report its address within 10 s')), 10_000);
      proc.once('exit', (code) => fail(new Error(`server exited with ${code} before listening`)));
      lines.on('line', (line) => {
        const m = /switchboard listening on (http:\/\/\S+)/.exec(line);
        if (m) {
          clearTimeout(timer);
          ok(m[1]);
        }
      });
    });
    return this.url;
  }

  /** Kills the process (SIGKILL: no goodbye to the clients) and waits for it to exit. */
  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const p = this.proc;
    this.proc = null;
    if (!p || p.exitCode !== null) return;
    await new Promise<void>((ok) => {
      p.once('exit', () => ok());
      p.kill(signal);
    });
  }

  async stop(): Promise<void> {
    await this.kill('SIGTERM');
    rmSync(this.dataDir, { recursive: true, force: true });
  }

  async publish(channel: string, data: unknown): Promise<{ offset: number; epoch: string }> {
    const r = await fetch(`${this.url}/api/publish`, { method: 'POST', body: JSON.stringify({ channel, data }) });
    if (!r.ok) throw new Error(`publish ${r.status}: ${await r.text()}`);
    return (await r.json()) as { offset: number; epoch: string };
  }

  async publishBatch(items: { channel: string; data: unknown }[]): Promise<unknown[]> {
    const r = await fetch(`${this.url}/api/publish`, { method: 'POST', body: JSON.stringify({ batch: items }) });
    if (!r.ok) throw new Error(`publish ${r.status}: ${await r.text()}`);
    return ((await r.json()) as { results: unknown[] }).results;
  }
}

/** Resolves when `check()` holds, polling; rejects after `ms` with `what`. */
export async function until(check: () => boolean, what: string, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
