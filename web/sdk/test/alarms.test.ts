// The SDK and the server's alarms (docs/alarms.md): `alarm:all` read like any channel into an
// AlarmBook together with GET /api/alarms, and the alarm commands answering with the new state
// (and the server's code when an action does not apply).

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { AlarmBook, ALARMS_CHANNEL, Client, SwitchboardError, type AlarmState, type WebSocketConstructor } from '../src/index.js';
import { Server, until } from './server.js';

const WS = WebSocket as unknown as WebSocketConstructor;
const dir = mkdtempSync(join(tmpdir(), 'sb-sdk-alarms-'));
const config = join(dir, 'alarms.toml');
writeFileSync(config, '[[alarms]]\nid = "tank-high"\nchannel = "pt:tank.level"\nhi = 90.0\npriority = "high"\nmessage = "Tank level high"\n');
const server = new Server(['--config', config]);

beforeAll(async () => {
  await server.start();
});
afterAll(async () => {
  await server.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe('alarms', () => {
  it('keeps one state per alarm from alarm:all and the list, and acts as the connection', async () => {
    const c = new Client({ url: server.url, WebSocket: WS });
    const book = new AlarmBook();
    const sub = c.subscribe(ALARMS_CHANNEL);
    sub.on('publication', (p) => book.apply(p.data as AlarmState));
    await c.connect();
    await sub.ready;
    const r = await fetch(`${server.url}/api/alarms`);
    book.applyAll(((await r.json()) as { alarms: AlarmState[] }).alarms);

    await server.publish('pt:tank.level', { v: 95 });
    await until(() => book.get('tank-high')?.state === 'active_unacked', 'the alarm raised');
    expect(book.get('tank-high')).toMatchObject({ severity: 'hi', priority: 'high', message: 'Tank level high', value: 95 });

    const acked = await c.request('alarm_ack', { alarm: 'tank-high', comment: 'on it' });
    expect(acked).toMatchObject({ state: 'active_acked', acked_by: 'anonymous', comment: 'on it' });
    await until(() => book.get('tank-high')?.seq === acked.seq, 'the ack published');
    // Acknowledged already: the server's 409, with its reason.
    await expect(c.request('alarm_ack', { alarm: 'tank-high' })).rejects.toMatchObject({ code: 409 });

    const shelved = await c.request('alarm_shelve', { alarm: 'tank-high', for_s: 60, comment: 'calibrating' });
    expect(shelved.state).toBe('shelved');
    expect(shelved.shelved_until! - Date.now()).toBeGreaterThan(50_000);
    const back = await c.request('alarm_unshelve', { alarm: 'tank-high' });
    expect(back.state).toBe('active_unacked');
    await until(() => book.get('tank-high')?.seq === back.seq, 'the unshelve published');

    const err = await c.request('alarm_ack', { alarm: 'no-such-alarm' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SwitchboardError);
    expect((err as SwitchboardError).code).toBe(404);
    c.close();
  });
});
