// The dashboards API and the app's serving, black-box against the real binary.

import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { Server } from './harness.mjs';

const servers = [];
after(async () => {
  for (const s of servers) await s.stop();
});

async function start(opts) {
  const s = await new Server(opts).start();
  servers.push(s);
  return s;
}

const widget = (over = {}) => ({ type: 'gauge', channel: 'pt:a', x: 1, y: 2, w: 3, h: 4, options: { max: 10 }, ...over });

async function put(s, id, body) {
  const r = await fetch(`${s.url}/api/dashboards/${id}`, { method: 'PUT', body: typeof body === 'string' ? body : JSON.stringify(body) });
  return { status: r.status, body: r.status === 204 ? null : await r.json() };
}

describe('dashboards api', () => {
  it('stores, lists, replaces and deletes dashboards, which survive a restart', async () => {
    const s = await start();
    assert.deepEqual(await (await fetch(`${s.url}/api/dashboards`)).json(), []);
    const created = await put(s, 'plant-1', { title: 'Plant', widgets: [widget()] });
    assert.equal(created.status, 201);
    assert.equal(created.body.widget_count, 1);
    const replaced = await put(s, 'plant-1', { title: 'Plant 1', widgets: [widget(), widget({ type: 'trend' })] });
    assert.equal(replaced.status, 200);

    await s.kill();
    await s.start();
    const got = await (await fetch(`${s.url}/api/dashboards/plant-1`)).json();
    assert.equal(got.id, 'plant-1');
    assert.equal(got.title, 'Plant 1');
    assert.deepEqual(got.widgets, [widget(), widget({ type: 'trend' })]);
    const list = await (await fetch(`${s.url}/api/dashboards`)).json();
    assert.deepEqual(
      list.map((d) => [d.id, d.title, d.widget_count]),
      [['plant-1', 'Plant 1', 2]],
    );
    assert.equal((await fetch(`${s.url}/api/dashboards/plant-1`, { method: 'DELETE' })).status, 204);
    assert.equal((await fetch(`${s.url}/api/dashboards/plant-1`)).status, 404);
    assert.equal((await fetch(`${s.url}/api/dashboards/plant-1`, { method: 'DELETE' })).status, 404);
  });

  it('answers bad input with 400 and an error body naming the problem', async () => {
    const s = await start();
    const cases = [
      ['bad.id', { title: 't', widgets: [] }, 'dashboard id'],
      ['ok', { title: 't', widgets: [widget({ type: 'pie' })] }, 'widgets[0].type'],
      ['ok', { title: 't', widgets: [widget({ channel: 'no spaces' })] }, 'widgets[0].channel'],
      ['ok', { title: 't', widgets: [widget({ w: 0 })] }, 'widgets[0]'],
      ['ok', { widgets: [] }, 'title'],
      ['ok', 'not json', 'expected'],
    ];
    for (const [id, body, needle] of cases) {
      const r = await put(s, id, body);
      assert.equal(r.status, 400, `${id} ${JSON.stringify(body)}`);
      assert.equal(r.body.error.code, 400);
      assert.ok(r.body.error.message.includes(needle), r.body.error.message);
    }
    const many = { title: 't', widgets: Array.from({ length: 20_001 }, () => widget()) };
    assert.equal((await put(s, 'ok', many)).status, 413);
    assert.equal((await fetch(`${s.url}/api/dashboards`)).status, 200);
  });

  it('keeps dashboards in SWITCHBOARD_DATA_DIR when no flag is given', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sb-env-data-'));
    try {
      const s = await start({ env: { SWITCHBOARD_DATA_DIR: dir } });
      assert.equal((await put(s, 'env', { title: 'e', widgets: [] })).status, 201);
      const { readdirSync } = await import('node:fs');
      assert.deepEqual(readdirSync(join(dir, 'dashboards')), ['env.json']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('serves the built app at /, and a page with a hint when there is no build', async () => {
    const s = await start();
    const html = await (await fetch(`${s.url}/`)).text();
    assert.match(html, /\/assets\/app\.js/);
    const js = await fetch(`${s.url}/assets/app.js`);
    assert.equal(js.status, 200);
    assert.match(js.headers.get('content-type'), /javascript/);
    assert.equal((await fetch(`${s.url}/assets/..%2Findex.html`)).status, 404);
    assert.equal((await fetch(`${s.url}/assets/missing.js`)).status, 404);

    const bare = await start({ args: ['--web-dir', join(tmpdir(), 'no-such-build')] });
    const fallback = await (await fetch(`${bare.url}/`)).text();
    assert.match(fallback, /make build/);
  });
});
