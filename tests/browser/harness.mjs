// Shared by the browser tests: the real switchboard binary and Debian's Chromium.

import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const BIN = process.env.SWITCHBOARD_BIN ?? join(REPO, 'target/debug/switchboard');
export const WEB_DIR = join(REPO, 'web/dashboard/dist');
export const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
export const OUT = join(REPO, 'tests/browser/out');

/** A switchboard process: `serve` or `demo`, restartable on the same address and data dir. */
export class Server {
  url = '';
  proc = null;
  tmpDir = null;

  constructor({ command = 'serve', args = [], dataDir = null, env = {} } = {}) {
    this.command = command;
    this.args = args;
    this.ownsData = !dataDir;
    this.dataDir = dataDir ?? mkdtempSync(join(tmpdir(), 'sb-browser-test-'));
    this.env = env;
  }

  async start() {
    const listen = this.url ? this.url.replace('http://', '') : '127.0.0.1:0';
    // Every SWITCHBOARD_* variable is configuration to the server; pass only what the test sets.
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SWITCHBOARD_')));
    const args = [this.command, '--listen', listen, ...this.args];
    if (!('SWITCHBOARD_DATA_DIR' in this.env)) args.push('--data-dir', this.dataDir);
    if (!this.args.includes('--web-dir')) args.push('--web-dir', WEB_DIR);
    // Its own process group: a kill reaches what the server started too (the demo's mosquitto),
    // which would otherwise outlive a SIGKILLed server.
    // The server's own temporary files (the demo's mosquitto configuration) go into a
    // directory `stop` removes: a server killed with SIGKILL cannot remove them itself.
    this.tmpDir ??= mkdtempSync(join(tmpdir(), 'sb-browser-tmp-'));
    env.TMPDIR = this.tmpDir;
    const proc = spawn(BIN, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...env, ...this.env }, detached: true });
    this.proc = proc;
    let stderr = '';
    proc.stderr.on('data', (d) => (stderr = (stderr + d).slice(-4000)));
    const lines = createInterface({ input: proc.stdout });
    this.url = await new Promise((ok, fail) => {
      const timer = setTimeout(() => fail(new Error(`no address within 10 s: ${stderr}`)), 10_000);
      proc.once('exit', (code) => fail(new Error(`server exited with ${code}: ${stderr}`)));
      lines.on('line', (l) => {
        const m = /switchboard listening on (http:\/\/\S+)/.exec(l);
        if (m) {
          clearTimeout(timer);
          ok(m[1]);
        }
      });
    });
    return this;
  }

  async kill(signal = 'SIGKILL') {
    const p = this.proc;
    this.proc = null;
    if (!p || p.exitCode !== null) return;
    await new Promise((ok) => {
      p.once('exit', ok);
      p.kill(signal);
    });
    // Whatever the server started and left behind (a SIGKILLed demo's mosquitto).
    try {
      process.kill(-p.pid, 'SIGKILL');
    } catch {
      /* the group is gone already */
    }
  }

  async stop() {
    await this.kill('SIGTERM');
    if (this.ownsData) rmSync(this.dataDir, { recursive: true, force: true });
    if (this.tmpDir) rmSync(this.tmpDir, { recursive: true, force: true });
    this.tmpDir = null;
  }

  async publish(channel, data) {
    const r = await fetch(`${this.url}/api/publish`, { method: 'POST', body: JSON.stringify({ channel, data }) });
    if (!r.ok) throw new Error(`publish: ${r.status} ${await r.text()}`);
    return r.json();
  }

  async putDashboard(id, body) {
    const r = await fetch(`${this.url}/api/dashboards/${id}`, { method: 'PUT', body: JSON.stringify(body) });
    if (!r.ok) throw new Error(`PUT dashboard: ${r.status} ${await r.text()}`);
    return r.json();
  }
}

export async function launch() {
  return chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--no-first-run'],
  });
}

/** A page that fails the test on uncaught page errors. */
export async function newPage(browser, viewport = { width: 1400, height: 900 }) {
  const page = await browser.newPage({ viewport, acceptDownloads: true });
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(e.message));
  return page;
}

export const stats = (page) => page.evaluate(() => window.switchboardStats());

/** Waits until every widget of the page has a value. */
export async function allValues(page, count, timeout = 15_000) {
  await page.waitForFunction(
    (n) => {
      const s = window.switchboardStats?.();
      return s && s.widgets === n && s.widgetsWithValue === n;
    },
    count,
    { timeout },
  );
}

/**
 * Screenshots a page region and measures it in the page: how many pixels differ from its most
 * common colour (the panel), how many distinct colours there are, and how many pixels are near
 * each of `probe` colours ('#rrggbb'; anti-aliased edges within a distance of 60 count).
 */
export async function inkOf(page, rect, probe = []) {
  const png = await page.screenshot({ clip: rect });
  return page.evaluate(
    async ([b64, probe]) => {
      const blob = await (await fetch(`data:image/png;base64,${b64}`)).blob();
      const img = await createImageBitmap(blob);
      const c = new OffscreenCanvas(img.width, img.height);
      const ctx = c.getContext('2d');
      ctx.drawImage(img, 0, 0);
      const d = ctx.getImageData(0, 0, img.width, img.height).data;
      const targets = probe.map((hex) => [parseInt(hex.slice(1, 3), 16), parseInt(hex.slice(3, 5), 16), parseInt(hex.slice(5, 7), 16)]);
      const near = probe.map(() => 0);
      const counts = new Map();
      for (let i = 0; i < d.length; i += 4) {
        const k = (d[i] << 16) | (d[i + 1] << 8) | d[i + 2];
        counts.set(k, (counts.get(k) ?? 0) + 1);
        targets.forEach(([r, g, b], j) => {
          if (Math.abs(d[i] - r) + Math.abs(d[i + 1] - g) + Math.abs(d[i + 2] - b) < 60) near[j]++;
        });
      }
      let most = 0;
      for (const n of counts.values()) if (n > most) most = n;
      return { inked: d.length / 4 - most, colors: counts.size, pixels: d.length / 4, near: Object.fromEntries(probe.map((p, j) => [p, near[j]])) };
    },
    [png.toString('base64'), probe],
  );
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
