"""A Sparkplug B edge node nobody here wrote, against the node as its primary host application
(docs/sources.md, "Sparkplug primary host"): pysparkplug's own `EdgeNode` and MQTT client
(`sparkplug_edge_node.py`, in `.venv-sparkplug`) on a real mosquitto, the node on a real
redis-server that fsyncs every write.

The edge node sends live values while the host says it is online and keeps them while it says
it is offline. redis-server is killed for 10 s: the edge node hears `online: false` within 2 s,
`online: true` once the node can commit again, and then sends what it kept as `is_historical`
metrics. Afterwards the 1 s trend buckets count every value the edge node took (births, live,
historical) at its own time, the channel's last value is the newest live one, and its history
holds the live values, in order, and every historical one once, marked `hist`. A live
subscriber (Python `websockets`), connected throughout, is never sent a historical value: what
it is sent never goes back in time. The edge node's clean disconnect (an NDEATH numbered as
pysparkplug numbers it) marks its value bad, which the subscriber gets last.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

import sb
from mqtt_kit import mosquitto  # noqa: F401 (the module's mosquitto, a fixture)
from redis_kit import Redis
from sb import WS, uniq

EDGE_PY = os.path.join(os.path.dirname(__file__), "..", "..", ".venv-sparkplug", "bin", "python")
EDGE_SCRIPT = os.path.join(os.path.dirname(__file__), "sparkplug_edge_node.py")


class Edge:
    """`sparkplug_edge_node.py` as a process; `events` are its JSON lines as they come."""

    def __init__(self, port: int, group: str, host: str, seconds: float):
        if not os.path.exists(EDGE_PY):
            pytest.fail("no .venv-sparkplug: make py-deps (pysparkplug 0.6.1 with paho-mqtt 1, apart)")
        self.proc = subprocess.Popen([EDGE_PY, EDGE_SCRIPT, str(port), group, "E1", host, str(seconds), "0.1"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events: list[dict] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def states(self) -> list[tuple[bool, float]]:
        return [(e["state"], e["at"]) for e in list(self.events) if "state" in e]

    def wait(self, timeout: float) -> dict:
        self.proc.wait(timeout=timeout)
        self.reader.join(timeout=5)
        done = [e for e in self.events if e.get("done")]
        assert done, f"the edge node did not finish: {self.proc.stderr.read()[-2000:]}"
        return done[0]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Watcher:
    """A live subscriber of `channel`, a screen of its current value, reading in a thread of its
    own until `stop()`: `pubs` are the publications it was sent, and the last value of each
    subscribe again it makes when the node ends its subscription (`unsubscribed` with
    `resubscribe`: after the Redis outage the node cannot tell whether it missed some), every
    half second while that answers 503; `error` is what ended its reading early."""

    def __init__(self, url: str, channel: str):
        self.channel = channel
        self.ws = WS(url)
        self.ws.subscribe([channel])
        self.resubscribed = 0
        self.again_at: float | None = None
        self.pubs: list[dict] = []
        self.error: Exception | None = None
        self.running = threading.Event()
        self.running.set()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while self.running.is_set():
            if self.again_at is not None and time.monotonic() >= self.again_at:
                self.again_at = None
                self.resubscribed += 1
                self.ws.send({"id": 1000 + self.resubscribed, "subscribe": {"channels": [self.channel], "initial": True}})
            try:
                m = self.ws.recv(0.1)
            except TimeoutError:
                continue
            except Exception as e:  # noqa: BLE001 (kept for the test to report)
                self.error = e
                return
            if not isinstance(m, dict):
                continue
            if "pub" in m:
                self.pubs.append(m["pub"])
            elif m.get("unsubscribed", {}).get("resubscribe"):
                self.again_at = time.monotonic()
            elif "ok" in m and (result := m["ok"].get("channels", {}).get(self.channel)):
                if result.get("error", {}).get("code") == 503:
                    self.again_at = time.monotonic() + 0.5
                elif result.get("last"):
                    self.pubs.append(result["last"])

    def stop(self) -> None:
        self.running.clear()
        self.thread.join(timeout=5)
        self.ws.close()


@pytest.mark.timeout(180)
def test_a_pysparkplug_edge_node_stores_and_forwards_on_the_hosts_state(start_server, tmp_path, mosquitto):
    redis = Redis(tmp_path, durable=True)
    redis.start()
    group, host = uniq("G"), uniq("host")
    config = tmp_path / "edge.toml"
    config.write_text(f"""
# The source keeps running through the outage: its QoS 0 values wait for the node.
source_lease_ttl_s = 60

[namespaces.pt]
history_size = 2000
trend_tiers = [{{step_s = 1, window_s = 600}}]

[[sources]]
kind = "mqtt"
name = "plant"
url = "{mosquitto.url}"
topics = ["spBv1.0/{group}/#"]
channel = "pt:{{topic}}"
client_id = "{uniq('sb-')}"
qos = 1
sparkplug_host_id = "{host}"
""")
    srv = start_server("--broker", redis.url, "--config", str(config))
    ch = f"pt:{group}.E1.Temp"
    sb.wait_until("the source runs", lambda: sb.metric(
        srv, "switchboard_source_connected", source="plant", kind="mqtt") == 1, 20)
    edge = Edge(mosquitto.port, group, host, seconds=30)
    watcher = None
    try:
        sb.wait_until("the edge node's birth", lambda: sb.api_get(
            srv, f"/api/channels/{sb.ch_path(ch)}").status == 200, 20, every=0.2)
        watcher = Watcher(srv.ws_url, ch)
        sb.wait_until("the edge node hears the host online", lambda: any(up for up, _ in edge.states()), 20)
        sb.wait_until("live values arrive", lambda: len(sb.history_all(srv, ch)) >= 20, 20, every=0.5)
        killed = time.time()
        redis.kill()
        sb.wait_until("the edge node hears the host offline",
                      lambda: any(not up and at >= killed for up, at in edge.states()), 10)
        offline_after = next(at for up, at in edge.states() if not up and at >= killed) - killed
        time.sleep(max(0.0, 10 - (time.time() - killed)))
        redis.start()
        sb.wait_until("the edge node hears the host online again",
                      lambda: any(up and at > killed + offline_after for up, at in edge.states()), 60)
        done = edge.wait(60)
    finally:
        edge.kill()
    try:
        assert offline_after <= 2.0, f"online: false came {offline_after:.2f} s after the kill"
        assert done["kept"] == 0, "everything kept went out once the host was back"
        live = [e["live"] for e in edge.events if "live" in e]
        historical = [v for e in edge.events if "historical" in e for v in e["historical"]]
        assert len(historical) >= 50, f"the outage's values were stored and forwarded: {len(historical)}"
        # Its clean disconnect's NDEATH ended its session: the value went bad (docs/sources.md,
        # "Sparkplug B": a death is never missed).
        sb.wait_until("the death marks the value bad", lambda: sb.api_get(
            srv, f"/api/channels/{sb.ch_path(ch)}").json()["last"]["data"]["q"] == "bad", 20, every=0.5)
        last = sb.api_get(srv, f"/api/channels/{sb.ch_path(ch)}").json()["last"]["data"]
        assert last["v"] == live[-1][0], "the bad value carries the newest live one"
        # The live subscriber kept the newest value throughout: nothing historical, nothing
        # older than what it had, the death's bad value last.
        sb.wait_until("the subscriber gets the death", lambda: watcher.pubs and watcher.pubs[-1]["data"] == last, 10)
        assert watcher.error is None, f"the subscriber's reading ended: {watcher.error}"
        assert not [p for p in watcher.pubs if p.get("hist")], "a live subscriber was sent a historical value"
        times = [p["data"]["t"] for p in watcher.pubs]
        assert times == sorted(times), "a live subscriber was sent a value older than one it had"
        assert len(watcher.pubs) >= 20, f"the subscriber was sent {len(watcher.pubs)} values"
        # History holds the live values once, in order: the births (value 0) first, the death
        # last; and every historical value once, marked, with its own time.
        pubs = sb.history_pubs(srv, ch)
        hist = [p["data"] for p in pubs if not p.get("hist")]
        past = sorted((p["data"]["v"], p["data"]["t"]) for p in pubs if p.get("hist"))
        assert past == sorted((v, t) for v, t in historical), "history holds every historical value once"
        good = [d["v"] for d in hist if d["q"] == "good" and d["v"] != 0.0]
        assert good == [v for v, _ in live], "history holds the live values once, in order"
        births = sum(1 for d in hist if d["q"] == "good" and d["v"] == 0.0)
        bad = sum(1 for d in hist if d["q"] == "bad")
        # The 1 s trend buckets count every value at its own time: births, live, historical and
        # the death's bad value.
        taken = births + len(live) + len(historical) + bad
        sb.wait_until("the trend counts every value", lambda: sum(
            b["n"] for b in sb.trend(srv, ch, 600, 1)["buckets"]) == taken, 30, every=0.5)
        buckets = {b["t"]: b["n"] for b in sb.trend(srv, ch, 600, 1)["buckets"]}
        for v, t in historical:
            assert buckets.get(t - t % 1000, 0) > 0, f"historical value {v} at {t} is not in its bucket"
        print(f"offline heard {offline_after:.2f} s after the kill; {len(live)} live, {len(historical)} historical; "
              f"the subscriber was sent {len(watcher.pubs)}, subscribed again {watcher.resubscribed} time(s)")
    finally:
        if watcher is not None:
            watcher.stop()
        redis.kill()
