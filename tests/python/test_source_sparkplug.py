"""Sparkplug B commands of the MQTT source (docs/sources.md, Sparkplug B) against a real
mosquitto and a real node: a write to a metric's channel becomes an NCMD/DCMD named and typed as
the metric's birth said, a value that does not convert is refused naming the datatype, and an
edge node is asked for a rebirth (once, not once per message) when its birth was not seen or a
`seq` was skipped. A raw MQTT subscriber on `spBv1.0/#` sees what the node publishes.

Values and sessions are checked against an independent implementation: pysparkplug encodes the
edge node's births, data and deaths and decodes the commands the node publishes (every numeric
datatype, negative signed ones, a UInt32 above 2^31, Float 3.14), and `bdSeq` pairs an NDEATH
with the session it ends. pysparkplug is installed without its MQTT client's dependency
(`pip install --no-deps pysparkplug==0.6.1`: its paho-mqtt<2 pin conflicts with the paho-mqtt
2 other tests use); only its payload codec is used here.
"""

from __future__ import annotations

import datetime
import re
import struct
import time

import pytest

import sb
from mqtt_kit import (BOOLEAN, DATETIME, DOUBLE, FLOAT, INT8, INT16, INT32, INT64, STRING, UINT8, UINT16, UINT32,
                      UINT64, Mosquitto, Publisher, Subscriber, decode_sparkplug, metric, sparkplug_payload)
from mqtt_kit import mosquitto  # noqa: F401 (the module's mosquitto, a fixture)
from sb import WS, api_get, ch_path, http, uniq

REBIRTH = "Node Control/Rebirth"


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
    return sb.metric(srv, f"switchboard_{name}", required=True, source="plant", kind="mqtt")


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


# --- Values, commands and sessions with pysparkplug as the edge node -------------------------

try:
    import pysparkplug as spb_lib
except ImportError:  # the tests that need it fail saying so; the others run
    spb_lib = None

UTC = datetime.timezone.utc


@pytest.fixture
def pysparkplug():
    if spb_lib is None:
        pytest.fail("pysparkplug is not installed: .venv/bin/pip install --no-deps pysparkplug==0.6.1")
    return spb_lib


def f32(x: float) -> float:
    """`x` as the nearest 32-bit float, the value a Float carries."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


# (metric name, datatype, value born with, value written back)
NUMERIC = [
    ("i8", INT8, -5, -128),
    ("i16", INT16, -300, -32768),
    ("i32", INT32, -2_000_000_000, -7),
    ("i64", INT64, -9_000_000_000_000, -(2 ** 63)),
    ("u8", UINT8, 250, 255),
    ("u16", UINT16, 65000, 65535),
    ("u32", UINT32, 3_000_000_000, 4_294_967_295),
    ("u64", UINT64, 2 ** 63 + 5, 2 ** 64 - 1),
    ("dt", DATETIME, 1_700_000_000_500, 1_800_000_000_000),
    ("f", FLOAT, 3.14, 3.14),
    ("d", DOUBLE, -0.1, 2.5),
    ("b", BOOLEAN, True, False),
]


def lib_value(dt, v):
    """A value as pysparkplug takes and gives it (DateTime as an aware datetime)."""
    return datetime.datetime.fromtimestamp(v / 1000, UTC) if dt == DATETIME else v


def lib_metric(name, dt, v, alias=None):
    return spb_lib.Metric(timestamp=int(time.time() * 1000), name=name, datatype=spb_lib.DataType(dt),
                          value=lib_value(dt, v), alias=alias)


def bd_seq(n: int):
    return spb_lib.Metric(timestamp=None, name="bdSeq", datatype=spb_lib.DataType.UINT64, value=n)


def channel_last(srv: sb.Server, channel: str, timeout: float = 10.0) -> dict:
    """`last.data` of a channel over HTTP, once it exists."""
    deadline = time.monotonic() + timeout
    while True:
        r = api_get(srv, "/api/channels/" + ch_path(channel))
        if r.status == 200 and r.json().get("last"):
            return r.json()["last"]["data"]
        assert time.monotonic() < deadline, f"{channel}: {r.status} {r.text}"
        time.sleep(0.05)


def test_source_sparkplug_values_and_commands_round_trip_with_pysparkplug(pysparkplug, node, mosquitto, spb):
    g = uniq("G")
    pub = Publisher(mosquitto.port, uniq("edge-"))
    now = int(time.time() * 1000)
    nbirth = spb_lib.NBirth(timestamp=now, seq=0, metrics=(bd_seq(0), *(
        lib_metric(name, dt, born, alias=i + 1) for i, (name, dt, born, _) in enumerate(NUMERIC))))
    pub.publish(f"spBv1.0/{g}/NBIRTH/E1", nbirth.encode(include_dtypes=True))
    dbirth = spb_lib.DBirth(timestamp=now, seq=1, metrics=(lib_metric("Out/i8", INT8, -1, alias=100),
                                                            lib_metric("Out/u32", UINT32, 2 ** 31, alias=101)))
    pub.publish(f"spBv1.0/{g}/DBIRTH/E1/D1", dbirth.encode(include_dtypes=True))

    # Births: each value as born, exactly; a Float as the shortest decimal of its f32.
    for name, dt, born, _ in NUMERIC:
        last = channel_last(node, f"pt:{g}.E1.{name}")
        assert (last["v"], last["q"]) == (born, "good"), (name, last)
        assert type(last["v"]) is type(born), (name, last)
    raw = api_get(node, "/api/channels/" + ch_path(f"pt:{g}.E1.f")).text
    assert re.search(r'"v":3\.14[,}]', raw), raw
    assert channel_last(node, f"pt:{g}.E1.D1.Out.i8")["v"] == -1
    assert channel_last(node, f"pt:{g}.E1.D1.Out.u32")["v"] == 2 ** 31
    # Data by alias, signed values in their own width (pysparkplug's encoding).
    ndata = spb_lib.NData(timestamp=now + 1, seq=2, metrics=(
        spb_lib.Metric(timestamp=now + 1, name=None, alias=1, datatype=spb_lib.DataType(INT8), value=-100),))
    pub.publish(f"spBv1.0/{g}/NDATA/E1", ndata.encode(include_dtypes=True))
    deadline = time.monotonic() + 10
    while channel_last(node, f"pt:{g}.E1.i8")["v"] != -100:
        assert time.monotonic() < deadline, "NDATA never arrived"
        time.sleep(0.05)

    # Writes: each becomes an NCMD that pysparkplug decodes to the value and datatype written.
    for name, dt, _, written in NUMERIC:
        r = write(node, f"pt:{g}.E1.{name}", {"v": written})
        assert r.status == 200 and r.json()["written"] is True, (name, r.body)
    cmds = [spb_lib.NCmd.decode(p) for p in spb.wait_for(f"spBv1.0/{g}/NCMD/E1", len(NUMERIC))]
    got = [(m.name, m.datatype, m.value) for c in cmds for m in c.metrics]
    want = [(name, dt, f32(w) if dt == FLOAT else lib_value(dt, w)) for name, dt, _, w in NUMERIC]
    assert got == want
    for r in (write(node, f"pt:{g}.E1.D1.Out.i8", -128), write(node, f"pt:{g}.E1.D1.Out.u32", 2 ** 32 - 2)):
        assert r.status == 200, r.body
    cmds = [spb_lib.DCmd.decode(p) for p in spb.wait_for(f"spBv1.0/{g}/DCMD/E1/D1", 2)]
    assert [(m.name, m.alias, m.datatype, m.value) for c in cmds for m in c.metrics] == [
        ("Out/i8", 100, INT8, -128), ("Out/u32", 101, UINT32, 2 ** 32 - 2)]
    # Out of range: refused naming the datatype, nothing published.
    for ch, v, dt in ((f"pt:{g}.E1.i8", -129, "Int8"), (f"pt:{g}.E1.u32", 2 ** 32, "UInt32"),
                      (f"pt:{g}.E1.u8", -1, "UInt8")):
        r = write(node, ch, v)
        assert r.status == 400 and dt in r.text, r.body
    time.sleep(0.3)
    assert len(spb.received(f"spBv1.0/{g}/NCMD/E1")) == len(NUMERIC)
    pub.close()


def nothing_went_bad(ws: WS, pub: Publisher, g: str, other: str) -> None:
    """After a death the node must ignore: an NDATA of `other` (alias 2) follows it, so once its
    value shows the death was read, and no value went bad."""
    data = spb_lib.NData(timestamp=int(time.time() * 1000), seq=1, metrics=(
        spb_lib.Metric(timestamp=None, name=None, alias=2, datatype=spb_lib.DataType(INT32), value=-3),))
    pub.publish(f"spBv1.0/{g}/NDATA/E1", data.encode(include_dtypes=True))
    seen, deadline = [], time.monotonic() + 10
    while not seen or seen[-1]["v"] != -3:
        seen.append(ws.pubs(other, 1, timeout=max(0.01, deadline - time.monotonic()))[0]["data"])
    assert all(d["q"] == "good" for d in seen), seen
    assert [m for m in ws.drain() if m.get("pub", {}).get("data", {}).get("q") == "bad"] == []


def wait_bad(ws: WS, channel: str) -> None:
    """Waits for `channel`'s value marked bad (the edge node died)."""
    deadline = time.monotonic() + 10
    while ws.pubs(channel, 1, timeout=max(0.01, deadline - time.monotonic()))[0]["data"]["q"] != "bad":
        pass


def test_source_sparkplug_stale_ndeath_is_ignored_by_bdseq(pysparkplug, node, mosquitto, spb):
    g = uniq("G")
    level, other = f"pt:{g}.E1.Level", f"pt:{g}.E1.Other"
    pub = Publisher(mosquitto.port, uniq("edge-"))

    def birth(bd: int, v: float) -> bytes:
        metrics = (bd_seq(bd), lib_metric("Level", DOUBLE, v, alias=1), lib_metric("Other", INT32, 0, alias=2))
        return spb_lib.NBirth(timestamp=int(time.time() * 1000), seq=0, metrics=metrics).encode(include_dtypes=True)

    def death(bd: int) -> bytes:
        return spb_lib.NDeath(timestamp=int(time.time() * 1000), bd_seq_metric=bd_seq(bd)).encode()

    with WS(node.ws_url) as ws:
        ws.subscribe([level, other])
        # Session 0, then session 1 (a reconnect); the will of session 0 arrives late.
        pub.publish(f"spBv1.0/{g}/NBIRTH/E1", birth(0, 1.0))
        pub.publish(f"spBv1.0/{g}/NBIRTH/E1", birth(1, 2.0))
        wait_value(ws, level, 2.0)
        pub.publish(f"spBv1.0/{g}/NDEATH/E1", death(0))
        nothing_went_bad(ws, pub, g, other)
        last = channel_last(node, level)
        assert (last["v"], last["q"]) == (2.0, "good"), last
        # Still alive: takes commands.
        assert write(node, level, 5.5).status == 200
        spb.wait_for(f"spBv1.0/{g}/NCMD/E1")
        # The current session's NDEATH ends it.
        pub.publish(f"spBv1.0/{g}/NDEATH/E1", death(1))
        wait_bad(ws, level)
    assert channel_last(node, level)["q"] == "bad" and channel_last(node, other)["q"] == "bad"
    # Dead: 503, and nothing is published.
    r = write(node, level, 6.5)
    assert r.status == 503 and "NDEATH" in r.text, r.body
    time.sleep(0.3)
    assert len(spb.received(f"spBv1.0/{g}/NCMD/E1")) == 1
    pub.close()


def test_source_sparkplug_ndeath_numbered_ahead_ends_the_session_a_stale_one_does_not(pysparkplug, node, mosquitto,
                                                                                         spb):
    # pysparkplug 0.6.1's EdgeNode numbers its clean disconnect's NDEATH with the bdSeq it set up
    # for its next connection (its NBIRTH's + 1), as an Int64, and sends no MQTT will then: that
    # death must still take the edge node offline. One behind the NBIRTH's is an earlier session's
    # will, and is ignored.
    g = uniq("G")
    level, other = f"pt:{g}.E1.Level", f"pt:{g}.E1.Other"
    pub = Publisher(mosquitto.port, uniq("edge-"))

    def bd_seq_int64(n: int):
        """The bdSeq metric as pysparkplug's EdgeNode makes it (`_setup_will`)."""
        return spb_lib.Metric(timestamp=int(time.time() * 1000), name="bdSeq", datatype=spb_lib.DataType.INT64,
                              value=n)

    def birth(bd: int, v: float) -> bytes:
        metrics = (lib_metric("Level", DOUBLE, v, alias=1), lib_metric("Other", INT32, 0, alias=2), bd_seq_int64(bd))
        return spb_lib.NBirth(timestamp=int(time.time() * 1000), seq=0, metrics=metrics).encode(include_dtypes=True)

    def death(bd: int) -> bytes:
        # What EdgeNode.disconnect() publishes (it encodes NDEATH without datatypes).
        return spb_lib.NDeath(timestamp=int(time.time() * 1000), bd_seq_metric=bd_seq_int64(bd)).encode()

    with WS(node.ws_url) as ws:
        ws.subscribe([level, other])
        pub.publish(f"spBv1.0/{g}/NBIRTH/E1", birth(4, 1.0))
        wait_value(ws, level, 1.0)

        # One behind (the will of the session before, delivered late): ignored.
        pub.publish(f"spBv1.0/{g}/NDEATH/E1", death(3))
        nothing_went_bad(ws, pub, g, other)
        assert channel_last(node, level)["q"] == "good"
        assert write(node, level, 5.5).status == 200
        spb.wait_for(f"spBv1.0/{g}/NCMD/E1")

        # One ahead, exactly as pysparkplug's clean disconnect sends it: the edge node is offline.
        errors = metric_value(node, "source_decode_errors_total")
        pub.publish(f"spBv1.0/{g}/NDEATH/E1", death(5))
        wait_bad(ws, level)
    assert (channel_last(node, level)["q"], channel_last(node, other)["q"]) == ("bad", "bad")
    r = write(node, level, 6.5)
    assert r.status == 503 and "NDEATH" in r.text, r.body
    time.sleep(0.3)
    assert len(spb.received(f"spBv1.0/{g}/NCMD/E1")) == 1, "a dead edge node is sent no command"
    # Counted (with seq gaps, as a numbering fault of the edge node).
    assert metric_value(node, "source_decode_errors_total") == errors + 1
    # Its next connection's birth (bdSeq 6, pysparkplug's next) brings it back.
    pub.publish(f"spBv1.0/{g}/NBIRTH/E1", birth(6, 7.0))
    deadline = time.monotonic() + 10
    while (last := channel_last(node, level))["q"] != "good" or last["v"] != 7.0:
        assert time.monotonic() < deadline, last
        time.sleep(0.05)
    assert write(node, level, 8.5).status == 200
    pub.close()
