"""Devices cannot loop the MQTT source (docs/sources.md "Refused input"): against a real
mosquitto, with paho-mqtt as the device (an MQTT implementation independent of the node's):

- a QoS 1 message over 1 MiB on the source's default persistent session, live and queued while
  the node was away, is acknowledged, counted (`reason="oversized"`) and logged with its topic
  and size; the source never reconnects over it, later messages on that topic and others
  arrive, bystander channels stay good, and the node's open files and connections return to
  their baseline;
- topics that give no channel name are counted (`reason="topic"`) and warned about without
  flooding the log;
- the channels a source feeds and the Sparkplug B metrics and aliases it keeps are bounded
  (`max_channels`): past the bound new ones are refused and counted (`reason="bound"`), the
  ones it has carry on, and no rebirth is asked for what the bound refused.
"""

from __future__ import annotations

import functools
import os
import re
import time

import paho.mqtt.client as paho

import sb
from mqtt_kit import INT32, Mosquitto, metric, sparkplug_payload
from mqtt_kit import mosquitto  # noqa: F401 (the module's mosquitto, a fixture)
from sb import WS, api_get, ch_path, uniq

BIG = 2 * 1024 * 1024 + 17


class Device:
    """A paho-mqtt client (MQTT 3.1.1) publishing with QoS 1: `publish` returns once the broker
    acknowledged the message."""

    def __init__(self, port: int):
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=uniq("dev-"),
                                  protocol=paho.MQTTv311)
        self.client.connect("127.0.0.1", port, keepalive=30)
        self.client.loop_start()
        deadline = time.monotonic() + 10
        while not self.client.is_connected():
            assert time.monotonic() < deadline, "the device never connected"
            time.sleep(0.02)

    def publish(self, topic: str, payload: bytes | str) -> None:
        info = self.client.publish(topic, payload, qos=1)
        info.wait_for_publish(timeout=20)
        assert info.is_published(), f"the broker did not acknowledge {topic}"

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def write_config(tmp_path, *sources: str) -> str:
    path = tmp_path / f"sources-{uniq()}.toml"
    path.write_text("\n".join(sources))
    return str(path)


def mqtt_source(mq: Mosquitto, name: str, topics: list[str], client_id: str, extra: str = "") -> str:
    quoted = ", ".join(f'"{t}"' for t in topics)
    return f"""
[[sources]]
kind = "mqtt"
name = "{name}"
url = "{mq.url}"
topics = [{quoted}]
channel = "pt:{{topic}}"
client_id = "{client_id}"
{extra}
"""


def metric_value(srv: sb.Server, name: str, source: str = "plant", reason: str | None = None) -> float:
    """A source's series in /metrics; 0 for a refusal reason never counted."""
    labels = {"reason": reason} if reason else {}
    return sb.metric(srv, f"switchboard_{name}", required=reason is None, source=source, kind="mqtt", **labels)


def refused(srv: sb.Server, reason: str, source: str = "plant") -> float:
    return metric_value(srv, "source_refused_total", source, reason)


wait_until = functools.partial(sb.wait_until, limit=20.0)


def wait_connected(srv: sb.Server, source: str = "plant") -> None:
    """Waits until `source` is connected to its MQTT broker: a write to it before then is a 503
    by design (`source unavailable`)."""
    wait_until(f"{source} connected", lambda: metric_value(srv, "source_connected", source) == 1)


def last_data(srv: sb.Server, ch: str):
    """The data of the channel's last publication, or None for a channel never published."""
    r = api_get(srv, "/api/channels/" + ch_path(ch))
    if r.status == 404:
        return None
    assert r.status == 200, (r.status, r.text)
    last = r.json().get("last")
    return last and last["data"]


def channel(topic: str) -> str:
    return "pt:" + topic.replace("/", ".")


def flowing(srv: sb.Server, dev: Device, prefix: str) -> None:
    """Waits until a value the device publishes under `prefix` reaches the node (the source is
    connected and subscribed)."""
    topic = f"{prefix}/probe/{uniq()}"
    deadline = time.monotonic() + 20
    while last_data(srv, channel(topic)) is None:
        assert time.monotonic() < deadline, "the source never delivered"
        dev.publish(topic, "1")
        time.sleep(0.2)


def open_files(srv: sb.Server) -> int:
    return len(os.listdir(f"/proc/{srv.pid}/fd"))


def connections(srv: sb.Server) -> int:
    return api_get(srv, "/api/info").json()["connections"]


def steady_without_reconnects(srv: sb.Server, reconnects: float, seconds: float = 4.0) -> None:
    """Over `seconds`, the source stays connected and never reconnects."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert metric_value(srv, "source_reconnects_total") == reconnects, "the source reconnected"
        assert metric_value(srv, "source_connected") == 1, "the source is not connected"
        time.sleep(0.25)


def refusal_logged(srv: sb.Server, topic: str, at_least: int) -> bool:
    """A warning of a refused message of `topic` whose size is at least `at_least` bytes."""
    for line in srv.stderr_tail(200_000).splitlines():
        size = re.search(r"\bsize=(\d+)", line)
        if "WARN" in line and "MQTT message refused" in line and topic in line and size:
            if int(size.group(1)) >= at_least:
                return True
    return False


def test_fault_mqtt_oversized_qos1_message_is_refused_without_a_reconnect(start_server, tmp_path, mosquitto):
    u = uniq()
    cfg = write_config(tmp_path, mqtt_source(mosquitto, "plant", [f"plant/{u}/#"], uniq("sb-")))
    srv = start_server("--config", cfg)
    dev = Device(mosquitto.port)
    flowing(srv, dev, f"plant/{u}")
    base_files, base_conns = open_files(srv), connections(srv)
    big, other = f"plant/{u}/big", f"plant/{u}/other"
    bystanders = [f"plant/{u}/bystander{i}" for i in range(3)]
    for t in [big, other, *bystanders]:
        dev.publish(t, "1")
    for t in [big, other, *bystanders]:
        wait_until(f"{t} published", lambda t=t: last_data(srv, channel(t)) is not None)
    reconnects = metric_value(srv, "source_reconnects_total")
    assert refused(srv, "oversized") == 0
    node_bystander = sb.Bystander(srv)

    with WS(srv.ws_url) as ws:
        ws.subscribe([channel(big), channel(other), *map(channel, bystanders)])
        dev.publish(big, b"x" * BIG)
        dev.publish(big, "2")
        dev.publish(other, "3")
        # The next publication of the topic is the message after the big one.
        assert ws.pubs(channel(big), 1, timeout=10)[0]["data"]["v"] == 2
        assert ws.pubs(channel(other), 1, timeout=10)[0]["data"]["v"] == 3
        wait_until("the oversized message counted", lambda: refused(srv, "oversized") == 1)
        steady_without_reconnects(srv, reconnects)
        dev.publish(big, "4")
        assert ws.pubs(channel(big), 1, timeout=10)[0]["data"]["v"] == 4
        node_bystander.check()
        # No bad marker (a connection drop) reached any channel the source feeds.
        late = [m["pub"] for m in ws.drain(0.5) if "pub" in m]
        assert all(p["data"]["q"] == "good" for p in late), late
    for t in bystanders:
        d = last_data(srv, channel(t))
        assert (d["v"], d["q"]) == (1, "good"), (t, d)
    assert refused(srv, "oversized") == 1, "refused once: the broker never delivered it again"
    assert metric_value(srv, "source_reconnects_total") == reconnects
    assert wait_until("the warning", lambda: refusal_logged(srv, big, BIG))

    node_bystander.close()
    dev.close()
    wait_until("open files back to the baseline", lambda: open_files(srv) <= base_files)
    wait_until("connections back to the baseline", lambda: connections(srv) == base_conns)


def test_fault_mqtt_oversized_message_queued_for_the_session_is_refused_once_on_resume(
        start_server, tmp_path, mosquitto):
    u = uniq()
    cfg = write_config(tmp_path, mqtt_source(mosquitto, "plant", [f"plant/{u}/#"], uniq("sb-")))
    first = start_server("--config", cfg)
    dev = Device(mosquitto.port)
    flowing(first, dev, f"plant/{u}")
    # A clean stop keeps the persistent session: mosquitto queues QoS 1 messages for it.
    first.terminate()
    first.proc.wait(timeout=15)
    big, other = f"plant/{u}/big", f"plant/{u}/other"
    dev.publish(big, b"y" * BIG)
    dev.publish(big, "after")
    dev.publish(other, "after")

    srv = start_server("--config", cfg)
    wait_until("the queued messages after the big one", lambda: (last_data(srv, channel(big)) or {}).get("v") == "after")
    wait_until("the other topic", lambda: (last_data(srv, channel(other)) or {}).get("v") == "after")
    assert refused(srv, "oversized") == 1
    steady_without_reconnects(srv, 0)
    dev.publish(other, "live")
    wait_until("a live message", lambda: (last_data(srv, channel(other)) or {}).get("v") == "live")
    assert refused(srv, "oversized") == 1, "the broker did not deliver it again"
    assert metric_value(srv, "source_reconnects_total") == 0
    dev.close()


def test_fault_mqtt_unmappable_topics_are_counted_and_warned_without_flooding_the_log(
        start_server, tmp_path, mosquitto):
    u = uniq()
    cfg = write_config(tmp_path, mqtt_source(mosquitto, "plant", [f"plant/{u}/#"], uniq("sb-")))
    srv = start_server("--config", cfg)
    dev = Device(mosquitto.port)
    flowing(srv, dev, f"plant/{u}")
    bad = [f"plant/{u}/line {i}" for i in range(40)] + [f"plant/{u}/température", f"plant/{u}/a$b"]
    for t in bad:
        dev.publish(t, "1")
    wait_until("every unmappable topic counted", lambda: refused(srv, "topic") == len(bad))
    dev.publish(f"plant/{u}/fine", "5")
    wait_until("a good topic after them", lambda: (last_data(srv, f"pt:plant.{u}.fine") or {}).get("v") == 5)
    warnings = [line for line in srv.stderr_tail(200_000).splitlines()
                if "WARN" in line and "MQTT message refused" in line and 'reason="topic"' in line]
    assert 1 <= len(warnings) < len(bad) // 4, warnings
    assert metric_value(srv, "source_reconnects_total") == 0
    dev.close()


def test_fault_mqtt_channels_and_sparkplug_state_are_bounded(start_server, tmp_path, mosquitto):
    u, g = uniq(), uniq("G")
    cfg = write_config(
        tmp_path,
        mqtt_source(mosquitto, "plant", [f"plant/{u}/#"], uniq("sb-"), "max_channels = 4"),
        mqtt_source(mosquitto, "spb", [f"spBv1.0/{g}/#"], uniq("sb-"), "max_channels = 3"),
    )
    srv = start_server("--config", cfg)
    dev = Device(mosquitto.port)
    flowing(srv, dev, f"plant/{u}")  # the probe is the first of the four channels
    # The Sparkplug source hears commands (and ignores them): one heard means it is subscribed.
    deadline = time.monotonic() + 20
    while metric_value(srv, "source_messages_total", "spb") == 0:
        assert time.monotonic() < deadline, "the Sparkplug source never subscribed"
        dev.publish(f"spBv1.0/{g}/NCMD/probe", b"")
        time.sleep(0.2)

    # Plain topics: three more channels fit, the next two are refused; fed ones carry on.
    topics = [f"plant/{u}/t{i}" for i in range(5)]
    for t in topics:
        dev.publish(t, "1")
    wait_until("the refusals counted", lambda: refused(srv, "bound") == 2)
    for t in topics[:3]:
        wait_until(f"{t} fed", lambda t=t: last_data(srv, channel(t)) is not None)
    assert [last_data(srv, channel(t)) for t in topics[3:]] == [None, None], "never published"
    dev.publish(topics[0], "9")
    wait_until("a fed channel carries on", lambda: last_data(srv, channel(topics[0]))["v"] == 9)
    assert refused(srv, "bound") == 2

    # Sparkplug B: a birth of five metrics keeps three; data naming a refused alias is refused
    # too and asks for no rebirth (another birth would meet the same bound).
    birth = sparkplug_payload([metric(f"m{i}", alias=i, datatype=INT32, value=i) for i in range(1, 6)], seq=0)
    dev.publish(f"spBv1.0/{g}/NBIRTH/E1", birth)
    paths = [f"pt:{g}.E1.m{i}" for i in range(1, 6)]
    wait_until("the birth", lambda: all(last_data(srv, p) is not None for p in paths[:3]))
    wait_until("metrics past the bound counted", lambda: refused(srv, "bound", "spb") == 2)
    data = sparkplug_payload([metric(alias=1, value=11, datatype=INT32), metric(alias=5, value=55, datatype=INT32)],
                             seq=1)
    dev.publish(f"spBv1.0/{g}/NDATA/E1", data)
    wait_until("data by a kept alias", lambda: last_data(srv, paths[0])["v"] == 11)
    wait_until("data by a refused alias counted", lambda: refused(srv, "bound", "spb") == 3)
    assert [last_data(srv, p) for p in paths[3:]] == [None, None]
    assert metric_value(srv, "source_rebirths_total", "spb") == 0
    assert refused(srv, "bound") == 2, "each source counts its own"
    assert any("WARN" in line and 'reason="bound"' in line and "Sparkplug B metrics" in line
               for line in srv.stderr_tail(200_000).splitlines())
    dev.close()
