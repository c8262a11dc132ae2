// Screens an operator can read, in Debian's Chromium: a value's number and units, a state word
// and an LED's label fit their boxes at every size (scaled down, never cut), measured in the
// page with the browser's own text metrics; the board uses the screen's width in run mode; and
// a stale value is drawn dimmed with its age.

import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { allValues, inkOf, launch, newPage, OUT, Server } from './harness.mjs';

let browser;
let server;

before(async () => {
  mkdirSync(OUT, { recursive: true });
  browser = await launch();
  server = await new Server().start();
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

/** Every run of text a widget drew (body and label), with its ink's bounding box measured by
 * the browser (`measureText` in the run's font), and the boxes it must stay in. */
async function measured(page, i) {
  return page.evaluate((n) => {
    const w = window.switchboardWidget(n);
    const ctx = document.createElement('canvas').getContext('2d');
    const ink = (r) => {
      ctx.font = r.font;
      const m = ctx.measureText(r.text);
      return {
        ...r,
        left: r.x - m.actualBoundingBoxLeft,
        right: r.x + m.actualBoundingBoxRight,
        top: r.y - m.actualBoundingBoxAscent,
        bottom: r.y + m.actualBoundingBoxDescent,
        px: parseFloat(/([\d.]+)px/.exec(r.font)[1]),
      };
    };
    // The same text in a DOM box as wide as the widget's body: it must not scroll.
    const box = document.createElement('div');
    Object.assign(box.style, { position: 'fixed', left: '0', top: '0', whiteSpace: 'nowrap', overflow: 'hidden', visibility: 'hidden' });
    document.body.append(box);
    const domFits = (r, width) => {
      box.style.font = r.font;
      box.style.width = `${width}px`;
      box.textContent = r.text;
      return box.scrollWidth <= box.clientWidth;
    };
    const out = {
      type: w.type,
      text: w.text,
      body: w.body,
      panel: w.panel,
      texts: w.texts.map((r) => ({ ...ink(r), domFits: domFits(r, w.body.width) })),
      labels: w.labels.map((r) => ({ ...ink(r), domFits: domFits(r, w.panel.width - 8) })),
    };
    box.remove();
    return out;
  }, i);
}

function assertInside(run, rect, what) {
  const slack = 0.5;
  const where = `${what}: "${run.text}" (${run.font}) ink ${run.left.toFixed(1)}..${run.right.toFixed(1)} × ${run.top.toFixed(1)}..${run.bottom.toFixed(1)} in ${JSON.stringify(rect)}`;
  assert.ok(run.left >= rect.x - slack && run.right <= rect.x + rect.width + slack, `cut across: ${where}`);
  assert.ok(run.top >= rect.y - slack && run.bottom <= rect.y + rect.height + slack, `cut along: ${where}`);
  assert.ok(run.domFits, `the text overflows a box its width: ${where}`);
}

// The texts the demo cut, and longer ones, in boxes from large to tiny (grid cells).
const VALUES = [
  { channel: 'fit.flow', data: { v: 54.1 }, options: { units: 'm³/h', decimals: 1, label: 'Flow (device)' }, text: '54.1 m³/h' },
  { channel: 'fit.state', data: { v: 'STOPPED' }, options: { label: 'Line 1 state' }, text: 'STOPPED' },
  { channel: 'fit.big', data: { v: -123456.789 }, options: { units: 'kg/h', decimals: 3 }, text: '-123456.789 kg/h' },
  { channel: 'fit.word', data: { v: 'EMERGENCY STOP ENGAGED' }, options: {}, text: 'EMERGENCY STOP ENGAGED' },
];
const SIZES = [
  [8, 5],
  [6, 3],
  [4, 3],
  [3, 2],
  [2, 2],
];

describe('readable text', () => {
  before(async () => {
    for (const v of VALUES) await server.publish(v.channel, v.data);
    await server.publish('fit.running', { v: true });
    await server.publish('fit.gauge', { v: 4321.5 });
    const widgets = [];
    SIZES.forEach(([w, h], row) => {
      let x = 0;
      for (const v of VALUES) {
        widgets.push({ type: 'value', channel: v.channel, x, y: row * 5, w, h, options: v.options });
        x += w;
      }
      widgets.push({ type: 'led', channel: 'fit.running', x, y: row * 5, w: Math.max(2, h), h, options: { label: 'Pump P-101 running' } });
      x += Math.max(2, h);
      widgets.push({ type: 'gauge', channel: 'fit.gauge', x, y: row * 5, w: h + 1, h: h + 1, options: { units: 'm³/h', max: 5000 } });
    });
    await server.putDashboard('readable', { title: 'Readable', widgets });
  });

  for (const viewport of [
    { width: 1400, height: 900 },
    { width: 900, height: 700 },
  ]) {
    it(`fits every value, state word and LED label in its box (${viewport.width}×${viewport.height})`, async () => {
      const page = await newPage(browser, viewport);
      await page.goto(`${server.url}/?dashboard=readable`);
      const count = SIZES.length * (VALUES.length + 2);
      await allValues(page, count);
      await page.waitForFunction((n) => [...Array(n).keys()].every((i) => window.switchboardWidget(i).texts.length > 0 || window.switchboardWidget(i).type === 'led'), count);
      for (let i = 0; i < count; i++) {
        const w = await measured(page, i);
        const where = `widget ${i} (${w.type}, ${w.body.width.toFixed(0)}×${w.body.height.toFixed(0)} px)`;
        if (w.type === 'value') {
          const v = VALUES[i % (VALUES.length + 2)];
          // The whole text is drawn (number and units), nothing left out or ellipsized.
          assert.equal(w.texts.map((r) => r.text).join(' '), v.text, where);
          assert.equal(w.text, v.text, where);
        }
        for (const r of w.texts) assertInside(r, w.body, where);
        for (const r of w.labels) assertInside(r, w.panel, `${where} label`);
        // From three cells up the LED's long label is whole (smaller, or on two lines); in a
        // smaller panel it may end in an ellipsis, but inside the panel.
        if (w.type === 'led' && w.panel.width >= 56 && w.panel.height >= 56) {
          assert.equal(w.labels.map((r) => r.text).join(' '), 'Pump P-101 running', `${where}: the LED's label whole`);
        }
      }
      // Where there is room the text is large: the demo's 8×5 state box shows STOPPED at 20 px or more.
      const state = await measured(page, 1);
      assert.ok(state.texts[0].px >= 20, `STOPPED at ${state.texts[0].px} px in ${JSON.stringify(state.body)}`);
      await page.screenshot({ path: join(OUT, `readable-${viewport.width}.png`) });
      assert.deepEqual(page.errors, []);
      await page.close();
    });
  }

  it('scales the board to the screen width in run mode and back to the 20 px grid in edit mode', async () => {
    await server.putDashboard('wide', {
      title: 'Wide',
      widgets: [
        { type: 'value', channel: 'fit.flow', x: 0, y: 0, w: 8, h: 4, options: { units: 'm³/h' } },
        { type: 'value', channel: 'fit.state', x: 8, y: 0, w: 8, h: 4 },
        { type: 'value', channel: 'fit.big', x: 16, y: 0, w: 8, h: 4 },
      ],
    });
    const page = await newPage(browser, { width: 1400, height: 900 });
    await page.goto(`${server.url}/?dashboard=wide`);
    await allValues(page, 3);
    const right = async () => {
      const w = await page.evaluate(() => window.switchboardWidget(2));
      return w.panel.x + w.panel.width;
    };
    // 24 cells of 20 px would end at 480 px; the board grows them to the width.
    assert.ok((await right()) > 1400 * 0.9, `the widgets end at ${await right()} px of 1400`);
    await page.click('#edit-toggle');
    const box = await page.locator('.wbox[data-index="2"]').boundingBox();
    assert.equal(box.width, 8 * 20, 'edit mode edits the 20 px grid');
    await page.click('#edit-toggle');
    await page.waitForFunction(() => window.switchboardWidget(2).panel.width > 8 * 20);
    assert.deepEqual(page.errors, []);
    await page.close();
  });

  it('draws a stale value dimmed, with its age in the box', async () => {
    await server.publish('fit.stale', { v: 7.25 });
    await server.putDashboard('stale-fit', {
      title: 'Stale',
      widgets: [
        { type: 'value', channel: 'fit.stale', x: 0, y: 0, w: 8, h: 4, options: { stale_s: 1, units: 'bar', decimals: 2, label: 'Header pressure' } },
        { type: 'value', channel: 'fit.stale', x: 8, y: 0, w: 4, h: 2, options: { stale_s: 1, units: 'bar', decimals: 2 } },
      ],
    });
    const page = await newPage(browser, { width: 800, height: 600 });
    await page.goto(`${server.url}/?dashboard=stale-fit`);
    await allValues(page, 2);
    await page.waitForFunction(() => [0, 1].every((i) => (window.switchboardWidget(i).staleFor ?? 0) >= 2), null, { timeout: 10_000 });
    await page.waitForFunction(() => [0, 1].every((i) => window.switchboardWidget(i).texts.some((r) => /^stale \d+ s$/.test(r.text))));
    for (const i of [0, 1]) {
      const w = await measured(page, i);
      const age = w.texts.find((r) => r.text.startsWith('stale'));
      assert.ok(age, `widget ${i} shows the age: ${JSON.stringify(w.texts)}`);
      for (const r of w.texts) assertInside(r, w.body, `stale widget ${i}`);
      // The value is still shown, whole, above its age.
      assert.deepEqual(w.texts.filter((r) => r !== age).map((r) => r.text), ['7.25', 'bar']);
      assert.ok(w.texts.every((r) => r === age || r.bottom <= age.top + 0.5), 'the age sits below the value');
    }
    // Dimmed: the value's pixels are the text colour at reduced opacity over the panel, never
    // the full text colour; the age is in the warning colour.
    const w = await measured(page, 0);
    const value = w.texts[0];
    const rect = { x: Math.floor(value.left), y: Math.floor(value.top), width: Math.ceil(value.right - value.left), height: Math.ceil(value.bottom - value.top) };
    const ink = await inkOf(page, rect, ['#e6edf3', '#74797f']);
    assert.equal(ink.near['#e6edf3'], 0, `no full-strength text in a stale value: ${JSON.stringify(ink)}`);
    assert.ok(ink.near['#74797f'] > 20, `dimmed text: ${JSON.stringify(ink)}`);
    const age = w.texts.find((r) => r.text.startsWith('stale'));
    const ageInk = await inkOf(page, { x: Math.floor(age.left), y: Math.floor(age.top), width: Math.ceil(age.right - age.left), height: Math.ceil(age.bottom - age.top) }, ['#d29922']);
    assert.ok(ageInk.near['#d29922'] > 10, `the age in amber: ${JSON.stringify(ageInk)}`);
    // A new value: fresh, at full strength, no age.
    await server.publish('fit.stale', { v: 8.5 });
    await page.waitForFunction(() => window.switchboardWidget(0).staleFor === null && window.switchboardWidget(0).texts.every((r) => !r.text.startsWith('stale')));
    await page.screenshot({ path: join(OUT, 'stale.png') });
    assert.deepEqual(page.errors, []);
    await page.close();
  });
});
