// The demo's control room in Debian's Chromium against the real `switchboard demo` (with the
// mosquitto its MQTT path needs): the operator writes a setpoint, the control shows the write's
// outcome and author, the simulated device's flow follows it past the demo's flow alarm (the
// server's, from the demo's configuration), the operator acknowledges it with a comment, the
// write audit lists the write, and the point nobody updates is stale.

import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { launch, newPage, OUT, Server, sleep } from './harness.mjs';

let browser;
let server;

before(async () => {
  mkdirSync(OUT, { recursive: true });
  browser = await launch();
  server = await new Server({ command: 'demo' }).start();
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

describe('control room', () => {
  it('shows value in, operator write, device answer, alarm, audit and a stale point', async () => {
    const page = await newPage(browser);
    page.on('dialog', (d) => void d.accept());
    await page.goto(`${server.url}/?dashboard=control-room`);
    assert.equal(await page.textContent('#title-view'), 'Control room');
    // The setpoint the device starts with, heard back from the MQTT broker.
    await page.waitForFunction(() => window.switchboardWidget(0)?.hasValue && window.switchboardWidget(1)?.hasValue);
    await page.fill('.control-input', '90');
    await page.click('.control >> nth=0 >> text=Set');
    await page.waitForFunction(() => window.switchboardWidget(0)?.lastWrite?.outcome === 'written');
    const last = (await page.evaluate(() => window.switchboardWidget(0))).lastWrite;
    assert.equal(last.source, 'demo-set');
    assert.match(await page.textContent('.control-status'), /^written to demo-set by anonymous · /);
    // The device reports a flow that follows the setpoint, past the server's flow alarm.
    await page.waitForFunction(() => window.switchboardWidget(1)?.alarm === 'hihi', null, { timeout: 20_000 });
    const flow = '#alarm-list li[data-alarm="line1-flow"]';
    await page.waitForSelector(`${flow}[data-state="active_unacked"] button.ack`, { timeout: 10_000 });
    await page.click(`${flow} button.ack`);
    await page.fill(`${flow} .alarm-comment`, 'setpoint test');
    await page.click(`${flow} .alarm-submit`);
    await page.waitForSelector(`${flow}[data-state="active_acked"]`);
    assert.match(await page.textContent(`${flow} .who`), /acked by anonymous at .* setpoint test/);
    await page.waitForFunction(() => window.switchboardWidget(1)?.serverAlarm?.unacked === false);
    // The write audit lists the write.
    await page.waitForFunction(() => /anonymous cmd:set\.demo\.line1\.flow written/.test(
      document.querySelector('.writes-list')?.textContent ?? ''), null, { timeout: 10_000 });
    // The ambient point was sent once at start: stale after 10 s.
    await page.waitForFunction(() => window.switchboardWidget(2)?.staleFor !== null, null, { timeout: 20_000 });
    await sleep(300);
    await page.screenshot({ path: join(OUT, 'control-room.png') });
    assert.deepEqual(page.errors, []);
    await page.close();
  });
});
