// Black-box test of Switchboard with the `ws` client (node's built-in test runner).
// Starts target/release/switchboard (or $SWITCHBOARD_BIN) on a free port and kills it by PID.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawn } = require('node:child_process');
const WebSocket = require('ws');

const REPO_ROOT = path.resolve(__dirname, '..', '..');
const BIN = process.env.SWITCHBOARD_BIN || path.join(REPO_ROOT, 'target', 'release', 'switchboard');

let server;
let httpUrl;
let wsUrl;

function startServer() {
  return new Promise((resolve, reject) => {
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SWITCHBOARD_')));
    const proc = spawn(BIN, ['serve', '--listen', '127.0.0.1:0'], { stdio: ['ignore', 'pipe', 'ignore'], env });
    let out = '';
    const timer = setTimeout(() => reject(new Error(`no listening line; stdout: ${out}`)), 10000);
    proc.on('error', reject);
    proc.on('exit', (code) => reject(new Error(`server exited early with ${code}`)));
    proc.stdout.on('data', (chunk) => {
      out += chunk.toString();
      const m = /^switchboard listening on (http:\/\/127\.0\.0\.1:(\d+))\n/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve({ proc, httpUrl: m[1], port: Number(m[2]) });
      }
    });
  });
}

// A connection that splits frames into messages (several per text frame, separated by \n).
function open(url, protocols) {
  return new Promise((resolve, reject) => {
    const ws = protocols ? new WebSocket(url, protocols) : new WebSocket(url);
    const queue = [];
    const waiters = [];
    ws.on('message', (data, isBinary) => {
      assert.equal(isBinary, false, 'JSON subprotocol must use text frames');
      for (const part of data.toString('utf8').split('\n')) {
        if (part === '') continue;
        queue.push(JSON.parse(part));
      }
      for (let i = 0; i < waiters.length; i++) {
        const w = waiters[i];
        const idx = queue.findIndex(w.pred);
        if (idx >= 0) {
          const [msg] = queue.splice(idx, 1);
          waiters.splice(i--, 1);
          clearTimeout(w.timer);
          w.resolve(msg);
        }
      }
    });
    ws.on('error', reject);
    ws.on('open', () => {
      ws.next = (pred, timeoutMs = 5000) => new Promise((res, rej) => {
        const idx = queue.findIndex(pred);
        if (idx >= 0) return res(queue.splice(idx, 1)[0]);
        const timer = setTimeout(() => rej(new Error(`timeout; queued: ${JSON.stringify(queue).slice(0, 300)}`)), timeoutMs);
        waiters.push({ pred, resolve: res, timer });
      });
      ws.request = (id, command, body) => {
        ws.send(JSON.stringify({ id, [command]: body }));
        return ws.next((m) => m.id === id && ('ok' in m || 'error' in m));
      };
      resolve(ws);
    });
  });
}

async function publish(channel, data) {
  const res = await fetch(`${httpUrl}/api/publish`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ channel, data }),
  });
  assert.equal(res.status, 200);
  return res.json();
}

before(async () => {
  server = await startServer();
  httpUrl = server.httpUrl;
  wsUrl = `ws://127.0.0.1:${server.port}/ws`;
});

after(() => {
  if (server && server.proc.exitCode === null) {
    server.proc.removeAllListeners('exit');
    process.kill(server.proc.pid, 'SIGKILL');
  }
});

test('ws_subscribe_receives_publication_and_ping_echo', async () => {
  const ws = await open(wsUrl, ['switchboard.v1.json']);
  try {
    assert.equal(ws.protocol, 'switchboard.v1.json');
    const ch = `node.${process.pid}.${Date.now()}`;

    const sub = await ws.request(1, 'subscribe', { channels: [ch], initial: true });
    assert.equal(sub.id, 1);
    const r = sub.ok.channels[ch];
    assert.equal(r.offset, 0);
    assert.equal(r.last, null);
    assert.equal(typeof r.epoch, 'string');

    const data = { v: 21.5, t: 1700000000000, q: 'good', s: 'h\u00e9llo\n' };
    const res = await publish(ch, data);
    assert.deepEqual(res, { offset: 1, epoch: r.epoch });
    const push = await ws.next((m) => 'pub' in m);
    assert.deepEqual(push, { pub: { ch, off: 1, data } });

    const echo = { nested: [1, 'two', null, true, { three: 3.25 }] };
    const pong = await ws.request(2, 'ping', { data: echo });
    assert.deepEqual(pong, { id: 2, ok: { data: echo } });
  } finally {
    ws.close();
  }
});
