// The server's alarms on the dashboard, in Debian's Chromium: two operators (two pages, each
// signed in as themselves) on one control room. Values published with an API key raise and
// return alarms on the node; an acknowledgement with a comment in one page shows in the other
// within a second with who acknowledged, and survives a reload; shelve and unshelve from the
// list; the list is worst first; the journal widget lists the transitions and filters them.

import assert from 'node:assert/strict';
import { createHmac, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { launch, newPage, OUT, Server } from './harness.mjs';

const SECRET = 'alarms-test-secret-of-32-bytes-or-more';
const API_KEY = randomBytes(24).toString('hex');

const CONFIG = `
[[alarms]]
id = "boiler-hot"
channel = "pt:boiler.temp"
hi = 80.0
hihi = 95.0
priority = "high"
message = "Boiler temperature high"

[[alarms]]
id = "level-low"
channel = "pt:line1.*"
lo = 10.0
priority = "medium"
message = "Line 1 level low"
`;

function jwt(sub) {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const head = b64({ alg: 'HS256', typ: 'JWT' });
  const claims = b64({ sub, exp: Math.floor(Date.now() / 1000) + 3600 });
  return `${head}.${claims}.${createHmac('sha256', SECRET).update(`${head}.${claims}`).digest('base64url')}`;
}

const asKey = { authorization: `Bearer ${API_KEY}` };

let browser;
let server;
let dir;

async function publish(channel, v) {
  const r = await fetch(`${server.url}/api/publish`, { method: 'POST', headers: asKey, body: JSON.stringify({ channel, data: { v } }) });
  assert.equal(r.status, 200, `publish ${channel}: ${await r.text()}`);
}

/** The row of an alarm in a page's list. */
const row = (id) => `#alarm-list li[data-alarm="${id}"]`;

async function waitState(page, id, state, timeout = 5000) {
  await page.waitForSelector(`${row(id)}[data-state="${state}"]`, { timeout });
}

/** Opens the control room signed in as `user` (the token in the fragment, never sent). */
async function operator(user) {
  const page = await newPage(browser);
  await page.goto(`${server.url}/?dashboard=alarm-room#token=${jwt(user)}`);
  await page.waitForSelector('#conn[data-state="connected"]');
  return page;
}

/** Acts on an alarm from its row: the button, the form's comment (and time), submit. */
async function act(page, id, action, comment, forS) {
  await page.click(`${row(id)} button.${action}`);
  await page.waitForSelector(`${row(id)} form.alarm-form[data-kind="${action}"]`);
  if (forS) await page.selectOption(`${row(id)} .alarm-for`, String(forS));
  await page.fill(`${row(id)} .alarm-comment`, comment);
  await page.click(`${row(id)} .alarm-submit`);
}

before(async () => {
  mkdirSync(OUT, { recursive: true });
  dir = mkdtempSync(join(tmpdir(), 'sb-alarms-'));
  const config = join(dir, 'alarms.toml');
  writeFileSync(config, CONFIG);
  browser = await launch();
  server = await new Server({ args: ['--config', config], env: { SWITCHBOARD_JWT_SECRET: SECRET, SWITCHBOARD_API_KEY: API_KEY } }).start();
  const spec = {
    title: 'Alarm room',
    widgets: [
      { type: 'value', channel: 'pt:boiler.temp', x: 0, y: 0, w: 8, h: 4, options: { label: 'Boiler', units: '°C' } },
      { type: 'value', channel: 'pt:line1.level', x: 8, y: 0, w: 8, h: 4, options: { label: 'Line 1 level', units: '%' } },
      { type: 'alarm-journal', channel: '', x: 0, y: 4, w: 40, h: 14, options: { label: 'Alarm journal' } },
    ],
  };
  const put = await fetch(`${server.url}/api/dashboards/alarm-room`, { method: 'PUT', headers: asKey, body: JSON.stringify(spec) });
  assert.ok(put.ok, `PUT dashboard: ${put.status} ${await put.text()}`);
});

after(async () => {
  await browser?.close();
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('alarms on the dashboard', () => {
  it('shares one state between two operators: ack with a comment, reload, shelve, unshelve, return', async () => {
    await publish('pt:boiler.temp', 70);
    await publish('pt:line1.level', 50);
    const ana = await operator('ana');
    const ben = await operator('ben');
    assert.equal(await ana.isVisible('#alarms'), false, 'no alarm, no list');

    // Raised on the node: both pages list it, the widget blinks (unacknowledged).
    await publish('pt:boiler.temp', 85);
    for (const p of [ana, ben]) await waitState(p, 'boiler-hot', 'active_unacked');
    assert.match(await ben.textContent(`${row('boiler-hot')} .msg`), /Boiler temperature high/);
    assert.equal(await ben.textContent(`${row('boiler-hot')} .sev`), 'HI');
    assert.equal(await ben.textContent(`${row('boiler-hot')} .val`), '85');
    assert.match(await ben.textContent(`${row('boiler-hot')} .prio`), /high/);
    await ben.waitForFunction(() => window.switchboardWidget(0).serverAlarm?.unacked === true);

    // Ana acknowledges with a comment; Ben's page shows it, with her name, within a second.
    await act(ana, 'boiler-hot', 'ack', 'called maintenance');
    const acked = Date.now();
    await waitState(ben, 'boiler-hot', 'active_acked', 1000);
    await ben.waitForFunction((sel) => /acked by user:ana at .*called maintenance/.test(document.querySelector(`${sel} .who`)?.textContent ?? ''), row('boiler-hot'), { timeout: Math.max(1, 1000 - (Date.now() - acked)) });
    await ben.waitForFunction(() => window.switchboardWidget(0).serverAlarm?.unacked === false);
    assert.equal(await ana.isVisible(`${row('boiler-hot')} button.ack`), false, 'nothing left to acknowledge');

    // A reload reads the same state from the server.
    await ben.reload();
    await waitState(ben, 'boiler-hot', 'active_acked');
    assert.match(await ben.textContent(`${row('boiler-hot')} .who`), /acked by user:ana at .* called maintenance/);

    // Worse: unacknowledged again (hi → hihi).
    await publish('pt:boiler.temp', 97);
    for (const p of [ana, ben]) await waitState(p, 'boiler-hot', 'active_unacked');
    assert.equal(await ana.textContent(`${row('boiler-hot')} .sev`), 'HIHI');

    // A second alarm, of lower priority, from the pattern: listed after the boiler's.
    await publish('pt:line1.level', 4);
    await waitState(ana, 'level-low.line1.level', 'active_unacked');
    const order = await ana.$$eval('#alarm-list li', (ls) => ls.map((l) => l.dataset.alarm));
    assert.deepEqual(order, ['boiler-hot', 'level-low.line1.level'], 'worst first: high before medium');
    assert.match(await ana.textContent('#alarm-count'), /2 alarms, 2 unacknowledged/);

    // Ben shelves the boiler for 15 minutes; Ana sees it shelved until then, and unshelves it.
    await act(ben, 'boiler-hot', 'shelve', 'sensor work', 900);
    await waitState(ana, 'boiler-hot', 'shelved');
    const until = await (await fetch(`${server.url}/api/alarms/boiler-hot`, { headers: asKey })).json();
    assert.ok(Math.abs(until.shelved_until - Date.now() - 900_000) < 60_000, JSON.stringify(until));
    assert.match(await ana.textContent(`${row('boiler-hot')} .who`), /shelved until .*sensor work/);
    const shelvedOrder = await ana.$$eval('#alarm-list li', (ls) => ls.map((l) => l.dataset.alarm));
    assert.deepEqual(shelvedOrder, ['level-low.line1.level', 'boiler-hot'], 'a shelved alarm goes below the ones to act on');
    await act(ana, 'boiler-hot', 'unshelve', 'work done');
    // The condition still holds: raised again, unacknowledged.
    for (const p of [ana, ben]) await waitState(p, 'boiler-hot', 'active_unacked');

    // Back to normal before anyone acknowledged: returned, waiting; Ben's ack clears it.
    await publish('pt:boiler.temp', 60);
    for (const p of [ana, ben]) await waitState(p, 'boiler-hot', 'rtn_unacked');
    await act(ben, 'boiler-hot', 'ack', '');
    for (const p of [ana, ben]) await p.waitForSelector(row('boiler-hot'), { state: 'detached' });
    await publish('pt:line1.level', 50);
    await act(ana, 'level-low.line1.level', 'ack', 'refilled');
    for (const p of [ana, ben]) await p.waitForSelector('#alarms', { state: 'hidden' });

    await ana.screenshot({ path: join(OUT, 'alarms.png') });
    assert.deepEqual(ana.errors, []);
    assert.deepEqual(ben.errors, []);
    await ben.close();

    // The journal widget lists every transition, newest first, with who and why.
    const kinds = () => ana.$$eval('.journal-list li', (ls) => ls.filter((l) => l.dataset.alarm === 'boiler-hot').map((l) => l.dataset.kind));
    await ana.waitForFunction(() => document.querySelectorAll('.journal-list li[data-alarm="boiler-hot"][data-kind="acked"]').length === 2, null, { timeout: 5000 });
    assert.deepEqual(await kinds(), ['acked', 'returned', 'unshelved', 'shelved', 'worsened', 'acked', 'raised']);
    const text = await ana.textContent('.journal-list');
    for (const s of ['user:ana', 'user:ben', 'called maintenance', 'sensor work', 'work done']) assert.ok(text.includes(s), `${s} in ${text}`);

    // Filters: a kind, an alarm, a time range.
    await ana.selectOption('.journal-kind', 'acked');
    await ana.waitForFunction(() => {
      const ls = [...document.querySelectorAll('.journal-list li')];
      return ls.length === 3 && ls.every((l) => l.dataset.kind === 'acked');
    });
    await ana.fill('.journal-alarm', 'level-low');
    await ana.press('.journal-alarm', 'Tab');
    await ana.waitForFunction(() => {
      const ls = [...document.querySelectorAll('.journal-list li')];
      return ls.length === 1 && ls[0].dataset.alarm === 'level-low.line1.level';
    });
    await ana.selectOption('.journal-kind', '');
    await ana.fill('.journal-alarm', '');
    await ana.press('.journal-alarm', 'Tab');
    await ana.fill('.journal-until', '2001-01-01T00:00');
    await ana.press('.journal-until', 'Tab');
    await ana.waitForFunction(() => /no entries/.test(document.querySelector('.journal-note')?.textContent ?? ''));
    assert.deepEqual(ana.errors, []);
    await ana.close();
  });

  it('pages through the journal with Older', async () => {
    // Enough transitions for more than one page of the widget's 5.
    for (let i = 0; i < 4; i++) {
      await publish('pt:line1.level', 3);
      await publish('pt:line1.level', 50);
    }
    const spec = {
      title: 'Journal pages',
      widgets: [{ type: 'alarm-journal', channel: '', x: 0, y: 0, w: 40, h: 12, options: { limit: 5, alarm: 'level-low' } }],
    };
    await fetch(`${server.url}/api/dashboards/journal-pages`, { method: 'PUT', headers: asKey, body: JSON.stringify(spec) });
    const page = await newPage(browser);
    await page.goto(`${server.url}/?dashboard=journal-pages#token=${jwt('ana')}`);
    await page.waitForFunction(() => document.querySelectorAll('.journal-list li').length === 5);
    assert.equal(await page.isVisible('.journal-more'), true);
    const first = await page.$$eval('.journal-list li', (ls) => ls.map((l) => l.title));
    await page.click('.journal-more');
    await page.waitForFunction(() => document.querySelectorAll('.journal-list li').length > 5);
    const all = await page.$$eval('.journal-list li', (ls) => ls.map((l) => l.title));
    assert.deepEqual(all.slice(0, 5), first, 'older entries come after the first page');
    assert.deepEqual(page.errors, []);
    await page.close();
  });
});
