"""A write reaches only the device it names (docs/sources.md, "Writes"), against a real
mosquitto with paho-mqtt (MQTT 3.1.1 and 5) as the devices and as the witness of what the
node publishes:

- one channel, one source path: topics `plant/u/a.b` and `plant/u/a/b` both map to
  `pt:plant.u.a.b`; the first keeps it, the second is refused (`collision`), and a write to
  the channel goes back to the first;
- writes only where the source reads: a channel outside the source's topic filters (or its
  `write_topics`) is 403 naming the channel, and nothing is published;
- a bad marker carries the last value the node accepted, not one it refused as too large;
- two deployments on one MQTT broker: distinct default client ids per `cluster_name`, and a
  take-over loop over one client id is warned about by name.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import paho.mqtt.client as paho

import sb
from mqtt_kit import INT32, UINT64, Mosquitto, metric, mosquitto, sparkplug_payload  # noqa: F401 (fixture)
from test_fault_mqtt import Device, last_data, mqtt_source, refused, wait_connected, wait_until, write_config
from sb import WS, http, uniq


class Witness:
    """A paho-mqtt MQTT 5 subscriber of `#` that keeps every (topic, payload) it receives."""

    def __init__(self, port: int):
        self.got: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=uniq("witness-"),
                                  protocol=paho.MQTTv5)
        subscribed = threading.Event()
        self.client.on_message = lambda _c, _u, m: self._keep(m.topic, m.payload)
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.connect("127.0.0.1", port, keepalive=30)
        self.client.loop_start()
        self.client.subscribe("#", qos=1)
        assert subscribed.wait(10), "the witness never subscribed"

    def _keep(self, topic: str, payload: bytes) -> None:
        with self.lock:
            self.got.append((topic, payload))

    def topics(self, prefix: str) -> list[str]:
        with self.lock:
            return [t for t, _ in self.got if t.startswith(prefix)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def start(start_server, tmp_path, mq, topics: list[str], source_extra: str = "", node_extra: str = ""):
    cfg = write_config(tmp_path, f'[namespaces.pt]\nclient_publish = true\nwrite_source = "plant"\n{node_extra}',
                       mqtt_source(mq, "plant", topics, uniq("sb-"), source_extra))
    return start_server("--config", cfg)


def first_value(ws: WS, ch: str, send, what: str):
    """Sends (`send()`) until the channel delivers — the source may still be subscribing — and
    returns the first value delivered."""
    deadline = time.monotonic() + 20
    while True:
        send()
        try:
            return ws.pubs(ch, 1, timeout=0.5)[0]["data"]["v"]
        except TimeoutError:
            assert time.monotonic() < deadline, f"{what} never arrived"


def publish(srv: sb.Server, ch: str, data) -> sb.HttpResponse:
    return http("POST", srv.http_url + "/api/publish", {"channel": ch, "data": data})


def test_device_one_channel_one_source_path(start_server, tmp_path, mosquitto):
    srv = start(start_server, tmp_path, mosquitto, ["plant/#"])
    u = uniq("u")
    ch = f"pt:plant.{u}.a.b"
    dotted = Device(mosquitto.port)
    slashed = Device(mosquitto.port)
    witness = Witness(mosquitto.port)
    try:
        with WS(srv.ws_url) as ws:
            ws.subscribe([ch])
            # The source may still be subscribing: the first path is sent until it arrives.
            assert first_value(ws, ch, lambda: dotted.publish(f"plant/{u}/a.b", "1"), "the first path") == 1
            slashed.publish(f"plant/{u}/a/b", "2")
            wait_until("the second path refused", lambda: refused(srv, "collision") >= 1)
            dotted.publish(f"plant/{u}/a.b", "3")
            assert [p["data"]["v"] for p in ws.pubs(ch, 1)] == [3], "the first path keeps the channel"
        assert last_data(srv, ch)["v"] == 3
        # A write goes back to the path that fed the channel, nowhere else.
        r = publish(srv, ch, 7)
        assert r.status == 200 and r.json() == {"written": True, "source": "plant"}, r.body
        wait_until("the write at the device", lambda: f"plant/{u}/a.b" in witness.topics(f"plant/{u}/"))
        time.sleep(0.5)
        assert witness.topics(f"plant/{u}/a/b") == ["plant/" + u + "/a/b"], "only the device's own message"
        assert "collision" in srv.stderr_tail(20000)
    finally:
        for c in (dotted, slashed, witness):
            c.close()


def test_device_a_sparkplug_metric_and_a_plain_topic_never_share_a_channel(start_server, tmp_path, mosquitto):
    """Sparkplug edge node `E` of group `G{u}` and the plain topic `G{u}/E/m` both give
    `pt:G{u}.E.m`: the metric, first, keeps the channel; the plain topic is refused, and a write
    becomes a Sparkplug command, never a plain publish."""
    srv = start(start_server, tmp_path, mosquitto, ["#"])
    u = uniq("u").replace("-", "")
    group = f"G{u}"
    ch = f"pt:{group}.E.m"
    dev = Device(mosquitto.port)
    witness = Witness(mosquitto.port)
    try:
        with WS(srv.ws_url) as ws:
            ws.subscribe([ch])
            birth = sparkplug_payload([metric("bdSeq", datatype=UINT64, value=0),
                                       metric("m", alias=1, datatype=INT32, value=5)], seq=0)
            assert first_value(ws, ch, lambda: dev.publish(f"spBv1.0/{group}/NBIRTH/E", birth), "the birth") == 5
            dev.publish(f"{group}/E/m", "99")
            wait_until("the plain topic refused", lambda: refused(srv, "collision") >= 1)
        assert last_data(srv, ch)["v"] == 5
        r = publish(srv, ch, 6)
        assert r.status == 200, r.body
        wait_until("the command", lambda: witness.topics(f"spBv1.0/{group}/NCMD/E"))
        time.sleep(0.5)
        assert witness.topics(f"{group}/") == [f"{group}/E/m"], "no plain publish besides the device's own"
    finally:
        dev.close()
        witness.close()


def test_device_writes_only_where_the_source_reads(start_server, switchboard_bin, tmp_path, mosquitto):
    srv = start(start_server, tmp_path, mosquitto, ["plant/#"], source_extra='write_topics = ["plant/+/sp"]')
    wait_connected(srv)
    u = uniq("u")
    witness = Witness(mosquitto.port)
    try:
        # Outside the topic filters, outside write_topics, or not a plain topic: 403 naming the
        # channel, and nothing reaches the MQTT broker.
        for ch in ["pt:elsewhere.valve", f"pt:plant.{u}.pv", "pt:plant"]:
            r = publish(srv, ch, 1)
            assert r.status == 403, (ch, r.status, r.body)
            assert ch in r.json()["error"]["message"], r.body
        # The command line understands a write's answer: exit 0, the device's answer printed.
        cli = subprocess.run([switchboard_bin, "publish", f"pt:plant.{u}.sp", "5", "--url", srv.http_url],
                             capture_output=True, text=True, timeout=30)
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout) == {"written": True, "source": "plant"}, cli.stdout
        wait_until("the permitted write", lambda: witness.topics(f"plant/{u}/sp"))
        time.sleep(0.5)
        assert witness.topics("elsewhere/") == [] and witness.topics(f"plant/{u}/pv") == []
        assert witness.topics("plant") == [f"plant/{u}/sp"], witness.topics("plant")
    finally:
        witness.close()


def test_device_bad_marker_carries_the_last_value_the_node_accepted(start_server, tmp_path):
    mq = Mosquitto(tmp_path).start()
    try:
        srv = start(start_server, tmp_path, mq, ["plant/#"], node_extra="[limits]\nmax_publication_bytes = 2048\n")
        u = uniq("u")
        ch, other = f"pt:plant.{u}.level", f"pt:plant.{u}.other"
        dev = Device(mq.port)
        with WS(srv.ws_url) as ws:
            ws.subscribe([ch, other])
            assert first_value(ws, ch, lambda: dev.publish(f"plant/{u}/level", "5"), "the first value") == 5
            dev.publish(f"plant/{u}/other", "6")
            ws.pubs(other, 1)
            # Too large for the node: refused there, the channel keeps 5.
            dev.publish(f"plant/{u}/level", '"' + "x" * 4096 + '"')
            wait_until("the node refused it", lambda: refused(srv, "node") >= 1)
            dev.close()
            mq.stop()
            marks = {}
            for want in (ch, other):
                marks[want] = ws.pubs(want, 1)[0]["data"]
        assert (marks[ch]["v"], marks[ch]["q"]) == (5, "bad"), marks[ch]
        assert (marks[other]["v"], marks[other]["q"]) == (6, "bad"), marks[other]
        assert last_data(srv, ch)["q"] == "bad"
    finally:
        mq.stop()


def test_device_two_deployments_on_one_broker_keep_their_own_client_ids(start_server, tmp_path, mosquitto):
    def deployment(cluster: str | None, client_id: str | None):
        source = mqtt_source(mosquitto, "plant", ["plant/#"], "unused")
        source = source.replace('client_id = "unused"', f'client_id = "{client_id}"' if client_id else "")
        head = f'cluster_name = "{cluster}"\n' if cluster else ""
        return start_server("--config", write_config(tmp_path, head, source))

    # Distinct cluster names: distinct default client ids, both stay connected.
    staging, production = deployment(f"staging-{uniq()}", None), deployment(f"prod-{uniq()}", None)
    for srv in (staging, production):
        wait_until("connected", lambda srv=srv: "MQTT connected" in srv.stderr_tail(20000))
    time.sleep(3)
    for srv in (staging, production):
        assert "MQTT connection lost" not in srv.stderr_tail(20000), srv.stderr_tail(3000)
    # One client id given to both: the broker drops the older connection each time the other
    # connects, and the log says why, naming the id.
    shared = uniq("shared-")
    a, b = deployment(None, shared), deployment(None, shared)
    said = "another client is probably connected with this client id"
    wait_until("the take-over loop warned about", lambda: said in a.stderr_tail(50000) + b.stderr_tail(50000),
               limit=60.0)
    assert shared in (a.stderr_tail(50000) + b.stderr_tail(50000))
