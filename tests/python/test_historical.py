"""Historical values of sources (docs/sources.md, "Historical values"): an edge node's
store-and-forward backlog (Sparkplug B metrics flagged `is_historical`, older than the values it
published live) lands in the channel's trend at its own timestamps, with `last` the last by time,
while live subscribers, the channel's last value and its history keep only the live values. A
value older than every trend tier's reach is dropped and counted; one on a channel whose
namespace keeps no trend is refused and counted.

A real node with an MQTT source on a real mosquitto; pysparkplug encodes the edge node's
payloads (`pip install --no-deps pysparkplug==0.6.1`: only its codec is used), paho-mqtt
publishes them with QoS 1, Python `websockets` (through sb.WS) is the live subscriber. On the
memory broker and on a real redis-server.
"""

from __future__ import annotations

import time

import paho.mqtt.client as paho
import pytest

import sb
from mqtt_kit import DOUBLE
from mqtt_kit import mosquitto  # noqa: F401 (the module's mosquitto, a fixture)
from sb import WS, api_get, ch_path, uniq

try:
    import pysparkplug as spb
except ImportError:  # the test fails saying so
    spb = None


class EdgeNode:
    """A Sparkplug B edge node: paho-mqtt (MQTT 3.1.1) publishing pysparkplug payloads with QoS 1,
    each acknowledged by the broker before the next; `seq` counted per message."""

    def __init__(self, port: int, group: str):
        self.group, self.seq = group, 0
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=uniq("edge-"),
                                  protocol=paho.MQTTv311)
        self.client.connect("127.0.0.1", port, keepalive=30)
        self.client.loop_start()
        sb.wait_until("the edge node to connect", self.client.is_connected, 10)

    def send(self, kind: str, payload) -> None:
        info = self.client.publish(f"spBv1.0/{self.group}/{kind}/E1", payload.encode(include_dtypes=True), qos=1)
        info.wait_for_publish(timeout=20)
        assert info.is_published(), kind
        self.seq = (self.seq + 1) % 256

    def birth(self, v: float, t: int) -> None:
        """An NBIRTH (`seq` 0: a birth starts the count again) with the metric `Temp`, alias 1."""
        self.seq = 0
        metrics = (spb.Metric(timestamp=None, name="bdSeq", datatype=spb.DataType.UINT64, value=0),
                   spb.Metric(timestamp=t, name="Temp", alias=1, datatype=spb.DataType(DOUBLE), value=v))
        self.send("NBIRTH", spb.NBirth(timestamp=t, seq=self.seq, metrics=metrics))

    def data(self, values: list[tuple[int, float]], historical: bool = False) -> None:
        """One NDATA with a metric per `(t, v)`, named by alias."""
        metrics = tuple(spb.Metric(timestamp=t, name=None, alias=1, datatype=spb.DataType(DOUBLE), value=v,
                                   is_historical=historical) for t, v in values)
        self.send("NDATA", spb.NData(timestamp=int(time.time() * 1000), seq=self.seq, metrics=metrics))

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def historical_count(srv: sb.Server, outcome: str) -> float:
    return sb.metric(srv, "switchboard_source_historical_total", required=True, outcome=outcome)


def has_last(srv: sb.Server, channel: str) -> bool:
    """Whether the channel has a publication (a subscriber's starting point makes it exist)."""
    r = api_get(srv, f"/api/channels/{ch_path(channel)}")
    return r.status == 200 and bool(r.json().get("last"))


def last_value(srv: sb.Server, channel: str) -> dict:
    r = api_get(srv, f"/api/channels/{ch_path(channel)}")
    assert r.status == 200, r.text
    return r.json()


@pytest.mark.parametrize("broker", ["memory", "redis"])
def test_historical_backlog_lands_in_trends_at_its_time_and_never_live(start_server, redis_url, tmp_path, mosquitto,
                                                                      broker):
    if spb is None:
        pytest.fail("pysparkplug is not installed: .venv/bin/pip install --no-deps pysparkplug==0.6.1")
    g, h = uniq("G"), uniq("H")
    config = tmp_path / "historical.toml"
    config.write_text(f"""
[[sources]]
kind = "mqtt"
name = "plant"
url = "{mosquitto.url}"
topics = ["spBv1.0/{g}/#"]
channel = "pt:{{topic}}"
client_id = "{uniq('sb-')}"

[[sources]]
kind = "mqtt"
name = "untrended"
url = "{mosquitto.url}"
topics = ["spBv1.0/{h}/#"]
channel = "nt:{{topic}}"
client_id = "{uniq('sb-')}"

[namespaces.pt]
history_size = 100
trend_tiers = [{{step_s = 1, window_s = 600}}, {{step_s = 10, window_s = 3600}}]

[namespaces.nt]
history_size = 100
trend_window_s = 0
""")
    srv = start_server("--config", str(config), "--broker", redis_url if broker == "redis" else "memory")
    ch, nt = f"pt:{g}.E1.Temp", f"nt:{h}.E1.Temp"
    edge = EdgeNode(mosquitto.port, g)
    other = EdgeNode(mosquitto.port, h)
    with WS(srv.ws_url) as ws:
        ws.subscribe([ch])
        # Born (again until the source, subscribing, takes it), then live values, each waited
        # for.
        now = int(time.time() * 1000)
        sb.wait_until("the source to take the birth", lambda: (edge.birth(20.0, now), has_last(srv, ch))[1], 20,
                      every=0.5)
        live = [20.0]
        for i, v in enumerate([21.0, 22.0]):
            edge.data([(now + 10 + i, v)])
            live.append(v)
            sb.wait_until(f"live value {v}", lambda v=v: last_value(srv, ch)["last"]["data"]["v"] == v, 10)

        # The backlog of the time the edge node was cut off, older than the live values: two
        # messages whose values share buckets, out of order within them, and one value older than
        # every tier's reach.
        s = (now - 120_000) - (now - 120_000) % 10_000
        edge.data([(s + 100, 1.0), (s + 900, 3.0), (s + 500, 2.0)], historical=True)
        edge.data([(s + 50, -4.0), (s + 5200, 5.0), (s + 700, 2.5), (now - 7_200_000, 99.0)], historical=True)
        sb.wait_until("the backlog merged", lambda: historical_count(srv, "kept") + historical_count(
            srv, "dropped") >= 7, 10)
        assert (historical_count(srv, "kept"), historical_count(srv, "dropped")) == (6, 1)

        # One more live value: once it is delivered, everything before it was.
        edge.data([(now + 20, 23.0)])
        live.append(23.0)
        got = []
        deadline = time.monotonic() + 10
        while not got or got[-1] != 23.0:
            got += [p["data"]["v"] for p in ws.pubs(ch, 1, timeout=max(0.01, deadline - time.monotonic()))]
        got += [p["data"]["v"] for p in (m["pub"] for m in ws.drain() if "pub" in m) if p["ch"] == ch]
        assert set(got) <= set(live), f"a live subscriber got a historical value: {got}"

    # The trend: the backlog at its own time, last by time (not by arrival), in both tiers.
    fine = sb.trend(srv, ch, 600, 1)
    assert fine["step_s"] == 1, fine
    buckets = {b["t"]: b for b in fine["buckets"]}
    assert (buckets[s]["n"], buckets[s]["min"], buckets[s]["max"], buckets[s]["last"]) == (5, -4.0, 3.0, 3.0), fine
    assert (buckets[s + 5000]["n"], buckets[s + 5000]["last"]) == (1, 5.0), fine
    assert [b["t"] for b in fine["buckets"] if b["t"] < now - 60_000] == [s, s + 5000], "no bucket anywhere else"
    hist = [p["data"]["v"] for p in api_get(srv, f"/api/channels/{ch_path(ch)}/history?limit=100").json()[
        "publications"]]
    assert sum(b["n"] for b in fine["buckets"] if b["t"] >= now - 60_000) == len(hist), (fine, hist)
    coarse = sb.trend(srv, ch, 3600, 10)
    assert coarse["step_s"] == 10, coarse
    c = next(b for b in coarse["buckets"] if b["t"] == s)
    assert (c["n"], c["min"], c["max"], c["last"]) == (6, -4.0, 5.0, 5.0), coarse
    assert all(b["max"] != 99.0 for b in coarse["buckets"]), "older than every reach: dropped"

    # The channel's last value is the newest live one, and history holds the live values only
    # (the birth, sent again until the source took it, may be there more than once).
    assert set(hist) == set(live) and hist[-3:] == [21.0, 22.0, 23.0], hist
    info = last_value(srv, ch)
    assert info["last"]["data"]["v"] == 23.0 and info["offset"] == len(hist), info

    # A namespace without trend: the backlog has nowhere to go and is refused, not published.
    sb.wait_until("the untrended birth", lambda: (other.birth(7.0, now), has_last(srv, nt))[1], 20, every=0.5)
    other.data([(s + 100, 1.0)], historical=True)
    sb.wait_until("the refusal counted", lambda: historical_count(srv, "refused") >= 1, 10)
    assert last_value(srv, nt)["last"]["data"]["v"] == 7.0
    untrended = api_get(srv, f"/api/channels/{ch_path(nt)}/history?limit=100").json()["publications"]
    assert {p["data"]["v"] for p in untrended} == {7.0}, untrended
    refused = sb.metric(srv, "switchboard_source_refused_total", source="untrended", kind="mqtt", reason="node")
    assert refused == 1, "the source counts the refusal"
    edge.close()
    other.close()
