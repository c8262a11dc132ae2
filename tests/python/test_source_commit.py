"""A value measured is a value kept (docs/sources.md, "Never lost"), against a real mosquitto,
a real redis-server and paho-mqtt as the devices (an MQTT implementation independent of the
node's):

- QoS 1 values are acknowledged only once committed: 100 values/s over 10 topics, each with its
  own time, through a 10 s outage of redis-server. With the default source lease the outage
  outlasts the lease, so the source also stops and starts again in it: what it held
  unacknowledged comes back from the MQTT broker's session. Two outages:
  - paused (SIGSTOP, then SIGCONT): publications under way when it stopped answer "outcome
    unknown" and are committed when it resumes; afterwards every channel's history holds every
    value once, in order, and its one-second trend buckets count every value at its own time;
  - killed (SIGKILL) and started again on its append-only file, fsynced on every write, so
    that what it acknowledged survives and the restart keeps every channel's epoch: the same
    as paused, every value once in history and in the trend buckets.
  Either way the source's backlog is empty again.
- A Sparkplug B primary host (`sparkplug_host_id`) publishes its STATE retained: online once
  subscribed, offline while the node cannot commit, online again after, and offline when the
  node stops; a STATE of another host id gives no channel.
- The memory broker commits at once: the same values all arrive with nothing held.
- QoS 0 values wait within `buffer_bytes` while the node cannot commit (a lease long enough for
  the source to keep running); past it the newest per channel is kept and what is dropped is
  counted (`switchboard_source_dropped_total{reason="buffer"}`); while they wait, the backlog
  and the age of its oldest value show on /metrics and /api/sources.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import paho.mqtt.client as paho
import pytest

import sb
from mqtt_kit import Mosquitto
from mqtt_kit import mosquitto  # noqa: F401 (the module's mosquitto, a fixture)
from redis_kit import Redis
from sb import api_get, ch_path, uniq

TOPICS = 10
RATE = 100  # values/s over all topics


def paho_client(port: int, client_id: str) -> paho.Client:
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv311)
    c.max_queued_messages_set(0)
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    sb.wait_until("paho connected", c.is_connected, 10)
    return c


class Devices:
    """Publishes `{"v": i, "t": <own ms>, "q": "good"}` at RATE over TOPICS topics with QoS
    `qos`, in a thread, until stopped; `sent[topic]` is what it published, in order."""

    def __init__(self, mq: Mosquitto, prefix: str, qos: int = 1, rate: int = RATE, topics: int = TOPICS):
        self.client = paho_client(mq.port, uniq("dev-"))
        self.topics = [f"{prefix}/m{i}" for i in range(topics)]
        self.sent: dict[str, list[int]] = {t: [] for t in self.topics}
        self.qos, self.rate = qos, rate
        self.infos = []
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        period, n = 1.0 / self.rate, 0
        start = time.monotonic()
        while self.running:
            topic = self.topics[n % len(self.topics)]
            i = len(self.sent[topic])
            payload = json.dumps({"v": i, "t": int(time.time() * 1000), "q": "good"})
            self.infos.append(self.client.publish(topic, payload, qos=self.qos))
            self.sent[topic].append(i)
            n += 1
            time.sleep(max(0.0, start + n * period - time.monotonic()))

    def stop(self) -> int:
        self.running = False
        self.thread.join(timeout=10)
        for info in self.infos:
            if self.qos:
                info.wait_for_publish(timeout=30)
        self.client.disconnect()
        self.client.loop_stop()
        return sum(len(v) for v in self.sent.values())


def config(tmp_path, mq: Mosquitto, prefix: str, extra: str = "", lease_ttl_s: int = 5) -> str:
    path = tmp_path / f"commit-{uniq()}.toml"
    path.write_text(f"""
source_lease_ttl_s = {lease_ttl_s}

[namespaces.pt]
history_size = 2000
history_ttl_s = 3600

[[sources]]
kind = "mqtt"
name = "plant"
url = "{mq.url}"
topics = ["{prefix}/#"]
channel = "pt:{{topic}}"
client_id = "{uniq('sb-')}"
qos = 1
{extra}
""")
    return str(path)


def trend_count(srv: sb.Server, ch: str) -> int:
    return sum(b["n"] for b in sb.trend(srv, ch, 600)["buckets"])


def metric(srv: sb.Server, name: str, **labels) -> float:
    """The plant source's series `name`."""
    return sb.metric(srv, name, source="plant", kind="mqtt", **labels)


def channel_of(topic: str) -> str:
    return "pt:" + topic.replace("/", ".")


def assert_every_value_once(srv: sb.Server, dev: Devices) -> None:
    """Every value sent is counted once in its channel's trend, and the history holds every
    value once, in order."""
    for topic, sent in dev.sent.items():
        ch = channel_of(topic)
        sb.wait_until(f"{ch} has its last value", lambda: (sb.history_all(srv, ch) or [{}])[-1].get("v") == sent[-1], 60,
                      every=0.5)
        got = [d["v"] for d in sb.history_all(srv, ch)]
        assert got == sent, f"{ch}: history is not every value once in order (got {len(got)}, sent {len(sent)})"
        times = [d["t"] for d in sb.history_all(srv, ch)]
        assert times == sorted(times)
        sb.wait_until(f"{ch}: trend buckets count every value once", lambda: trend_count(srv, ch) == len(sent), 10)


class StateWatcher:
    """A paho subscriber on `spBv1.0/STATE/#`: every STATE with the time it came."""

    def __init__(self, mq: Mosquitto):
        self.seen: list[tuple[float, str, dict]] = []
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=uniq("state-"),
                                  protocol=paho.MQTTv311)
        self.client.on_message = lambda _c, _u, m: self.seen.append(
            (time.monotonic(), m.topic, json.loads(m.payload)))
        self.client.connect("127.0.0.1", mq.port, keepalive=30)
        self.client.subscribe("spBv1.0/STATE/#", qos=1)
        self.client.loop_start()

    def last(self, host: str) -> dict | None:
        states = [s for _, t, s in self.seen if t == f"spBv1.0/STATE/{host}"]
        return states[-1] if states else None

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("outage", ["paused", "killed"])
def test_qos1_values_survive_a_redis_outage_once_each_in_order_with_a_primary_host_state(
        start_server, tmp_path, mosquitto, outage):
    redis = Redis(tmp_path, durable=True)
    redis.start()
    watcher = StateWatcher(mosquitto)
    prefix = uniq("plant")
    host = uniq("host")
    srv = start_server("--broker", redis.url, "--config",
                       config(tmp_path, mosquitto, prefix, f'sparkplug_host_id = "{host}"'))
    try:
        sb.wait_until("the host says it is online", lambda: (watcher.last(host) or {}).get("online") is True, 20)
        birth = watcher.last(host)["timestamp"]
        dev = Devices(mosquitto, prefix)
        time.sleep(3)
        killed = time.monotonic()
        if outage == "paused":
            redis.signal(signal.SIGSTOP)
        else:
            redis.kill()
        sb.wait_until("the host says it is offline", lambda: watcher.last(host).get("online") is False, 10)
        offline_after = [at for at, _, s in watcher.seen if s.get("online") is False][-1] - killed
        time.sleep(max(0.0, 10 - (time.monotonic() - killed)))
        if outage == "paused":
            redis.signal(signal.SIGCONT)
        else:
            redis.start()
        sb.wait_until("the host is online again", lambda: watcher.last(host).get("online") is True, 60)
        time.sleep(3)
        sent = dev.stop()
        assert sent >= 1500
        # Redis fsyncs every write: its restart keeps the epochs, so the history reaches back.
        assert_every_value_once(srv, dev)
        sb.wait_until("the backlog is empty", lambda: metric(srv, "switchboard_source_backlog") == 0, 30)
        sources = api_get(srv, "/api/sources").json()["sources"]
        assert sources[0]["name"] == "plant" and sources[0]["backlog"] == 0 and sources[0]["backlog_age_s"] == 0
        # Every STATE of one connection carries its timestamp; a later connection's is later.
        states = [s for _, t, s in watcher.seen if t == f"spBv1.0/STATE/{host}"]
        assert all(s["timestamp"] >= birth for s in states)
        print(f"offline said {offline_after:.2f} s after the kill; {sent} values")
        # A STATE of another host id is not a point.
        other = paho_client(mosquitto.port, uniq("other-"))
        other.publish("spBv1.0/STATE/someone-else", json.dumps({"online": True, "timestamp": 1}), qos=1).wait_for_publish()
        other.disconnect()
        time.sleep(0.5)
        assert api_get(srv, f"/api/channels/{ch_path('pt:spBv1.0.STATE.someone-else')}").status == 404
        # A node that stops says its host is offline, with its connection's timestamp.
        srv.terminate()
        sb.wait_until("offline at stop", lambda: watcher.last(host).get("online") is False, 10)
    finally:
        watcher.close()
        redis.kill()


def test_memory_broker_commits_every_qos1_value_at_once(start_server, tmp_path, mosquitto):
    prefix = uniq("plant")
    srv = start_server("--config", config(tmp_path, mosquitto, prefix))
    sb.wait_until("the source runs", lambda: metric(srv, "switchboard_source_connected") == 1, 20)
    dev = Devices(mosquitto, prefix)
    time.sleep(4)
    dev.stop()
    assert_every_value_once(srv, dev)
    assert metric(srv, "switchboard_source_backlog") == 0


def test_qos0_values_keep_the_newest_per_channel_when_the_buffer_is_full(start_server, tmp_path, mosquitto):
    redis = Redis(tmp_path, durable=True)
    redis.start()
    prefix = uniq("plant")
    srv = start_server("--broker", redis.url, "--config",
                       config(tmp_path, mosquitto, prefix, "buffer_bytes = 65536", lease_ttl_s=30))
    try:
        sb.wait_until("the source runs", lambda: metric(srv, "switchboard_source_connected") == 1, 20)
        redis.kill()
        time.sleep(1)
        client = paho_client(mosquitto.port, uniq("dev0-"))
        topics = [f"{prefix}/q{i}" for i in range(3)]
        pad = "x" * 200
        last = {}
        for i in range(1500):  # ~ 3 x 500 x 250 bytes: well past 64 KiB
            topic = topics[i % 3]
            last[topic] = i
            client.publish(topic, json.dumps({"v": i, "t": int(time.time() * 1000), "pad": pad}), qos=0)
        time.sleep(1)
        client.disconnect()
        client.loop_stop()
        sb.wait_until("values wait in the backlog", lambda: metric(srv, "switchboard_source_backlog") > 0, 10)
        # Told, never silent: how many wait and how long the oldest has, on /metrics and /api/sources.
        sb.wait_until("the backlog ages", lambda: metric(srv, "switchboard_source_backlog_age_seconds") >= 1, 10)
        waiting = api_get(srv, "/api/sources").json()["sources"][0]
        assert waiting["backlog"] > 0 and waiting["backlog_age_s"] >= 1, waiting
        assert waiting["dropped"].get("buffer", 0) > 0, waiting
        redis.start()
        for topic, i in last.items():
            ch = channel_of(topic)
            sb.wait_until(f"{ch} has its newest value", lambda: (sb.history_all(srv, ch) or [{}])[-1].get("v") == i, 60, every=0.5)
        dropped = metric(srv, "switchboard_source_dropped_total", reason="buffer")
        kept = sum(len(sb.history_all(srv, channel_of(t))) for t in topics)
        assert dropped > 0 and kept + dropped == 1500, (dropped, kept)
    finally:
        redis.kill()
