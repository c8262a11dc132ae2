"""Historical values of sources (docs/sources.md, "Historical values"): an edge node's
store-and-forward backlog (Sparkplug B metrics flagged `is_historical`, older than the values it
published live) is published as historical publications: each takes the channel's next offset and
lands in history marked `"hist": true` and in the trend at its own timestamp (last by time), while
the channel's last value stays the newest live one. A conflating channel's live subscribers are
not sent them; a channel without conflation's are, marked. A value older than every trend tier's
reach is in history only; one on a channel whose namespace keeps neither history nor trend is
refused and counted.

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


def history(srv: sb.Server, channel: str) -> list[dict]:
    r = api_get(srv, f"/api/channels/{ch_path(channel)}/history?limit=100")
    assert r.status == 200, r.text
    return r.json()["publications"]


@pytest.mark.parametrize("broker", ["memory", "redis"])
def test_historical_backlog_lands_in_history_and_trends_at_its_time_and_never_as_the_last(
        start_server, redis_url, tmp_path, mosquitto, broker):
    if spb is None:
        pytest.fail("pysparkplug is not installed: .venv/bin/pip install --no-deps pysparkplug==0.6.1")
    g, h, k = uniq("G"), uniq("H"), uniq("K")
    config = tmp_path / "historical.toml"
    sources = "".join(f"""
[[sources]]
kind = "mqtt"
name = "{name}"
url = "{mosquitto.url}"
topics = ["spBv1.0/{group}/#"]
channel = "{ns}:{{topic}}"
client_id = "{uniq('sb-')}"
""" for name, group, ns in [("plant", g, "pt"), ("untrended", h, "nt"), ("unkept", k, "nk")])
    config.write_text(sources + """
[namespaces.pt]
history_size = 100
trend_tiers = [{step_s = 1, window_s = 600}, {step_s = 10, window_s = 3600}]

[namespaces.nt]
history_size = 100
trend_window_s = 0

[namespaces.nk]
history_size = 0
trend_window_s = 0
""")
    srv = start_server("--config", str(config), "--broker", redis_url if broker == "redis" else "memory")
    ch, nt, nk = f"pt:{g}.E1.Temp", f"nt:{h}.E1.Temp", f"nk:{k}.E1.Temp"
    edge, other, third = EdgeNode(mosquitto.port, g), EdgeNode(mosquitto.port, h), EdgeNode(mosquitto.port, k)
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
        backlog = [(s + 100, 1.0), (s + 900, 3.0), (s + 500, 2.0), (s + 50, -4.0), (s + 5200, 5.0), (s + 700, 2.5),
                   (now - 7_200_000, 99.0)]
        edge.data(backlog[:3], historical=True)
        edge.data(backlog[3:], historical=True)
        sb.wait_until("the backlog published", lambda: historical_count(srv, "kept") >= 7, 10)
        # The last value is still the newest live one, behind the channel's offset.
        info = last_value(srv, ch)
        assert info["last"]["data"]["v"] == 22.0 and info["offset"] == info["last"]["offset"] + 7, info

        # One more live value: once it is delivered, everything before it was.
        edge.data([(now + 20, 23.0)])
        live.append(23.0)
        got = []
        deadline = time.monotonic() + 10
        while not got or got[-1]["data"]["v"] != 23.0:
            got += ws.pubs(ch, 1, timeout=max(0.01, deadline - time.monotonic()))
        got += [p for p in (m["pub"] for m in ws.drain() if "pub" in m) if p["ch"] == ch]
        assert all(p["data"]["v"] in live and "hist" not in p for p in got), \
            f"a conflating channel's subscriber got a historical value: {got}"

    # The trend: the backlog at its own time, last by time (not by arrival), in both tiers.
    fine = sb.trend(srv, ch, 600, 1)
    assert fine["step_s"] == 1, fine
    buckets = {b["t"]: b for b in fine["buckets"]}
    assert (buckets[s]["n"], buckets[s]["min"], buckets[s]["max"], buckets[s]["last"]) == (5, -4.0, 3.0, 3.0), fine
    assert (buckets[s + 5000]["n"], buckets[s + 5000]["last"]) == (1, 5.0), fine
    assert [b["t"] for b in fine["buckets"] if b["t"] < now - 60_000] == [s, s + 5000], "no bucket anywhere else"
    pubs = history(srv, ch)
    lives = [p for p in pubs if not p.get("hist")]
    assert sum(b["n"] for b in fine["buckets"] if b["t"] >= now - 60_000) == len(lives), (fine, pubs)
    coarse = sb.trend(srv, ch, 3600, 10)
    assert coarse["step_s"] == 10, coarse
    c = next(b for b in coarse["buckets"] if b["t"] == s)
    assert (c["n"], c["min"], c["max"], c["last"]) == (6, -4.0, 5.0, 5.0), coarse
    assert all(b["max"] != 99.0 for b in coarse["buckets"]), "older than every reach: in no tier"

    # History holds every value once in offset order: the live ones, then the backlog as it came,
    # marked, then the last live one (the birth, sent again until the source took it, may be there
    # more than once). The channel's last value is the newest live one.
    assert [p["offset"] for p in pubs] == list(range(pubs[0]["offset"], pubs[0]["offset"] + len(pubs))), pubs
    assert [(p["data"]["v"], p["data"]["t"]) for p in pubs if p.get("hist")] == [(v, t) for t, v in backlog], pubs
    assert set(p["data"]["v"] for p in lives) == set(live) and [p["data"]["v"] for p in lives][-3:] == [21.0, 22.0,
                                                                                                          23.0], pubs
    assert [p["data"]["v"] for p in pubs[-8:]] == [v for _, v in backlog] + [23.0], pubs
    info = last_value(srv, ch)
    assert info["last"]["data"]["v"] == 23.0 and info["offset"] == pubs[-1]["offset"], info

    # A namespace with history and no trend, without conflation: its live subscriber is sent the
    # historical value, marked, and the last value stays.
    sb.wait_until("the untrended birth", lambda: (other.birth(7.0, now), has_last(srv, nt))[1], 20, every=0.5)
    with WS(srv.ws_url) as ws:
        ws.subscribe([nt])
        other.data([(s + 100, 1.0)], historical=True)
        [p] = ws.pubs(nt, 1, timeout=10)
        assert (p["data"]["v"], p["data"]["t"], p.get("hist")) == (1.0, s + 100, True), p
    assert last_value(srv, nt)["last"]["data"]["v"] == 7.0
    assert [(p["data"]["v"], p.get("hist", False)) for p in history(srv, nt)][-1] == (1.0, True)

    # A namespace that keeps neither history nor trend: the backlog has nowhere to go and is
    # refused, not published.
    sb.wait_until("the unkept birth", lambda: (third.birth(9.0, now), has_last(srv, nk))[1], 20, every=0.5)
    third.data([(s + 100, 1.0)], historical=True)
    sb.wait_until("the refusal counted", lambda: historical_count(srv, "refused") >= 1, 10)
    assert last_value(srv, nk)["last"]["data"]["v"] == 9.0
    refused = sb.metric(srv, "switchboard_source_refused_total", source="unkept", kind="mqtt", reason="node")
    assert refused == 1, "the source counts the refusal"
    for e in (edge, other, third):
        e.close()
