// The control room operator's side of the dashboard in Debian's Chromium: signing in with the
// form (a Basic user, a JWT, a wrong password), signing out, and a trend's window selector,
// pause and zoom, with the trend opening full from the subscribe reply.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { allValues, BIN, launch, newPage, OUT, Server, sleep } from './harness.mjs';

const SECRET = 'operator-test-secret-of-32-bytes-or-more';
const PASSWORD = 'correct horse battery staple';

function jwt(sub) {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const head = b64({ alg: 'HS256', typ: 'JWT' });
  const claims = b64({ sub, exp: Math.floor(Date.now() / 1000) + 600 });
  return `${head}.${claims}.${createHmac('sha256', SECRET).update(`${head}.${claims}`).digest('base64url')}`;
}

const basic = (user, password) => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;

let browser;

before(async () => {
  mkdirSync(OUT, { recursive: true });
  browser = await launch();
});

after(async () => {
  await browser?.close();
});

describe('sign-in form', () => {
  let server;
  let dir;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'sb-users-'));
    const users = join(dir, 'users');
    execFileSync(BIN, ['user', 'add', 'olga', '--users', users], { input: `${PASSWORD}\n`, env: { PATH: process.env.PATH } });
    server = await new Server({ args: ['--simulate', '8@4', '--users', users], env: { SWITCHBOARD_JWT_SECRET: SECRET } }).start();
    const body = JSON.stringify({ title: 'Signed in', widgets: [{ type: 'value', channel: 'pt:sim.0', x: 0, y: 0, w: 8, h: 4 }] });
    const put = await fetch(`${server.url}/api/dashboards/signed`, { method: 'PUT', body, headers: { authorization: basic('olga', PASSWORD) } });
    assert.equal(put.status, 201);
  });
  after(async () => {
    await server?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('asks a Basic user to sign in, refuses a wrong password visibly, then goes live; sign out asks again', async () => {
    const page = await newPage(browser);
    await page.goto(`${server.url}/?dashboard=signed`);
    await page.waitForSelector('#login-overlay:not(.hidden)');
    await page.fill('#login-user', 'olga');
    await page.fill('#login-password', 'not the password');
    await page.click('#login-submit');
    await page.waitForFunction(() => /bad user name or password/.test(document.querySelector('#login-message')?.textContent ?? ''));
    assert.equal(await page.isVisible('#login-overlay'), true, 'still asking');

    await page.fill('#login-password', PASSWORD);
    await page.click('#login-submit');
    await page.waitForSelector('#login-overlay', { state: 'hidden' });
    await allValues(page, 1);
    assert.equal(await page.textContent('#title-view'), 'Signed in', 'the dashboard was read with the credentials');
    assert.equal(await page.textContent('#who'), 'olga');
    // The password is not kept anywhere a script or a reload could find it.
    assert.equal(await page.evaluate(() => JSON.stringify(sessionStorage).includes('horse')), false);

    await page.click('#sign-out');
    await page.waitForSelector('#login-overlay:not(.hidden)');
    assert.deepEqual(page.errors, []);
    await page.close();
  });

  it('signs in with a token pasted into the form (kept for reloads of the tab)', async () => {
    const page = await newPage(browser);
    await page.goto(`${server.url}/?dashboard=signed`);
    await page.waitForSelector('#login-overlay:not(.hidden)');
    await page.fill('#login-token', 'not.a.token');
    await page.click('#login-submit');
    await page.waitForFunction(() => (document.querySelector('#login-message')?.textContent ?? '') !== '' &&
      !/signing in/.test(document.querySelector('#login-message').textContent));
    assert.equal(await page.isVisible('#login-overlay'), true, 'a bad token is refused');
    await page.fill('#login-token', jwt('ana'));
    await page.click('#login-submit');
    await page.waitForSelector('#login-overlay', { state: 'hidden' });
    await allValues(page, 1);
    assert.equal(await page.textContent('#who'), 'ana');
    await page.reload();
    await allValues(page, 1);
    assert.equal(await page.isVisible('#login-overlay'), false, 'the token survives a reload of the tab');
    assert.deepEqual(page.errors, []);
    await page.close();
  });
});

describe('trend controls', () => {
  let server;
  before(async () => {
    server = await new Server({ args: ['--simulate', '8@5'] }).start();
    const spec = {
      title: 'Trend controls',
      widgets: [{ type: 'trend', channel: 'pt:sim.0', x: 0, y: 0, w: 24, h: 10, options: { window_s: 60 } }],
    };
    assert.ok((await fetch(`${server.url}/api/dashboards/trendctl`, { method: 'PUT', body: JSON.stringify(spec) })).ok);
    // Seconds of history for the trend to open with.
    await sleep(6000);
  });
  after(async () => {
    await server?.stop();
  });

  it('opens full from the subscribe reply, then selects a window, pauses, zooms and returns to live', async () => {
    const page = await newPage(browser);
    const trendRequests = [];
    page.on('request', (r) => r.url().includes('/trend?') && trendRequests.push(r.url()));
    await page.goto(`${server.url}/?dashboard=trendctl`);
    // Five seconds of buckets arrive with the subscription, before live values could make that many.
    await page.waitForFunction(() => (window.switchboardWidget(0)?.points ?? 0) >= 5, null, { timeout: 5000 });
    assert.deepEqual(trendRequests, [], 'the trend came in the subscribe reply, not over HTTP');
    const w = () => page.evaluate(() => window.switchboardWidget(0));
    assert.deepEqual((await w()).view, { windowS: 60, paused: false, zoom: null, chart: false });

    // The trend is painted on the board; pointing at it opens its chart with the tools.
    assert.equal(await page.locator('.trend').count(), 0, 'no chart before the pointer comes');
    assert.equal((await w()).view.chart, false);
    const body = (await w()).body;
    await page.mouse.move(body.x + body.width / 2, body.y + body.height / 2);
    await page.waitForSelector('.trend .trend-window');
    assert.equal((await w()).view.chart, true);
    // A wider window asks the server for its trend.
    await page.hover('.trend');
    await page.selectOption('.trend-window', '300');
    assert.equal((await w()).view.windowS, 300);
    await sleep(300);
    assert.ok(trendRequests.some((u) => u.includes('window_s=300')), `window 300 read: ${trendRequests}`);

    // Pause: values keep arriving, the plot holds still.
    await page.click('.trend-pause');
    assert.equal((await w()).view.paused, true);
    assert.equal(await page.textContent('.trend-state'), 'paused');
    const held = (await w()).points;
    await page.waitForFunction((n) => window.switchboardWidget(0).points > n, held);
    await page.click('.trend-pause');
    assert.equal((await w()).view.paused, false);

    // Drag across the plot: zoomed into that range, paused; a double click returns to live.
    const over = await page.locator('.trend .u-over').boundingBox();
    await page.mouse.move(over.x + over.width * 0.3, over.y + over.height / 2);
    await page.mouse.down();
    await page.mouse.move(over.x + over.width * 0.6, over.y + over.height / 2, { steps: 5 });
    await page.mouse.up();
    const zoomed = (await w()).view;
    assert.ok(zoomed.zoom && zoomed.zoom[1] > zoomed.zoom[0] && zoomed.paused, JSON.stringify(zoomed));
    assert.equal(await page.textContent('.trend-state'), 'zoomed');
    await page.mouse.dblclick(over.x + over.width / 2, over.y + over.height / 2);
    assert.deepEqual((await w()).view, { windowS: 300, paused: false, zoom: null, chart: true });
    // The pointer leaves a live view: the chart goes, and the trend is painted on the board.
    await page.mouse.move(body.x + body.width + 200, body.y + body.height + 200);
    await page.waitForSelector('.trend', { state: 'detached' });
    assert.equal((await w()).view.chart, false);
    assert.deepEqual(page.errors, []);
    await page.close();
  });
});

describe('trend tiers', () => {
  // An hour of 1 s buckets would be slow to fill; ten minutes of them and two hours of 30 s
  // ones show the same thing: a window the coarse tier holds, zoomed into the fine tier's reach.
  const TIERS = '[namespaces.pt]\ntrend_tiers = [{step_s = 1, window_s = 600}, {step_s = 30, window_s = 7200}]\n';
  let server;
  let dir;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'sb-tiers-'));
    const config = join(dir, 'tiers.toml');
    writeFileSync(config, TIERS);
    server = await new Server({ args: ['--config', config] }).start();
    const now = Date.now();
    const items = [];
    // A value every 10 s for the two hours before the last ten minutes, then one a second.
    for (let t = now - 7_200_000; t < now - 600_000; t += 10_000) items.push({ channel: 'pt:tiered', data: { v: Math.sin(t / 60_000), t } });
    for (let t = now - 600_000; t <= now; t += 1000) items.push({ channel: 'pt:tiered', data: { v: Math.sin(t / 60_000), t } });
    for (let i = 0; i < items.length; i += 500) {
      const r = await fetch(`${server.url}/api/publish`, { method: 'POST', body: JSON.stringify({ batch: items.slice(i, i + 500) }) });
      assert.equal(r.status, 200);
    }
    const spec = {
      title: 'Tiered trend',
      widgets: [{ type: 'trend', channel: 'pt:tiered', x: 0, y: 0, w: 40, h: 12, options: { window_s: 7200 } }],
    };
    assert.ok((await fetch(`${server.url}/api/dashboards/tiers`, { method: 'PUT', body: JSON.stringify(spec) })).ok);
  });
  after(async () => {
    await server?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('offers the windows the tiers reach, and a zoom shows the fine tier where it reaches', async () => {
    const page = await newPage(browser);
    const trendRequests = [];
    page.on('request', (r) => r.url().includes('/trend?') && trendRequests.push(r.url()));
    await page.goto(`${server.url}/?dashboard=tiers`);
    // Two hours of 30 s buckets come with the subscription.
    await page.waitForFunction(() => (window.switchboardWidget(0)?.points ?? 0) >= 200, null, { timeout: 10_000 });
    const w = () => page.evaluate(() => window.switchboardWidget(0));
    const body = (await w()).body;
    await page.mouse.move(body.x + body.width / 2, body.y + body.height / 2);
    await page.waitForSelector('.trend .trend-window');
    // The selector offers the usual windows the longest tier reaches and each tier's own.
    const windows = await page.$$eval('.trend-window option', (os) => os.map((o) => o.textContent));
    assert.deepEqual(windows, ['1m', '5m', '10m', '15m', '1h', '2h']);

    // Drag over a stretch of the last ten minutes (the plot spans two hours): its 1 s buckets
    // replace the 30 s ones for the zoomed range.
    const over = await page.locator('.trend .u-over').boundingBox();
    await page.mouse.move(over.x + over.width * 0.94, over.y + over.height / 2);
    await page.mouse.down();
    await page.mouse.move(over.x + over.width * 0.97, over.y + over.height / 2, { steps: 5 });
    await page.mouse.up();
    const zoom = (await w()).view.zoom;
    assert.ok(zoom && zoom[1] - zoom[0] > 100 && Date.now() / 1000 - zoom[0] < 600, JSON.stringify(zoom));
    await page.waitForFunction(() => window.switchboardWidget(0).detail !== null, null, { timeout: 5000 });
    const detail = (await w()).detail;
    assert.equal(detail.stepS, 1);
    // A point a second over the zoomed range, where the coarse tier had one per 30 s.
    assert.ok(detail.points >= (zoom[1] - zoom[0]) * 0.9, `${detail.points} points over ${zoom[1] - zoom[0]} s`);
    assert.ok(trendRequests.some((u) => u.includes('until_ms=')), `zoom read: ${trendRequests}`);
    // Back to live: the held two hours again.
    await page.mouse.dblclick(over.x + over.width / 2, over.y + over.height / 2);
    assert.equal((await w()).detail, null);
    assert.deepEqual(page.errors, []);
    await page.close();
  });
});
