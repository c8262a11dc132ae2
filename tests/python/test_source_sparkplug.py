"""Sparkplug B commands of the MQTT source (docs/sources.md, Sparkplug B) against a real
mosquitto and a real node: a write to a metric's channel becomes an NCMD/DCMD named and typed as
the metric's birth said, a value that does not convert is refused naming the datatype, and an
edge node is asked for a rebirth (once, not once per message) when its birth was not seen or a
`seq` was skipped. A raw MQTT subscriber on `spBv1.0/#` sees what the node publishes.
"""

from __future__ import annotations

import re
import time

import pytest

import sb
from mqtt_kit import (BOOLEAN, DOUBLE, INT32, STRING, Mosquitto, Publisher, Subscriber, decode_sparkplug,
                      metric, sparkplug_payload)
from sb import WS, http, uniq

REBIRTH = "Node Control/Rebirth"


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory):
    m = Mosquitto(tmp_path_factory.mktemp("mosquitto")).start()
    yield m
    m.stop()


@pytest.fixture
def node(start_server, tmp_path, mosquitto):
    """A node whose source `plant` reads `plant/#` and `spBv1.0/#`, and whose `pt` channels are
    written through it; returned once a probe value has come through."""
    path = tmp_path / "sparkplug.toml"
    path.write_text(f"""
[[sources]]
kind = "mqtt"
name = "plant"
url = "{mosquitto.url}"
topics = ["plant/#", "spBv1.0/#"]
channel = "pt:{{topic}}"
client_id = "{uniq('sb-')}"

[namespaces.pt]
client_publish = true
write_source = "plant"
""")
    srv = start_server("--config", str(path))
    probe = f"plant/probe/{uniq()}"
    pub = Publisher(mosquitto.port, uniq("probe-"))
    with WS(srv.ws_url) as ws:
        ws.subscribe(["pt:" + probe.replace("/", ".")])
        deadline = time.monotonic() + 20
        while True:
            pub.publish(probe, "1")
            try:
                ws.pubs("pt:" + probe.replace("/", "."), 1, timeout=0.3)
                break
            except TimeoutError:
                assert time.monotonic() < deadline, "the source never delivered"
    pub.close()
    return srv


@pytest.fixture
def spb(mosquitto):
    """A raw subscriber of everything Sparkplug on the MQTT broker."""
    sub = Subscriber(mosquitto.port, "spBv1.0/#", uniq("spb-"))
    yield sub
    sub.close()


def metric_value(srv: sb.Server, name: str) -> float:
    text = http("GET", srv.http_url + "/metrics").text
    m = re.search(rf'^switchboard_{name}{{source="plant",kind="mqtt"}} (\S+)$', text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def write(srv: sb.Server, channel: str, data) -> sb.HttpResponse:
    return http("POST", srv.http_url + "/api/publish", {"channel": channel, "data": data})


def wait_value(ws: WS, channel: str, v, timeout: float = 10.0) -> None:
    """Waits until `channel` shows `v` (`pt` is conflated: values in between may be skipped)."""
    deadline = time.monotonic() + timeout
    while ws.pubs(channel, 1, timeout=max(0.01, deadline - time.monotonic()))[0]["data"]["v"] != v:
        pass


def rebirths(sub: Subscriber, group: str, edge: str) -> list[dict]:
    """The rebirth requests the subscriber saw for an edge node."""
    out = []
    for _, payload in sub.received(f"spBv1.0/{group}/NCMD/{edge}"):
        metrics = decode_sparkplug(payload)["metrics"]
        out.extend(m for m in metrics if m.get("name") == REBIRTH)
    return out


def births(pub: Publisher, g: str) -> None:
    """NBIRTH of edge node E1 (seq 0) and DBIRTH of its device D1 (seq 1)."""
    pub.publish(f"spBv1.0/{g}/NBIRTH/E1", sparkplug_payload([
        metric("bdSeq", None, 8, 0),
        metric("Set Point", 1, DOUBLE, 20.0),
    ], timestamp=1700000000000, seq=0))
    pub.publish(f"spBv1.0/{g}/DBIRTH/E1/D1", sparkplug_payload([
        metric("Outputs/Speed", 2, INT32, 0),
        metric("Enable", 3, BOOLEAN, False),
        metric("Mode", None, STRING, "auto"),
    ], timestamp=1700000000001, seq=1))


def test_source_sparkplug_writes_become_commands_typed_as_the_birth(node, mosquitto, spb):
    g = uniq("G")
    speed, enable, mode, setpoint = (f"pt:{g}.E1.D1.Outputs.Speed", f"pt:{g}.E1.D1.Enable", f"pt:{g}.E1.D1.Mode",
                                     f"pt:{g}.E1.Set_Point")
    pub = Publisher(mosquitto.port, uniq("edge-"))
    with WS(node.ws_url) as ws:
        ws.subscribe([speed, enable, mode, setpoint])
        births(pub, g)
        for ch in (speed, enable, mode, setpoint):
            ws.pubs(ch, 1, timeout=10)

    # (a) A device metric: DCMD with the birth's name, alias and datatype, the value converted.
    r = write(node, speed, {"v": 1500, "t": 1})
    assert r.status == 200 and r.json() == {"written": True, "source": "plant"}, r.body
    cmd = decode_sparkplug(spb.wait_for(f"spBv1.0/{g}/DCMD/E1/D1")[0])
    assert "seq" not in cmd and cmd["timestamp"] > 1700000000000
    assert [{k: m.get(k) for k in ("name", "alias", "datatype", "value")} for m in cmd["metrics"]] == [
        {"name": "Outputs/Speed", "alias": 2, "datatype": INT32, "value": 1500}]
    assert write(node, enable, True).status == 200
    assert write(node, mode, "manual").status == 200
    cmds = [decode_sparkplug(p)["metrics"][0] for p in spb.wait_for(f"spBv1.0/{g}/DCMD/E1/D1", 3)]
    assert [(m["name"], m.get("alias"), m["datatype"], m["value"]) for m in cmds[1:]] == [
        ("Enable", 3, BOOLEAN, True), ("Mode", None, STRING, "manual")]
    # A node metric: NCMD to the edge node, named as born ("Set Point", not the channel's "Set_Point").
    assert write(node, setpoint, 21).status == 200
    m = decode_sparkplug(spb.wait_for(f"spBv1.0/{g}/NCMD/E1")[0])["metrics"][0]
    assert (m["name"], m["alias"], m["datatype"], m["value"]) == ("Set Point", 1, DOUBLE, 21.0)

    # (b) Values that do not convert: 400 naming the datatype, nothing published.
    r = write(node, speed, "fast")
    assert r.status == 400 and "Int32" in r.text, r.body
    r = write(node, speed, 2 ** 31)
    assert r.status == 400 and "Int32" in r.text, r.body
    r = write(node, enable, "yes")
    assert r.status == 400 and "Boolean" in r.text, r.body
    time.sleep(0.3)
    assert len(spb.received(f"spBv1.0/{g}/DCMD/E1/D1")) == 3, "refused writes publish nothing"

    # A dead device takes no commands until it is born again.
    pub.publish(f"spBv1.0/{g}/DDEATH/E1/D1", sparkplug_payload([], timestamp=1700000000002, seq=2))
    deadline = time.monotonic() + 10
    while (r := write(node, speed, 1)).status == 200:
        assert time.monotonic() < deadline, "the death never arrived"
        time.sleep(0.05)
    assert r.status == 503 and "DDEATH" in r.text, r.body
    time.sleep(0.5)
    pub.close()
    # Births in order and no gap: no rebirth was asked for.
    assert rebirths(spb, g, "E1") == []
    assert metric_value(node, "source_rebirths_total") == 0
    assert metric_value(node, "source_writes_total") >= 4


def test_source_sparkplug_data_without_birth_asks_for_one_rebirth(node, mosquitto, spb):
    # (c) NDATA from an edge node whose birth the node never saw: values are published by name,
    # and the edge node is asked for a rebirth once, not once per message.
    g = uniq("G")
    ch = f"pt:{g}.E9.Level"
    pub = Publisher(mosquitto.port, uniq("edge-"))
    with WS(node.ws_url) as ws:
        ws.subscribe([ch])
        for seq in range(5):
            pub.publish(f"spBv1.0/{g}/NDATA/E9", sparkplug_payload([metric("Level", None, DOUBLE, 1.0 + seq)],
                                                                   seq=seq))
        wait_value(ws, ch, 5.0)
    spb.wait_for(f"spBv1.0/{g}/NCMD/E9")
    time.sleep(1.0)
    asked = rebirths(spb, g, "E9")
    assert len(asked) == 1, asked
    assert asked[0]["datatype"] == BOOLEAN and asked[0]["value"] is True
    assert metric_value(node, "source_rebirths_total") == 1
    # Until it is born, its metrics take no commands: 503 saying why.
    r = write(node, ch, 3.5)
    assert r.status == 503 and "no birth" in r.text, r.body
    pub.close()


def test_source_sparkplug_seq_gap_asks_for_a_rebirth(node, mosquitto, spb):
    # (d) seq 0 (NBIRTH), 1, then 3: seq 2 was lost.
    g = uniq("G")
    ch = f"pt:{g}.E1.Set_Point"
    pub = Publisher(mosquitto.port, uniq("edge-"))
    errors = metric_value(node, "source_decode_errors_total")
    with WS(node.ws_url) as ws:
        ws.subscribe([ch])
        pub.publish(f"spBv1.0/{g}/NBIRTH/E1", sparkplug_payload([metric("Set Point", 1, DOUBLE, 1.0)], seq=0))
        pub.publish(f"spBv1.0/{g}/NDATA/E1", sparkplug_payload([metric(alias=1, value=2.0)], seq=1))
        wait_value(ws, ch, 2.0)
        time.sleep(0.5)
        assert rebirths(spb, g, "E1") == [], "in order: no rebirth"
        pub.publish(f"spBv1.0/{g}/NDATA/E1", sparkplug_payload([metric(alias=1, value=4.0)], seq=3))
        wait_value(ws, ch, 4.0)  # the message after the gap still counts
    spb.wait_for(f"spBv1.0/{g}/NCMD/E1")
    assert len(rebirths(spb, g, "E1")) == 1
    assert metric_value(node, "source_decode_errors_total") == errors + 1, "the gap is counted"
    assert metric_value(node, "source_rebirths_total") == 1
    # The rebirth starts the count again: a fresh NBIRTH at any seq, then in order.
    pub.publish(f"spBv1.0/{g}/NBIRTH/E1", sparkplug_payload([metric("Set Point", 1, DOUBLE, 5.0)], seq=0))
    pub.publish(f"spBv1.0/{g}/NDATA/E1", sparkplug_payload([metric(alias=1, value=6.0)], seq=1))
    time.sleep(0.5)
    assert metric_value(node, "source_decode_errors_total") == errors + 1
    pub.close()
