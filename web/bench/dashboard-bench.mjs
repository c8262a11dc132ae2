#!/usr/bin/env node
// Browser benchmark of the dashboard: a saved dashboard of N widgets (mixed types) in headless
// Chromium, fed by the server's simulator. Measures the time from navigation until every widget
// shows a value, then the sustained rate of applied widget updates and rendered frames.
//
//   node web/bench/dashboard-bench.mjs --widgets 100,1000,10000 [--rate 24000] [--duration 30]
//        [--viewport 1920x1080] [--bin target/release/switchboard] [--out web/bench/out]
//        [--screenshot docs/img/dashboard-1000.png] [--trends 200 --trend-window 3600]
//        [--profile out/open.cpuprofile] [--max-complete-ms 1000] [--min-fps 30]
//
// With --max-complete-ms and/or --min-fps a run passes only within them (and with no page
// error); the report says `"pass"` for each run and the exit code is 1 when one failed.
//
// Widget i is bound to channel pt:sim.<i>, whose kind follows i % 4 as in the server's simulator
// (random walk, sine, boolean, 64-bin spectrum): value and gauge on walks, trend and scatter on
// sines (one in eight widgets is a trend), LEDs on booleans, spectra on arrays. Each channel is
// published at rate/N Hz, so the page is offered `rate` publications per second whatever N.
//
// --feed api (default): this script publishes through the HTTP API every 10 ms, each tick the
// next slice of channels, so updates arrive evenly spread like a real plant's.
// --feed sim: the server's `--simulate N@HZ`, which publishes every channel at once per tick
// (bursts; at 10,000 channels and 2.4 Hz the page has nothing to draw between bursts).
//
// --trends K: K widgets on numeric channels (from the first) are trends, instead of one in
// eight; --trend-window S gives them an S-second window, and before the page opens each trend
// channel gets S seconds of history, one value per second with its own past time `t` (the
// server files such values in their trend buckets), so every trend opens with a full window.
// "All values" then also waits for every trend to have received its server-side trend and to
// have been drawn with it.

import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, '../..');

function parseArgs(argv) {
  const a = {
    widgets: [1000],
    rate: 24000,
    duration: 30,
    viewport: '1920x1080',
    cell: 0,
    bin: process.env.SWITCHBOARD_BIN ?? join(repo, 'target/release/switchboard'),
    out: join(here, 'out'),
    screenshot: '',
    chromium: '/usr/bin/chromium',
    feed: 'api',
    trends: -1,
    // Another build of the app (e.g. an earlier commit's) to compare against.
    'web-dir': join(repo, 'web/dashboard/dist'),
    'trend-window': 10,
    // A CPU profile of the measured navigation, until every value is shown (open it in a
    // browser's developer tools), and a summary of where the time went on stderr.
    profile: '',
    'max-complete-ms': 0,
    'min-fps': 0,
  };
  for (let i = 2; i < argv.length; i++) {
    const k = argv[i].replace(/^--/, '');
    const v = argv[++i];
    if (v === undefined) throw new Error(`--${k} needs a value`);
    if (k === 'widgets') a.widgets = v.split(',').map(Number);
    else if (k in a) a[k] = typeof a[k] === 'number' ? Number(v) : v;
    else throw new Error(`unknown option --${k}`);
  }
  return a;
}

/** The widget for channel index i (see the header); with `trends` ≥ 0, the first that many
 * numeric channels (i % 4 of 0 or 1) carry trends and no other widget is one. */
function widgetType(i, trends = -1) {
  if (trends >= 0) {
    if (i % 4 <= 1 && Math.floor(i / 4) * 2 + (i % 4) < trends) return 'trend';
    const t = widgetType(i);
    return t === 'trend' ? 'value' : t;
  }
  switch (i % 8) {
    case 0:
      return 'value';
    case 4:
      return 'gauge';
    case 1:
      return 'trend';
    case 5:
      return 'scatter';
    case 2:
    case 6:
      return 'led';
    default:
      return 'spectrum';
  }
}

/** N widgets of 6×3 grid cells, row by row across the viewport's width. */
function benchDashboard(n, viewportW, trends = -1, trendWindow = 10) {
  const w = 6;
  const h = 3;
  const cols = Math.max(1, Math.floor(viewportW / (w * 20)));
  const widgets = [];
  for (let i = 0; i < n; i++) {
    const type = widgetType(i, trends);
    const options = { label: `sim.${i}` };
    if (type === 'gauge') Object.assign(options, { min: 0, max: 80 });
    if (type === 'spectrum') Object.assign(options, { min: 0, max: 50 });
    if (type === 'trend') Object.assign(options, { window_s: trendWindow });
    widgets.push({ type, channel: `pt:sim.${i}`, x: (i % cols) * w, y: Math.floor(i / cols) * h, w, h, options });
  }
  return { title: `Benchmark: ${n} widgets`, widgets };
}

/**
 * Publishes `rate` point values per second over N channels through `POST /api/publish`, one
 * batch every 10 ms with the next slice of channels, round-robin. Values follow the simulator's
 * kinds. Returns a function that stops it and resolves with the count published.
 */
function startFeed(url, n, rate) {
  const walk = Float64Array.from({ length: n }, (_, i) => 20 + (i % 50));
  const flag = Uint8Array.from({ length: n }, () => (Math.random() < 0.5 ? 1 : 0));
  const t0 = Date.now();
  let cursor = 0;
  let owed = 0;
  let published = 0;
  let stopped = false;
  let inflight = Promise.resolve();
  const value = (i, now) => {
    const secs = (now - t0) / 1000;
    switch (i % 4) {
      case 0:
        walk[i] += (Math.random() - 0.5) * 0.4;
        return Math.round(walk[i] * 1000) / 1000;
      case 1:
        return Math.round(Math.sin(secs * (0.2 + (i % 7) * 0.1) * 2 * Math.PI) * 100000) / 10000;
      case 2:
        if (Math.random() < 0.05) flag[i] ^= 1;
        return flag[i] === 1;
      default: {
        const peak = 8 + 4 * Math.sin(secs * 0.3);
        return Array.from({ length: 64 }, (_, b) => Math.round((40 * Math.exp(-((b - peak) ** 2) / 6) + Math.random() * 3) * 100) / 100);
      }
    }
  };
  let last = Date.now();
  const timer = setInterval(() => {
    const now = Date.now();
    owed += (rate * (now - last)) / 1000;
    last = now;
    const count = Math.floor(owed);
    if (count === 0) return;
    owed -= count;
    const batch = new Array(count);
    for (let k = 0; k < count; k++) {
      const i = cursor;
      cursor = (cursor + 1) % n;
      batch[k] = { channel: `pt:sim.${i}`, data: { v: value(i, now), t: now, q: 'good' } };
    }
    const body = JSON.stringify({ batch });
    // One request at a time keeps publications of a channel in order.
    inflight = inflight.then(async () => {
      if (stopped) return;
      const r = await fetch(`${url}/api/publish`, { method: 'POST', body });
      await r.arrayBuffer();
      if (r.ok) published += count;
    });
  }, 10);
  const stop = async () => {
    stopped = true;
    clearInterval(timer);
    await inflight.catch(() => {});
    return published;
  };
  stop.published = () => published;
  return stop;
}

/**
 * Publishes `seconds` of history to each channel: one value per second with its own time `t`
 * in the past, in batches through the HTTP API. Returns the count published.
 */
async function backfillHistory(url, channels, seconds) {
  const now = Date.now();
  let published = 0;
  let batch = [];
  const send = async () => {
    const r = await fetch(`${url}/api/publish`, { method: 'POST', body: JSON.stringify({ batch }) });
    if (!r.ok) throw new Error(`backfill publish: ${r.status} ${await r.text()}`);
    await r.arrayBuffer();
    published += batch.length;
    batch = [];
  };
  for (let s = seconds - 1; s > 0; s--) {
    const t = now - s * 1000;
    for (const ch of channels) batch.push({ channel: ch, data: { v: Math.round(Math.sin(t / 60_000 + ch.length) * 1e4) / 1e3, t, q: 'good' } });
    if (batch.length >= 5000) await send();
  }
  if (batch.length > 0) await send();
  return published;
}

async function startServer(bin, args) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SWITCHBOARD_')));
  const proc = spawn(bin, args, { stdio: ['ignore', 'pipe', 'inherit'], env });
  const lines = createInterface({ input: proc.stdout });
  const url = await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error('server did not start within 10 s')), 10_000);
    proc.once('exit', (code) => fail(new Error(`server exited with ${code}`)));
    lines.on('line', (l) => {
      const m = /listening on (http:\/\/\S+)/.exec(l);
      if (m) {
        clearTimeout(timer);
        ok(m[1]);
      }
    });
  });
  return { proc, url };
}

async function stopServer(proc) {
  if (proc.exitCode !== null) return;
  await new Promise((ok) => {
    proc.once('exit', ok);
    proc.kill('SIGTERM');
  });
}

/** CPU seconds of a process from /proc (Linux), or null. */
async function cpuSeconds(pid) {
  try {
    const { readFileSync } = await import('node:fs');
    const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch {
    return null;
  }
}

async function runOne(browser, opts, n) {
  const [vw, vh] = opts.viewport.split('x').map(Number);
  const hz = Math.min(1000, opts.rate / n);
  const data = mkdtempSync(join(tmpdir(), 'sb-dash-bench-'));
  const sim = opts.feed === 'sim' ? ['--simulate', `${n}@${hz}`] : [];
  const { proc, url } = await startServer(opts.bin, [
    'serve',
    '--listen',
    '127.0.0.1:0',
    ...sim,
    '--data-dir',
    data,
    '--web-dir',
    opts['web-dir'],
  ]);
  const dashboard = benchDashboard(n, vw, opts.trends, opts['trend-window']);
  const trendChannels = dashboard.widgets.filter((w) => w.type === 'trend').map((w) => w.channel);
  let backfilled = 0;
  let backfillMs = 0;
  if (opts.trends >= 0) {
    const b0 = Date.now();
    backfilled = await backfillHistory(url, trendChannels, opts['trend-window']);
    backfillMs = Date.now() - b0;
  }
  const stopFeed = opts.feed === 'sim' ? async () => null : startFeed(url, n, hz * n);
  // Every channel has a value before the page opens (the simulator publishes all at its first
  // tick; the API feed needs one round).
  const ready = Date.now() + 30_000;
  while (stopFeed.published && stopFeed.published() < n && Date.now() < ready) await new Promise((r) => setTimeout(r, 20));
  const page = await browser.newPage({ viewport: { width: vw, height: vh } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  try {
    const id = `bench-${n}`;
    const put = await fetch(`${url}/api/dashboards/${id}`, { method: 'PUT', body: JSON.stringify(dashboard) });
    if (!put.ok) throw new Error(`saving the dashboard: ${put.status} ${await put.text()}`);
    // Warm up once (the browser's first renderer and the app's code), as a returning user's
    // browser would be; the measured navigation follows.
    await page.goto(`${url}/`);
    await page.waitForFunction(() => typeof window.switchboardStats === 'function');
    const cdp = opts.profile ? await page.context().newCDPSession(page) : null;
    if (cdp) {
      await cdp.send('Profiler.enable');
      await cdp.send('Profiler.setSamplingInterval', { interval: 200 });
      await cdp.send('Profiler.start');
    }
    const t0 = Date.now();
    await page.goto(`${url}/?dashboard=${id}`);
    // performance.now() counts from the navigation's start.
    const allValuesMs = await page.waitForFunction(
      (count) => {
        const s = window.switchboardStats?.();
        return s && s.widgets === count && s.widgetsWithValue === count && s.trendsBackfilled === s.trends && (s.trendsShown ?? s.trends) === s.trends
          ? performance.now()
          : false;
      },
      n,
      { polling: 'raf', timeout: 60_000 },
    );
    const firstAll = await allValuesMs.jsonValue();
    const wallToAll = Date.now() - t0;
    if (cdp) await saveProfile(cdp, opts.profile);
    // The page's own milestone: the frame after the one that drew the last value and trend.
    // (An app from before these marks has none: its runs report the polled time only.)
    if (await page.evaluate(() => performance.getEntriesByName('sb:script').length > 0)) {
      await page.waitForFunction(() => performance.getEntriesByName('sb:complete').length > 0, null, { timeout: 10_000 });
    }
    // The app's own milestones (performance marks named `sb:…`), in ms from navigation.
    const marks = await page.evaluate(() =>
      Object.fromEntries(performance.getEntriesByType('mark').filter((m) => m.name.startsWith('sb:')).map((m) => [m.name.slice(3), Math.round(m.startTime)])),
    );
    // Settle a moment (chart creation), then measure.
    await page.waitForTimeout(2000);
    const sample = () => page.evaluate(() => ({ t: performance.now(), ...window.switchboardStats() }));
    const cpu0 = await cpuSeconds(proc.pid);
    const s0 = await sample();
    const perSecond = [];
    let prev = s0;
    for (let i = 0; i < opts.duration; i++) {
      await page.waitForTimeout(1000);
      const s = await sample();
      const dt = (s.t - prev.t) / 1000;
      perSecond.push({ updates: (s.updatesApplied - prev.updatesApplied) / dt, fps: (s.framesRendered - prev.framesRendered) / dt });
      prev = s;
    }
    const s1 = prev;
    const cpu1 = await cpuSeconds(proc.pid);
    const dt = (s1.t - s0.t) / 1000;
    let shot = '';
    if (opts.screenshot) {
      shot = opts.screenshot.replace('{n}', String(n));
      mkdirSync(dirname(resolve(shot)), { recursive: true });
      await page.screenshot({ path: shot });
    }
    const r = {
      widgets: n,
      visible: s1.widgetsVisible,
      offeredPerS: Math.round(hz * n),
      simHz: hz,
      viewport: opts.viewport,
      feed: opts.feed,
      trends: trendChannels.length,
      trendWindowS: opts['trend-window'],
      historyPublished: backfilled,
      historyPublishMs: backfillMs,
      trendPointsMin: await page.evaluate(() => {
        let min = Infinity;
        for (let i = 0; ; i++) {
          const w = window.switchboardWidget(i);
          if (!w) break;
          if (w.type === 'trend') min = Math.min(min, w.points ?? 0);
        }
        return Number.isFinite(min) ? min : null;
      }),
      completeMs: marks.complete,
      allValuesMs: Math.round(firstAll),
      allValuesWallMs: wallToAll,
      marks,
      updatesPerS: Math.round((s1.updatesApplied - s0.updatesApplied) / dt),
      fps: Math.round(((s1.framesRendered - s0.framesRendered) / dt) * 10) / 10,
      minFps: Math.round(Math.min(...perSecond.map((p) => p.fps)) * 10) / 10,
      minUpdatesPerS: Math.round(Math.min(...perSecond.map((p) => p.updates))),
      sdkReceivedPerS: Math.round((s1.sdk.received - s0.sdk.received) / dt),
      serverCpuPct: cpu0 !== null && cpu1 !== null ? Math.round(((cpu1 - cpu0) / dt) * 100) : null,
      durationS: Math.round(dt * 10) / 10,
      pageErrors: errors,
      screenshot: shot,
    };
    const failures = [];
    if (errors.length > 0) failures.push(`${errors.length} page errors`);
    if (opts['max-complete-ms'] > 0 && !((r.completeMs ?? r.allValuesMs) <= opts['max-complete-ms'])) failures.push(`complete in ${r.completeMs} ms > ${opts['max-complete-ms']}`);
    if (opts['min-fps'] > 0 && !(r.minFps >= opts['min-fps'])) failures.push(`worst second ${r.minFps} fps < ${opts['min-fps']}`);
    r.pass = failures.length === 0;
    r.failures = failures;
    return r;
  } finally {
    await page.close();
    await stopFeed();
    await stopServer(proc);
    rmSync(data, { recursive: true, force: true });
  }
}

/** Stops the CPU profiler, writes its profile to `path` and prints the functions that took the
 * most time (self time, summed by function and script position). */
async function saveProfile(cdp, path) {
  const { profile } = await cdp.send('Profiler.stop');
  mkdirSync(dirname(resolve(path)), { recursive: true });
  writeFileSync(path, JSON.stringify(profile));
  const dt = new Map();
  for (let i = 0; i < profile.samples.length; i++) dt.set(profile.samples[i], (dt.get(profile.samples[i]) ?? 0) + (profile.timeDeltas[i] ?? 0));
  const self = new Map();
  for (const node of profile.nodes) {
    const f = node.callFrame;
    const key = `${f.functionName || '(anonymous)'} ${f.url.split('/').pop()}:${f.lineNumber + 1}`;
    self.set(key, (self.get(key) ?? 0) + (dt.get(node.id) ?? 0));
  }
  const top = [...self].sort((a, b) => b[1] - a[1]).slice(0, 25);
  process.stderr.write(`profile written to ${path}; self time by function (ms):\n`);
  for (const [k, us] of top) process.stderr.write(`  ${(us / 1000).toFixed(1).padStart(8)}  ${k}\n`);
}

async function main() {
  const opts = parseArgs(process.argv);
  const browser = await chromium.launch({
    executablePath: opts.chromium,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--no-first-run'],
  });
  const results = [];
  try {
    for (const n of opts.widgets) {
      process.stderr.write(`dashboard bench: ${n} widgets, ${opts.rate} updates/s offered, ${opts.duration} s …\n`);
      const r = await runOne(browser, opts, n);
      results.push(r);
      process.stderr.write(`${JSON.stringify(r)}\n`);
    }
  } finally {
    await browser.close();
  }
  mkdirSync(opts.out, { recursive: true });
  writeFileSync(join(opts.out, 'dashboard-bench.json'), JSON.stringify({ started: new Date().toISOString(), opts, results }, null, 2));
  console.log('| widgets | visible | offered/s | complete (ms) | all values, polled (ms) | applied updates/s | fps (mean / min) | server CPU |');
  console.log('|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of results) {
    console.log(
      `| ${r.widgets} | ${r.visible} | ${r.offeredPerS} | ${r.completeMs} | ${r.allValuesMs} | ${r.updatesPerS} | ${r.fps} / ${r.minFps} | ${r.serverCpuPct ?? '?'}% |`,
    );
  }
  for (const r of results) if (!r.pass) console.error(`FAIL (${r.widgets} widgets): ${r.failures.join('; ')}`);
  if (results.some((r) => !r.pass)) process.exitCode = 1;
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
