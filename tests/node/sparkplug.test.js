// Black-box test of the MQTT source's Sparkplug B handling with Eclipse Tahu's payload codec
// (`sparkplug-payload`) as the edge node: it encodes the births and data, and decodes the commands
// the server publishes. Starts a real mosquitto (needs `make mqtt-deps`) and target/release/switchboard
// (or $SWITCHBOARD_BIN) on free ports and kills both by PID. The MQTT client is a minimal MQTT
// 3.1.1 client over a socket, written here from the MQTT specification.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { spawn, execFileSync } = require('node:child_process');
// `long` is sparkplug-payload's own dependency (its 64-bit values); the lock file pins it.
const Long = require('long');
const sparkplug = require('sparkplug-payload').get('spBv1.0');

const REPO_ROOT = path.resolve(__dirname, '..', '..');
const BIN = process.env.SWITCHBOARD_BIN || path.join(REPO_ROOT, 'target', 'release', 'switchboard');

function which(name, fallback) {
  try {
    return execFileSync('sh', ['-c', `command -v ${name}`]).toString().trim() || fallback;
  } catch {
    return fallback;
  }
}
const MOSQUITTO = which('mosquitto', '/usr/sbin/mosquitto');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
    srv.on('error', reject);
  });
}

// --- a minimal MQTT 3.1.1 client ------------------------------------------------------------

function varint(n) {
  const out = [];
  do {
    let b = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) b |= 0x80;
    out.push(b);
  } while (n > 0);
  return Buffer.from(out);
}
const str = (s) => {
  const b = Buffer.from(s);
  return Buffer.concat([Buffer.from([b.length >> 8, b.length & 0xff]), b]);
};
const packet = (first, body) => Buffer.concat([Buffer.from([first]), varint(body.length), body]);

class Mqtt {
  constructor(sock) {
    this.sock = sock;
    this.buf = Buffer.alloc(0);
    this.messages = [];
    this.acks = new Map();
    this.nextId = 1;
    this.onPacket = null;
    sock.on('data', (d) => {
      this.buf = Buffer.concat([this.buf, d]);
      for (;;) {
        let len = 0;
        let mult = 1;
        let i = 1;
        for (; i < this.buf.length; i++) {
          len += (this.buf[i] & 0x7f) * mult;
          mult *= 128;
          if (!(this.buf[i] & 0x80)) break;
        }
        if (i >= this.buf.length || this.buf.length < i + 1 + len) return;
        const type = this.buf[0] >> 4;
        const body = this.buf.subarray(i + 1, i + 1 + len);
        this.buf = this.buf.subarray(i + 1 + len);
        this.handle(type, body);
      }
    });
  }

  static connect(port, clientId) {
    return new Promise((resolve, reject) => {
      const sock = net.connect(port, '127.0.0.1');
      const c = new Mqtt(sock);
      sock.on('error', reject);
      sock.on('connect', () => {
        const body = Buffer.concat([str('MQTT'), Buffer.from([4, 0x02, 0, 60]), str(clientId)]);
        sock.write(packet(0x10, body));
      });
      c.acks.set('connack', () => resolve(c));
    });
  }

  handle(type, body) {
    if (type === 2) this.acks.get('connack')();
    else if (type === 4 || type === 9) {
      const id = body.readUInt16BE(0);
      const done = this.acks.get(id);
      this.acks.delete(id);
      if (done) done();
    } else if (type === 3) {
      const n = body.readUInt16BE(0);
      // Subscriptions are QoS 0: no packet id follows the topic.
      this.messages.push({ topic: body.subarray(2, 2 + n).toString(), payload: Buffer.from(body.subarray(2 + n)) });
    }
  }

  acked(id, bytes) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no ack for packet ${id}`)), 10000);
      this.acks.set(id, () => {
        clearTimeout(timer);
        resolve();
      });
      this.sock.write(bytes);
    });
  }

  subscribe(filter) {
    const id = this.nextId++;
    const body = Buffer.concat([Buffer.from([id >> 8, id & 0xff]), str(filter), Buffer.from([0])]);
    return this.acked(id, packet(0x82, body));
  }

  // QoS 1: resolves on the broker's PUBACK.
  publish(topic, payload) {
    const id = this.nextId++;
    const body = Buffer.concat([str(topic), Buffer.from([id >> 8, id & 0xff]), Buffer.from(payload)]);
    return this.acked(id, packet(0x32, body));
  }

  received(topic) {
    return this.messages.filter((m) => m.topic === topic);
  }

  async waitFor(topic, count, timeoutMs = 10000) {
    const deadline = Date.now() + timeoutMs;
    while (this.received(topic).length < count) {
      if (Date.now() > deadline) throw new Error(`${topic}: ${this.received(topic).length} of ${count} messages`);
      await sleep(20);
    }
    return this.received(topic);
  }

  close() {
    this.sock.end(Buffer.from([0xe0, 0]));
  }
}

// --- mosquitto and the server -----------------------------------------------------------------

let dir;
let mosquitto;
let mqttPort;
let server;
let httpUrl;

async function startMosquitto() {
  mqttPort = await freePort();
  const conf = path.join(dir, 'mosquitto.conf');
  fs.writeFileSync(conf, `listener ${mqttPort} 127.0.0.1\nallow_anonymous true\npersistence false\n`);
  mosquitto = spawn(MOSQUITTO, ['-c', conf], { stdio: 'ignore' });
  for (let i = 0; i < 200; i++) {
    const up = await new Promise((resolve) => {
      const s = net.connect(mqttPort, '127.0.0.1');
      s.on('connect', () => {
        s.destroy();
        resolve(true);
      });
      s.on('error', () => resolve(false));
    });
    if (up) return;
    await sleep(50);
  }
  throw new Error('mosquitto did not start');
}

function startServer() {
  const conf = path.join(dir, 'switchboard.toml');
  fs.writeFileSync(conf, `
[[sources]]
kind = "mqtt"
name = "plant"
url = "mqtt://127.0.0.1:${mqttPort}"
topics = ["plant/#", "spBv1.0/#"]
channel = "pt:{topic}"
client_id = "sb-node-test-${process.pid}"

[namespaces.pt]
client_publish = true
write_source = "plant"
`);
  return new Promise((resolve, reject) => {
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SWITCHBOARD_')));
    const proc = spawn(BIN, ['serve', '--listen', '127.0.0.1:0', '--config', conf],
      { stdio: ['ignore', 'pipe', 'ignore'], env });
    let out = '';
    const timer = setTimeout(() => reject(new Error(`no listening line; stdout: ${out}`)), 10000);
    proc.on('error', reject);
    proc.stdout.on('data', (chunk) => {
      out += chunk.toString();
      const m = /^switchboard listening on (http:\/\/127\.0\.0\.1:\d+)\n/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve({ proc, httpUrl: m[1] });
      }
    });
  });
}

// The source subscribes after it connects, some time after the node listens; a birth published
// before that would be lost (it is not retained). Probe values on `plant/probe` until one comes
// through: the source's topic filters are subscribed together, so `spBv1.0/#` is then too.
async function sourceSubscribed() {
  const probe = await Mqtt.connect(mqttPort, `probe-${process.pid}`);
  try {
    const deadline = Date.now() + 20000;
    for (;;) {
      await probe.publish('plant/probe', Buffer.from('1'));
      const res = await fetch(`${httpUrl}/api/channels/${encodeURIComponent('pt:plant.probe')}`);
      if (res.ok && /"last":\{/.test(await res.text())) return;
      if (Date.now() > deadline) throw new Error('the source did not subscribe within 20 s');
      await sleep(100);
    }
  } finally {
    probe.close();
  }
}

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-sparkplug-'));
  await startMosquitto();
  server = await startServer();
  httpUrl = server.httpUrl;
  await sourceSubscribed();
});

after(() => {
  if (server) process.kill(server.proc.pid, 'SIGKILL');
  if (mosquitto) process.kill(mosquitto.pid, 'SIGKILL');
  fs.rmSync(dir, { recursive: true, force: true });
});

// `last.data` of a channel as raw JSON text (big integers kept exact), once it has `v` = want.
async function lastData(channel, want, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  let text = '';
  for (;;) {
    const res = await fetch(`${httpUrl}/api/channels/${encodeURIComponent(channel)}`);
    text = await res.text();
    const m = /"last":\{.*"data":(\{[^}]*\})/.exec(text);
    if (m && (want === undefined || new RegExp(`"v":${want.replace(/[.+]/g, '\\$&')}[,}]`).test(m[1]))) return m[1];
    if (Date.now() > deadline) throw new Error(`${channel}: want v=${want}; got ${text}`);
    await sleep(50);
  }
}

async function write(channel, data) {
  const res = await fetch(`${httpUrl}/api/publish`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ channel, data }),
  });
  return { status: res.status, body: await res.text() };
}

// Tahu's decoder reads Int8, Int16 and Int32 alike, as a 32-bit two's complement; a negative
// Int8 or Int16 in its own width (what the server writes, as the specification's Python
// implementations do) comes out as its unsigned form, so those are read back at their width.
function signedAt(type, value) {
  if (type === 'Int8') return (Number(value) << 24) >> 24;
  if (type === 'Int16') return (Number(value) << 16) >> 16;
  return value;
}

// [name, type, value born with (Tahu's input), its JSON text, value written, how Tahu gives it back]
const NUMERIC = [
  ['i8', 'Int8', -5, '-5', -128, '-128'],
  ['i16', 'Int16', -300, '-300', -32768, '-32768'],
  ['i32', 'Int32', -2000000000, '-2000000000', -7, '-7'],
  ['i64', 'Int64', Long.fromString('-9000000000000'), '-9000000000000', -4611686018427387904n, '-4611686018427387904'],
  ['u8', 'UInt8', 250, '250', 255, '255'],
  ['u16', 'UInt16', 65000, '65000', 65535, '65535'],
  ['u32', 'UInt32', 3000000000, '3000000000', 4294967295, '4294967295'],
  ['u64', 'UInt64', Long.fromString('9223372036854775813', true), '9223372036854775813', 18446744073709551615n,
    '18446744073709551615'],
  ['dt', 'DateTime', Long.fromNumber(1700000000500, true), '1700000000500', 1800000000000, '1800000000000'],
  ['f', 'Float', 3.14, '3.14', 3.14, String(Math.fround(3.14))],
  ['d', 'Double', -0.1, '-0.1', 2.5, '2.5'],
  ['b', 'Boolean', true, 'true', false, 'false'],
];

test('sparkplug: Tahu births publish exact values, writes come back as commands Tahu decodes', async () => {
  const g = `G${process.pid}`;
  const edge = await Mqtt.connect(mqttPort, `tahu-edge-${process.pid}`);
  const cmds = await Mqtt.connect(mqttPort, `tahu-cmds-${process.pid}`);
  await cmds.subscribe(`spBv1.0/${g}/NCMD/#`);
  const now = Date.now();
  const metrics = [{ name: 'bdSeq', type: 'UInt64', value: 0 }]
    .concat(NUMERIC.map(([name, type, born], i) => ({ name, alias: i + 1, type, value: born, timestamp: now })));
  await edge.publish(`spBv1.0/${g}/NBIRTH/E1`, sparkplug.encodePayload({ timestamp: now, seq: 0, metrics }));

  for (const [name, , , text] of NUMERIC) {
    const data = await lastData(`pt:${g}.E1.${name}`, text);
    assert.match(data, /"q":"good"/, name);
  }
  // Data by alias from Tahu (its Int8 -100 sign-extended to 32 bits) reads as -100.
  await edge.publish(`spBv1.0/${g}/NDATA/E1`, sparkplug.encodePayload({
    timestamp: now + 1, seq: 1, metrics: [{ alias: 1, type: 'Int8', value: -100 }],
  }));
  await lastData(`pt:${g}.E1.i8`, '-100');

  for (const [name, , , , written] of NUMERIC) {
    // BigInt values go as JSON number text, beyond what a JS number keeps.
    const v = typeof written === 'bigint' ? written.toString() : JSON.stringify(written);
    const res = await fetch(`${httpUrl}/api/publish`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: `{"channel":"pt:${g}.E1.${name}","data":{"v":${v}}}`,
    });
    assert.equal(res.status, 200, `${name}: ${await res.text()}`);
  }
  const got = (await cmds.waitFor(`spBv1.0/${g}/NCMD/E1`, NUMERIC.length))
    .map((m) => sparkplug.decodePayload(m.payload).metrics[0])
    .map((m) => [m.name, m.type, String(signedAt(m.type, m.value))]);
  assert.deepEqual(got, NUMERIC.map(([name, type, , , , back]) => [name, type, back]));

  // A value out of its datatype's range: 400 naming it, nothing published.
  const r = await write(`pt:${g}.E1.u32`, 4294967296);
  assert.equal(r.status, 400, r.body);
  assert.match(r.body, /UInt32/);
  await sleep(300);
  assert.equal(cmds.received(`spBv1.0/${g}/NCMD/E1`).length, NUMERIC.length);
  edge.close();
  cmds.close();
});

test('sparkplug: a stale NDEATH (an earlier bdSeq) leaves the node alive, its own NDEATH does not', async () => {
  const g = `H${process.pid}`;
  const edge = await Mqtt.connect(mqttPort, `tahu-edge2-${process.pid}`);
  const birth = (bdSeq, level) => sparkplug.encodePayload({
    timestamp: Date.now(), seq: 0, metrics: [
      { name: 'bdSeq', type: 'UInt64', value: bdSeq },
      { name: 'Level', alias: 1, type: 'Double', value: level },
      { name: 'Count', alias: 2, type: 'Int32', value: 0 },
    ],
  });
  const death = (bdSeq) => sparkplug.encodePayload({
    timestamp: Date.now(), metrics: [{ name: 'bdSeq', type: 'UInt64', value: bdSeq }],
  });
  await edge.publish(`spBv1.0/${g}/NBIRTH/E1`, birth(7, 1.5));
  await edge.publish(`spBv1.0/${g}/NBIRTH/E1`, birth(8, 2.5));
  await edge.publish(`spBv1.0/${g}/NDEATH/E1`, death(7));
  await edge.publish(`spBv1.0/${g}/NDATA/E1`, sparkplug.encodePayload({
    timestamp: Date.now(), seq: 1, metrics: [{ alias: 2, type: 'Int32', value: -3 }],
  }));
  // The NDATA came after the stale NDEATH: once it shows, the NDEATH was read and ignored.
  assert.match(await lastData(`pt:${g}.E1.Count`, '-3'), /"q":"good"/);
  assert.match(await lastData(`pt:${g}.E1.Level`, '2.5'), /"q":"good"/);
  assert.equal((await write(`pt:${g}.E1.Level`, 3)).status, 200);

  await edge.publish(`spBv1.0/${g}/NDEATH/E1`, death(8));
  const deadline = Date.now() + 10000;
  while (!/"q":"bad"/.test(await lastData(`pt:${g}.E1.Level`))) {
    assert.ok(Date.now() < deadline, 'the current NDEATH never marked the metric bad');
    await sleep(50);
  }
  const r = await write(`pt:${g}.E1.Level`, 4);
  assert.equal(r.status, 503, r.body);
  assert.match(r.body, /NDEATH/);
  edge.close();
});

test('sparkplug: an NDEATH numbered one ahead of its NBIRTH (255 wrapping to 0) ends the session, one behind does not',
  async () => {
    // bdSeq counts 0 to 255 and wraps: after a birth of 255, a death of 0 is one ahead (as an edge
    // node that numbers its clean disconnect's NDEATH for its next connection sends it) and 254 one
    // behind (an earlier session's will). Encoded by Tahu, bdSeq as the Int64 the specification names.
    const g = `K${process.pid}`;
    const edge = await Mqtt.connect(mqttPort, `tahu-edge3-${process.pid}`);
    const bdSeq = (value) => ({ name: 'bdSeq', type: 'Int64', value });
    await edge.publish(`spBv1.0/${g}/NBIRTH/E1`, sparkplug.encodePayload({
      timestamp: Date.now(), seq: 0, metrics: [
        bdSeq(255),
        { name: 'Level', alias: 1, type: 'Double', value: 1.5 },
        { name: 'Count', alias: 2, type: 'Int32', value: 0 },
      ],
    }));
    const death = (value) => sparkplug.encodePayload({ timestamp: Date.now(), metrics: [bdSeq(value)] });
    assert.match(await lastData(`pt:${g}.E1.Level`, '1.5'), /"q":"good"/);

    await edge.publish(`spBv1.0/${g}/NDEATH/E1`, death(254));
    await edge.publish(`spBv1.0/${g}/NDATA/E1`, sparkplug.encodePayload({
      timestamp: Date.now(), seq: 1, metrics: [{ alias: 2, type: 'Int32', value: -3 }],
    }));
    // The NDATA came after the stale NDEATH: once it shows, the NDEATH was read and ignored.
    assert.match(await lastData(`pt:${g}.E1.Count`, '-3'), /"q":"good"/);
    assert.match(await lastData(`pt:${g}.E1.Level`, '1.5'), /"q":"good"/);
    assert.equal((await write(`pt:${g}.E1.Level`, 3)).status, 200);

    await edge.publish(`spBv1.0/${g}/NDEATH/E1`, death(0));
    const deadline = Date.now() + 10000;
    while (!/"q":"bad"/.test(await lastData(`pt:${g}.E1.Level`))) {
      assert.ok(Date.now() < deadline, 'the NDEATH one ahead never marked the metric bad');
      await sleep(50);
    }
    assert.match(await lastData(`pt:${g}.E1.Count`), /"q":"bad"/);
    const r = await write(`pt:${g}.E1.Level`, 4);
    assert.equal(r.status, 503, r.body);
    assert.match(r.body, /NDEATH/);
    edge.close();
  });
