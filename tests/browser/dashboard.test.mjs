// The dashboard in Debian's Chromium against the real `switchboard demo`: the demo dashboard
// goes live, a dashboard built with clicks survives a reload, the page recovers across a server
// restart without losing publications, every widget type paints, export and import.

import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { allValues, inkOf, launch, newPage, OUT, Server, sleep, stats } from './harness.mjs';

let browser;
let server;
let serverStarted = 0;

before(async () => {
  mkdirSync(OUT, { recursive: true });
  browser = await launch();
  server = await new Server({ command: 'demo' }).start();
  serverStarted = Date.now();
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

describe('dashboard', () => {
  it('opens the demo dashboard in run mode with every widget live', async () => {
    const page = await newPage(browser);
    await page.goto(`${server.url}/?dashboard=demo`);
    await allValues(page, 15);
    assert.equal(await page.isVisible('#side'), false, 'run mode shows no edit panel');
    assert.equal(await page.textContent('#title-view'), 'Demo plant');
    const a = await stats(page);
    await page.waitForFunction((n) => window.switchboardStats().updatesApplied > n, a.updatesApplied);
    const b = await stats(page);
    assert.ok(b.framesRendered > a.framesRendered, 'new values were rendered');
    assert.deepEqual(page.errors, []);
    await page.close();
  });

  it('opens a trend full of the server-side trend instead of filling while open', async () => {
    // The demo's simulator has published pt:sim.4 (a number) once a second since the server started.
    await sleep(Math.max(0, 12_000 - (Date.now() - serverStarted)));
    const spec = {
      title: 'Trend on open',
      widgets: [{ type: 'trend', channel: 'pt:sim.4', x: 0, y: 0, w: 16, h: 8, options: { window_s: 120 } }],
    };
    const put = await fetch(`${server.url}/api/dashboards/trend-open`, { method: 'PUT', body: JSON.stringify(spec) });
    assert.ok(put.ok, `PUT ${put.status}`);
    const page = await newPage(browser);
    await page.goto(`${server.url}/?dashboard=trend-open`);
    // Live alone would hold a point or two after a second; the backfill brings ten or more.
    await page.waitForFunction(() => (window.switchboardWidget(0)?.points ?? 0) >= 10, null, { timeout: 5000 });
    const w = await page.evaluate(() => window.switchboardWidget(0));
    assert.equal(w.type, 'trend');
    assert.deepEqual(page.errors, []);
    await page.close();
  });

  it('shows a value not updated within stale_s as stale with its age, fresh again on an update', async () => {
    const publish = (v) =>
      fetch(`${server.url}/api/publish`, { method: 'POST', body: JSON.stringify({ channel: 'stale.valve', data: { v } }) });
    assert.ok((await publish(7)).ok);
    const spec = {
      title: 'Stale',
      widgets: [{ type: 'value', channel: 'stale.valve', x: 0, y: 0, w: 6, h: 3, options: { stale_s: 1, units: 'bar' } }],
    };
    assert.ok((await fetch(`${server.url}/api/dashboards/stale`, { method: 'PUT', body: JSON.stringify(spec) })).ok);
    const page = await newPage(browser);
    await page.goto(`${server.url}/?dashboard=stale`);
    await page.waitForFunction(() => (window.switchboardWidget(0)?.staleFor ?? 0) >= 1, null, { timeout: 8000 });
    assert.equal((await page.evaluate(() => window.switchboardWidget(0))).text, '7 bar', 'the value stays shown');
    assert.ok((await publish(8)).ok);
    await page.waitForFunction(() => window.switchboardWidget(0)?.text === '8 bar' && window.switchboardWidget(0)?.staleFor === null);
    assert.deepEqual(page.errors, []);
    await page.close();
  });

  it('colours a value past its own limits (amber, red), without raising an alarm to acknowledge', async () => {
    const publish = (v) =>
      fetch(`${server.url}/api/publish`, { method: 'POST', body: JSON.stringify({ channel: 'alarm.temp', data: { v } }) });
    assert.ok((await publish(5)).ok);
    const spec = {
      title: 'Limits',
      widgets: [{ type: 'value', channel: 'alarm.temp', x: 0, y: 0, w: 6, h: 3, options: { hi: 10, hihi: 20, label: 'Boiler' } }],
    };
    assert.ok((await fetch(`${server.url}/api/dashboards/limits`, { method: 'PUT', body: JSON.stringify(spec) })).ok);
    const page = await newPage(browser);
    await page.goto(`${server.url}/?dashboard=limits`);
    const body = async () => (await page.evaluate(() => window.switchboardWidget(0))).body;
    await page.waitForFunction(() => window.switchboardWidget(0)?.text === '5');
    assert.equal((await page.evaluate(() => window.switchboardWidget(0))).alarm, null);
    // The body's tint: the alarm colour at a quarter strength over the panel.
    const amber = '#453b22';
    const red = '#4f292c';
    // Share of the body's pixels near a colour (anti-aliased text edges make a few anywhere).
    const share = async (color) => {
      const ink = await inkOf(page, await body(), [color]);
      return ink.near[color] / ink.pixels;
    };
    assert.ok((await share(amber)) < 0.05, 'no tint within the limits');
    await publish(15);
    await page.waitForFunction(() => window.switchboardWidget(0)?.alarm === 'hi');
    await sleep(100);
    assert.ok((await share(amber)) > 0.5, 'amber past hi');
    await publish(25);
    await page.waitForFunction(() => window.switchboardWidget(0)?.alarm === 'hihi');
    await sleep(100);
    assert.ok((await share(red)) > 0.5, 'red past hihi');
    // Colouring only: the alarms operators acknowledge are the server's (alarms.test.mjs).
    assert.equal((await page.evaluate(() => window.switchboardWidget(0))).serverAlarm, null);
    const listed = await page.$$eval('#alarm-list li .msg', (ms) => ms.map((m) => m.title));
    assert.ok(!listed.some((t) => t.includes('alarm.temp')), `not in the alarm list: ${listed}`);
    await publish(7);
    await page.waitForFunction(() => window.switchboardWidget(0)?.alarm === null);
    assert.deepEqual(page.errors, []);
    await page.close();
  });

  it('operator controls publish after a confirmation and show a refusal', async () => {
    const spec = {
      title: 'Controls',
      widgets: [
        { type: 'control', channel: 'room:ctl.setpoint', x: 0, y: 0, w: 8, h: 4, options: { control: 'setpoint', min: 0, max: 100 } },
        { type: 'control', channel: 'room:ctl.pump', x: 8, y: 0, w: 8, h: 4, options: { control: 'toggle' } },
        { type: 'control', channel: 'pt:ctl.valve', x: 16, y: 0, w: 8, h: 4, options: { control: 'button', value: 1 } },
      ],
    };
    assert.ok((await fetch(`${server.url}/api/dashboards/controls`, { method: 'PUT', body: JSON.stringify(spec) })).ok);
    const page = await newPage(browser);
    const questions = [];
    let answer = false;
    page.on('dialog', (d) => {
      questions.push(d.message());
      void (answer ? d.accept() : d.dismiss());
    });
    await page.goto(`${server.url}/?dashboard=controls`);
    await page.waitForSelector('.control-input');
    // Declined: nothing is sent.
    await page.fill('.control-input', '42.5');
    await page.click('.control >> nth=0 >> text=Set');
    await sleep(300);
    assert.equal((await page.evaluate(() => window.switchboardWidget(0))).hasValue, false);
    assert.match(questions[0], /Send 42\.5 to room:ctl\.setpoint\?/);
    // Confirmed: the setpoint is published and comes back as the widget's value.
    answer = true;
    await page.click('.control >> nth=0 >> text=Set');
    await page.waitForFunction(() => window.switchboardWidget(0)?.text === '42.50');
    const last = await (await fetch(`${server.url}/api/channels/room:ctl.setpoint`)).json();
    assert.equal(last.last.data.v, 42.5);
    // Out of range: refused in the page, with the range.
    await page.fill('.control-input', '500');
    await page.click('.control >> nth=0 >> text=Set');
    await page.waitForFunction(() => /within 0/.test(window.switchboardWidget(0)?.error ?? ''));
    // A toggle sends the opposite of what it shows.
    await page.click('.control >> nth=1 >> button');
    await page.waitForFunction(() => window.switchboardWidget(1)?.text === 'true');
    // A namespace where clients may not publish: the server's refusal is shown on the widget.
    await page.click('.control >> nth=2 >> button');
    await page.waitForFunction(() => /refused: .*publish/.test(window.switchboardWidget(2)?.error ?? ''));
    assert.deepEqual(page.errors, []);
    await page.close();
  });

  it('searches channels by prefix on the server and loads further pages on demand', async () => {
    const page = await newPage(browser);
    await page.goto(`${server.url}/`);
    const rows = () => page.locator('#channel-list li').count();
    // pt:sim.1, pt:sim.10-19 and pt:sim.100-199 of the demo's 1,000 points: one page.
    await page.fill('#channel-search', 'pt:sim.1');
    await page.waitForFunction(() => document.querySelectorAll('#channel-list li').length === 111);
    assert.equal(await page.isVisible('#channel-more'), false, 'one page holds them all');
    const names = await page.$$eval('#channel-list li', (ls) => ls.map((l) => l.dataset.channel));
    assert.ok(names.every((n) => n.startsWith('pt:sim.1')), names.slice(0, 5).join());
    // Every point: pages of 200 with a button for the next.
    await page.fill('#channel-search', 'pt:sim.');
    await page.waitForFunction(() => document.querySelectorAll('#channel-list li').length === 200);
    assert.equal(await page.isVisible('#channel-more'), true);
    await page.click('#channel-more');
    await page.waitForFunction(() => document.querySelectorAll('#channel-list li').length === 400);
    const all = await page.$$eval('#channel-list li', (ls) => ls.map((l) => l.dataset.channel));
    assert.equal(new Set(all).size, 400, 'no channel twice across pages');
    assert.equal(await rows(), 400);
    assert.deepEqual(page.errors, []);
    await page.close();
  });

  it('builds a dashboard with clicks in edit mode, saves it, and shows it live after a reload', async () => {
    const page = await newPage(browser);
    await page.goto(`${server.url}/`);
    assert.equal(await page.isVisible('#side'), true, 'a new dashboard opens in edit mode');
    await page.fill('#dashboard-id', 'built');
    await page.fill('#dashboard-title', 'Built by clicks');

    // A value widget bound by typing the channel.
    await page.click('#add-value');
    await page.fill('#widget-form input[name=channel]', 'pt:sim.0');
    await page.press('#widget-form input[name=channel]', 'Tab');

    // An LED bound from the channel browser.
    await page.click('#add-led');
    await page.fill('#channel-search', 'pt:sim.2');
    await page.click('#channel-list li[data-channel="pt:sim.2"]');

    // A trend with a label, moved and resized by dragging its box.
    await page.click('#add-trend');
    await page.fill('#widget-form input[name=channel]', 'pt:sim.1');
    await page.press('#widget-form input[name=channel]', 'Tab');
    await page.fill('#widget-form input[name=opt-label]', 'Vibration');
    await page.press('#widget-form input[name=opt-label]', 'Tab');
    const geometry = async () =>
      Object.fromEntries(
        await Promise.all(
          ['x', 'y', 'w', 'h'].map(async (k) => [k, Number(await page.inputValue(`#widget-form input[name=${k}]`))]),
        ),
      );
    const placed = await geometry();
    const box = await page.locator('.wbox[data-index="2"]').boundingBox();
    await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width / 2 + 50, box.y + box.height / 2 + 30, { steps: 5 });
    await page.mouse.move(box.x + box.width / 2 + 100, box.y + box.height / 2 + 60, { steps: 5 });
    await page.mouse.up();
    const handle = await page.locator('.wbox[data-index="2"] .wbox-resize').boundingBox();
    await page.mouse.move(handle.x + 6, handle.y + 6);
    await page.mouse.down();
    await page.mouse.move(handle.x + 46, handle.y + 46, { steps: 5 });
    await page.mouse.up();
    const moved = await geometry();
    assert.deepEqual(moved, { x: placed.x + 5, y: placed.y + 3, w: placed.w + 2, h: placed.h + 2 });

    await page.click('#save');
    await page.waitForFunction(() => document.querySelector('#status').textContent === 'saved built');
    const saved = await (await fetch(`${server.url}/api/dashboards/built`)).json();
    assert.equal(saved.title, 'Built by clicks');
    assert.deepEqual(
      saved.widgets.map((w) => [w.type, w.channel]),
      [
        ['value', 'pt:sim.0'],
        ['led', 'pt:sim.2'],
        ['trend', 'pt:sim.1'],
      ],
    );
    assert.deepEqual({ x: saved.widgets[2].x, y: saved.widgets[2].y, w: saved.widgets[2].w, h: saved.widgets[2].h }, moved);
    assert.equal(saved.widgets[2].options.label, 'Vibration');

    await page.goto(`${server.url}/?dashboard=built`);
    await allValues(page, 3);
    assert.equal(await page.isVisible('#side'), false);
    assert.equal(await page.textContent('#title-view'), 'Built by clicks');
    assert.deepEqual(page.errors, []);
    await page.close();
  });

  it('paints every widget type (screenshot pixels), and nothing where there is no widget', async () => {
    const page = await newPage(browser);
    await page.goto(`${server.url}/?dashboard=demo`);
    await allValues(page, 15);
    // The simulator ticks at 1 Hz; trends and scatters need a few points to draw lines.
    await page.waitForFunction(() => window.switchboardStats().updatesApplied >= 60, null, { timeout: 15_000 });
    await sleep(300);
    await page.screenshot({ path: join(OUT, 'demo.png') });
    // The colours each kind paints its value in (web/dashboard/src/widgets/base.ts THEME),
    // looked for inside the widget's body, below its label.
    const accent = '#4fc3f7';
    const expect = {
      value: [['#e6edf3'], 30],
      led: [['#3fb950', '#30363d'], 200],
      gauge: [[accent, '#30363d'], 200],
      trend: [[accent], 20],
      spectrum: [[accent], 100],
      scatter: [[accent, '#e6edf3'], 9],
    };
    const seen = new Set();
    for (let i = 0; i < 15; i++) {
      const w = await page.evaluate((n) => window.switchboardWidget(n), i);
      if (seen.has(w.type)) continue;
      seen.add(w.type);
      const [colors, least] = expect[w.type];
      // A scatter or trend gains ink with each point the 1 Hz simulator adds: on a loaded
      // machine it may hold fewer when first looked at, so it is looked at again (bounded).
      let ink;
      let found = 0;
      for (let look = 0; look < 10 && found < least; look++) {
        if (look > 0) await sleep(500);
        ink = await inkOf(page, w.body, colors);
        found = Object.values(ink.near).reduce((a, b) => a + b, 0);
      }
      assert.ok(found >= least, `${w.type} (${w.channel}) paints its value: ${JSON.stringify(ink)}`);
    }
    assert.deepEqual([...seen].sort(), ['gauge', 'led', 'scatter', 'spectrum', 'trend', 'value']);
    // Nothing is drawn where there is no widget: the gutter between two panels is bare board.
    const [a, b] = await Promise.all([0, 1].map((n) => page.evaluate((i) => window.switchboardWidget(i), n)));
    const gutter = { x: Math.ceil(a.panel.x + a.panel.width), y: Math.round(a.panel.y + 4), width: Math.floor(b.panel.x - (a.panel.x + a.panel.width)), height: Math.round(a.panel.height - 8) };
    assert.ok(gutter.width >= 2, JSON.stringify(gutter));
    const empty = await inkOf(page, gutter);
    assert.equal(empty.inked, 0, `empty board: ${JSON.stringify(empty)}`);
    await page.close();
  });

  it('exports a dashboard as JSON and imports it again', async () => {
    const page = await newPage(browser);
    await page.goto(`${server.url}/?dashboard=demo&edit=1`);
    await allValues(page, 15);
    const [download] = await Promise.all([page.waitForEvent('download'), page.click('#export')]);
    const file = join(OUT, 'exported.json');
    await download.saveAs(file);
    const exported = JSON.parse(readFileSync(file, 'utf8'));
    assert.equal(exported.title, 'Demo plant');
    assert.equal(exported.widgets.length, 15);

    await page.click('#new');
    await page.waitForFunction(() => window.switchboardStats().widgets === 0);
    await page.setInputFiles('#import-file', file);
    await page.waitForFunction(() => window.switchboardStats().widgets === 15);
    await page.fill('#dashboard-id', 'copy');
    await page.fill('#dashboard-title', 'Copy of the demo');
    await page.click('#save');
    await page.waitForFunction(() => document.querySelector('#status').textContent === 'saved copy');
    const copy = await (await fetch(`${server.url}/api/dashboards/copy`)).json();
    assert.equal(copy.title, 'Copy of the demo');
    assert.deepEqual(copy.widgets, exported.widgets);
    await page.close();
  });

  it('recovers across a server restart without losing publications', async () => {
    const ch = 'events:line3';
    await server.putDashboard('restart', {
      title: 'Restart',
      widgets: [
        { type: 'value', channel: ch, x: 0, y: 0, w: 10, h: 4, options: { field: 'n' } },
        { type: 'value', channel: 'pt:sim.0', x: 10, y: 0, w: 8, h: 4 },
      ],
    });
    for (let n = 1; n <= 5; n++) await server.publish(ch, { n });
    const page = await newPage(browser);
    await page.goto(`${server.url}/?dashboard=restart`);
    await allValues(page, 2);
    const offsets = () =>
      page.evaluate((c) => window.switchboardLog().filter((e) => e.type === 'pub' && e.channel === c).map((e) => e.offset), ch);
    assert.deepEqual(await offsets(), [5], 'the initial value');
    for (let n = 6; n <= 8; n++) await server.publish(ch, { n });
    await page.waitForFunction((c) => window.switchboardLog().filter((e) => e.channel === c).length === 4, ch);

    await server.kill(); // SIGKILL: no goodbye
    await page.waitForSelector('#conn:not([data-state="connected"])');
    await server.start(); // same port and data directory
    // Published as soon as the server is back, racing the page's reconnect.
    for (let n = 1; n <= 10; n++) await server.publish(ch, { n: 100 + n });

    await page.waitForFunction((c) => window.switchboardLog().filter((e) => e.type === 'pub' && e.channel === c).length === 14, ch, {
      timeout: 20_000,
    });
    const log = await page.evaluate(() => window.switchboardLog());
    assert.deepEqual(await offsets(), [5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 'every publication once, in order');
    const gap = log.find((e) => e.type === 'gap' && e.channel === ch);
    assert.ok(gap && gap.epochChanged && gap.from.offset === 8, `the epoch change is reported: ${JSON.stringify(gap)}`);
    assert.ok(log.some((e) => e.type === 'connected' && e.reconnects === 1));
    const w = await page.evaluate(() => window.switchboardWidget(0));
    assert.equal(w.text, '110');
    await page.waitForSelector('#conn[data-state="connected"]');

    // The saved dashboards survived the restart too.
    await page.reload();
    await allValues(page, 2);
    assert.deepEqual(page.errors, []);
    await page.close();
  });

  it('works against a node with authentication, with the token given as #token=', async () => {
    const secret = 'dashboard-test-secret-of-32-bytes-or-more';
    const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
    const head = b64({ alg: 'HS256', typ: 'JWT' });
    const claims = b64({ sub: 'ana', exp: Math.floor(Date.now() / 1000) + 600 });
    const jwt = `${head}.${claims}.${createHmac('sha256', secret).update(`${head}.${claims}`).digest('base64url')}`;
    const own = await new Server({ args: ['--simulate', '10@2'], env: { SWITCHBOARD_JWT_SECRET: secret } }).start();
    try {
      const body = JSON.stringify({ title: 'Auth', widgets: [{ type: 'value', channel: 'pt:sim.0', x: 0, y: 0, w: 8, h: 4 }] });
      assert.equal((await fetch(`${own.url}/api/dashboards/auth`, { method: 'PUT', body })).status, 401);
      const put = await fetch(`${own.url}/api/dashboards/auth`, { method: 'PUT', body, headers: { authorization: `Bearer ${jwt}` } });
      assert.equal(put.status, 201);
      const page = await newPage(browser);
      await page.goto(`${own.url}/?dashboard=auth#token=${jwt}`);
      await allValues(page, 1);
      assert.ok(!page.url().includes('token='), 'the token leaves the address bar');
      assert.deepEqual(page.errors, []);
      await page.close();
    } finally {
      await own.stop();
    }
  });
});
