"""The MQTT source (docs/sources.md) against a real mosquitto on a spare loopback port: every
payload form, Sparkplug B births, data and deaths, malformed input, a broker restart
mid-stream, write-back with and without permission, and one source over two nodes sharing a
Redis (a lease: one node at a time, the other takes over when it dies, no duplicates; writes to
a node without the source forwarded to the node that runs it).
"""

from __future__ import annotations

import functools
import json
import re
import signal
import os
import subprocess
import threading
import time

import jwt
import pytest

import sb
from mqtt_kit import (BOOLEAN, DOUBLE, INT16, STRING, Mosquitto, Publisher, metric,
                      sparkplug_payload)
from mqtt_kit import mosquitto  # noqa: F401 (the module's mosquitto, a fixture)
from sb import WS, http, uniq

SECRET = "mqtt-test-secret-1f2e3d4c5b6a7980-aabbccddeeff00112233"


def source_config(tmp_path, mq: Mosquitto, extra: str = "", source_extra: str = "") -> str:
    path = tmp_path / f"sources-{uniq()}.toml"
    path.write_text(f"""{extra}
[[sources]]
kind = "mqtt"
name = "plant"
url = "{mq.url}"
topics = ["plant/#", "spBv1.0/#"]
channel = "pt:{{topic}}"
client_id = "{uniq('sb-')}"
{source_extra}
""")
    return str(path)


def metric_value(srv: sb.Server, name: str) -> float:
    return sb.metric(srv, f"switchboard_{name}", required=True, source="plant", kind="mqtt")


wait_until = functools.partial(sb.wait_until, limit=15.0)


def flowing(srv: sb.Server, mq: Mosquitto, query: str = "") -> None:
    """Waits until a value published to mosquitto reaches a subscriber of the node (the source
    is connected and subscribed)."""
    topic = f"plant/probe/{uniq()}"
    ch = "pt:" + topic.replace("/", ".")
    pub = Publisher(mq.port, uniq("probe-"))
    with WS(srv.ws_url + query) as ws:
        ws.subscribe([ch])
        deadline = time.monotonic() + 20
        while True:
            pub.publish(topic, "1")
            try:
                ws.pubs(ch, 1, timeout=0.3)
                break
            except TimeoutError:
                assert time.monotonic() < deadline, "the source never delivered"
    pub.close()


def data_of(ws: WS, ch: str, n: int = 1, timeout: float = 10.0) -> list:
    return [p["data"] for p in ws.pubs(ch, n, timeout=timeout)]


def test_source_mqtt_json_points_and_bare_values(start_server, tmp_path, mosquitto):
    srv = start_server("--config", source_config(tmp_path, mosquitto))
    flowing(srv, mosquitto)
    u = uniq()
    names = ["json", "num", "flag", "text", "partial"]
    chans = {n: f"pt:plant.{u}.{n}" for n in names}
    pub = Publisher(mosquitto.port, uniq("pub-"))
    with WS(srv.ws_url) as ws:
        ws.subscribe(list(chans.values()))
        before = int(time.time() * 1000)
        pub.publish(f"plant/{u}/json", json.dumps({"v": 3.5, "t": 1700000000000, "q": "uncertain"}))
        pub.publish(f"plant/{u}/num", "21.5")
        pub.publish(f"plant/{u}/flag", "true")
        pub.publish(f"plant/{u}/text", "RUNNING")
        pub.publish(f"plant/{u}/partial", '{"v": [1, 2, 3]}')
        assert data_of(ws, chans["json"]) == [{"v": 3.5, "t": 1700000000000, "q": "uncertain"}]
        got = {n: data_of(ws, chans[n])[0] for n in names[1:]}
    after = int(time.time() * 1000)
    assert {n: (d["v"], d["q"]) for n, d in got.items()} == {
        "num": (21.5, "good"), "flag": (True, "good"), "text": ("RUNNING", "good"), "partial": ([1, 2, 3], "good")}
    for d in got.values():
        assert before - 1000 <= d["t"] <= after + 1000, "arrival time"
    pub.close()
    assert metric_value(srv, "source_connected") == 1 and metric_value(srv, "source_active") == 1
    assert metric_value(srv, "source_messages_total") >= 6


def test_source_mqtt_sparkplug_birth_data_and_death(start_server, tmp_path, mosquitto):
    srv = start_server("--config", source_config(tmp_path, mosquitto))
    flowing(srv, mosquitto)
    g = uniq("G")
    temp, run, off, state = (f"pt:{g}.E1.Inputs.Temp_1", f"pt:{g}.E1.Run", f"pt:{g}.E1.Offset",
                             f"pt:{g}.E1.D1.State")
    pub = Publisher(mosquitto.port, uniq("edge-"))
    with WS(srv.ws_url) as ws:
        ws.subscribe([temp, run, off, state])
        pub.publish(f"spBv1.0/{g}/NBIRTH/E1", sparkplug_payload([
            metric("Inputs/Temp 1", 1, DOUBLE, 20.5),
            metric("Run", 2, BOOLEAN, True),
            metric("Offset", 3, INT16, -2),
        ], timestamp=1700000000000))
        assert data_of(ws, temp) == [{"v": 20.5, "t": 1700000000000, "q": "good"}]
        assert data_of(ws, run)[0]["v"] is True
        assert data_of(ws, off)[0]["v"] == -2
        pub.publish(f"spBv1.0/{g}/DBIRTH/E1/D1", sparkplug_payload([metric("State", 10, STRING, "idle")],
                                                                   timestamp=1700000000001))
        assert data_of(ws, state)[0] == {"v": "idle", "t": 1700000000001, "q": "good"}
        # Data by alias only, with the metric's own timestamp.
        pub.publish(f"spBv1.0/{g}/NDATA/E1", sparkplug_payload([metric(alias=1, value=21.25, timestamp=1700000000500)],
                                                               timestamp=1700000000400))
        assert data_of(ws, temp) == [{"v": 21.25, "t": 1700000000500, "q": "good"}]
        pub.publish(f"spBv1.0/{g}/DDATA/E1/D1", sparkplug_payload([metric(alias=10, value="running")],
                                                                  timestamp=1700000000600))
        assert data_of(ws, state)[0] == {"v": "running", "t": 1700000000600, "q": "good"}
        # A null metric: the last value, bad.
        pub.publish(f"spBv1.0/{g}/NDATA/E1", sparkplug_payload([metric(alias=2, is_null=True)],
                                                               timestamp=1700000000700))
        assert data_of(ws, run)[0] == {"v": True, "t": 1700000000700, "q": "bad"}
        # The edge node dies: every metric of it and of its devices turns bad, last value kept.
        pub.publish(f"spBv1.0/{g}/NDEATH/E1", sparkplug_payload([metric("bdSeq", None, 8, 0)]))
        dead = {ch: data_of(ws, ch)[0] for ch in (temp, off, state)}
        assert {ch: (d["v"], d["q"]) for ch, d in dead.items()} == {
            temp: (21.25, "bad"), off: (-2, "bad"), state: ("running", "bad")}
        assert data_of(ws, run)[0]["q"] == "bad"
    pub.close()
    # Sparkplug channels take no writes; the reply says why.
    r = http("POST", srv.http_url + "/api/publish", {"channel": temp, "data": 1})
    assert r.status == 200, "pt has no write_source here: a plain publish"


def test_source_mqtt_malformed_payloads_are_counted_and_harmless(start_server, tmp_path, mosquitto):
    srv = start_server("--config", source_config(tmp_path, mosquitto))
    flowing(srv, mosquitto)
    bystander = sb.Bystander(srv)
    u = uniq()
    errors = metric_value(srv, "source_decode_errors_total")
    pub = Publisher(mosquitto.port, uniq("junk-"))
    junk = [
        (f"plant/{u}/bin", b"\xff\xfe\x00\x01"),
        (f"plant/{u}/obj", b'{"x": 1}'),
        (f"plant/{u}/broken", b'{"v": 1,'),
        (f"plant/{u}/q", b'{"v": 1, "q": "meh"}'),
        (f"plant/{u}/t", b'{"v": 1, "t": "yesterday"}'),
        (f"plant/{u}/bad topic", b"1"),
        (f"spBv1.0/{u}/NDATA/E1", b"\xff\xff\xff\xff"),
        (f"spBv1.0/{u}/NDATA/E1/too/deep", b""),
    ]
    for topic, payload in junk:
        pub.publish(topic, payload)
    wait_until("decode errors counted", lambda: metric_value(srv, "source_decode_errors_total") >= errors + len(junk))
    ch = f"pt:plant.{u}.ok"
    with WS(srv.ws_url) as ws:
        ws.subscribe([ch])
        pub.publish(f"plant/{u}/ok", "7")
        assert data_of(ws, ch)[0]["v"] == 7
    pub.close()
    bystander.check()
    bystander.close()
    assert srv.alive()


def test_source_mqtt_broker_restart_shows_bad_then_resumes(start_server, tmp_path):
    mq = Mosquitto(tmp_path).start()
    try:
        srv = start_server("--config", source_config(tmp_path, mq, extra='[namespaces.pt]\nwrite_source = "plant"\n'))
        flowing(srv, mq)
        u = uniq()
        ch = f"pt:plant.{u}.level"
        with WS(srv.ws_url) as ws:
            ws.subscribe([ch])
            pub = Publisher(mq.port, uniq("pub-"))
            pub.publish(f"plant/{u}/level", "41")
            assert data_of(ws, ch)[0]["v"] == 41
            pub.close()
            mq.stop()
            # The gap: the last value again, bad.
            gap = data_of(ws, ch)[0]
            assert gap["v"] == 41 and gap["q"] == "bad", gap
            wait_until("disconnected", lambda: metric_value(srv, "source_connected") == 0)
            # A write now cannot reach the device: 503, said so.
            r = http("POST", srv.http_url + "/api/publish", {"channel": ch, "data": 1})
            assert r.status == 503 and r.json()["error"]["code"] == 503, r.body
            time.sleep(1)
            mq.start()
            wait_until("reconnected", lambda: metric_value(srv, "source_connected") == 1, limit=40)
            assert metric_value(srv, "source_reconnects_total") >= 1
            flowing(srv, mq)
            pub = Publisher(mq.port, uniq("pub-"))
            pub.publish(f"plant/{u}/level", "42")
            assert data_of(ws, ch)[0] == {"v": 42, "t": pytest.approx(time.time() * 1000, abs=5000), "q": "good"}
            pub.close()
        assert srv.alive()
    finally:
        mq.stop()


def token(publish: list) -> str:
    return jwt.encode({"sub": "op", "exp": int(time.time()) + 600, "publish": publish}, SECRET, algorithm="HS256")


def test_source_mqtt_write_back_accepted_and_refused_without_permission(start_server, tmp_path, mosquitto):
    extra = '[namespaces.pt]\nclient_publish = true\nwrite_source = "plant"\n'
    srv = start_server("--config", source_config(tmp_path, mosquitto, extra=extra), "--jwt-secret", SECRET)
    u = uniq()
    ch, topic = f"pt:plant.{u}.sp", f"plant/{u}/sp"
    allowed = {"Authorization": f"Bearer {token([f'pt:plant.{u}.*'])}"}
    denied = {"Authorization": f"Bearer {token(['pt:other.*'])}"}
    flowing(srv, mosquitto, "?token=" + token([]))
    sub = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(mosquitto.port), "-t", f"plant/{u}/#",
                            "-v", "-q", "1", "-W", "20"], stdout=subprocess.PIPE, text=True)
    now = 0
    try:
        time.sleep(1.0)  # mosquitto_sub subscribed
        # Refused without permission: nothing reaches the MQTT broker.
        r = http("POST", srv.http_url + "/api/publish", {"channel": ch, "data": 99}, headers=denied)
        assert r.status == 403, r.body
        with WS(srv.ws_url + "?token=" + token(["pt:other.*"])) as ws:
            reply = ws.request("publish", {"channel": ch, "data": 98})
            assert reply["error"]["code"] == 403, reply
        with WS(srv.ws_url + "?token=" + token([f"pt:plant.{u}.*"])) as ws:
            ws.subscribe([ch])
            # Accepted: the broker acknowledged the QoS 1 publish.
            r = http("POST", srv.http_url + "/api/publish", {"channel": ch, "data": 42}, headers=allowed)
            assert r.status == 200 and r.json() == {"written": True, "source": "plant"}, r.body
            # The source heard 42 back; 43 comes with a later time of its own (a value older than
            # the channel's newest would be historical: never its last value).
            assert [d["data"]["v"] for d in ws.pubs(ch, 1, timeout=10)] == [42]
            now = int(time.time() * 1000) + 1
            reply = ws.request("publish", {"channel": ch, "data": {"v": 43, "t": now, "q": "good"}})
            assert reply["ok"] == {"written": True, "source": "plant"}, reply
            # The source hears its own write back from the broker: the channel shows it.
            seen = []
            deadline = time.monotonic() + 10
            while 43 not in seen and time.monotonic() < deadline:
                try:
                    seen.extend(d["data"]["v"] for d in ws.pubs(ch, 1, timeout=0.5))
                except TimeoutError:
                    pass
            assert seen[-1:] == [43] and set(seen) <= {42, 43}, seen
        time.sleep(0.5)
    finally:
        sub.send_signal(signal.SIGTERM)
        out, _ = sub.communicate(timeout=10)
    lines = [line for line in out.splitlines() if line]
    assert lines == [f"{topic} 42", f'{topic} {{"v":43,"t":{now},"q":"good"}}'], lines
    assert metric_value(srv, "source_writes_total") == 2


def _redis(tmp_path):
    port = sb_free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until("redis", lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                               text=True).stdout.strip() == "PONG", limit=10)
    return proc, f"redis://127.0.0.1:{port}"


def test_source_mqtt_forwarded_write_passes_the_checks_of_the_node_that_runs_the_source(start_server, tmp_path,
                                                                                        mosquitto):
    """The node that runs the source checks a forwarded write as it checks its own: data within
    node-b's limits but over node-a's is refused by node-a (413), and the device sees nothing."""
    redis, url = _redis(tmp_path)
    try:
        extra = 'source_lease_ttl_s = 3\n[namespaces.pt]\nclient_publish = true\nwrite_source = "plant"\n'
        cfg = source_config(tmp_path, mosquitto, extra=extra)
        a = start_server("--config", cfg, "--broker", url, "--jwt-secret", SECRET,
                         env={"SWITCHBOARD_NODE_ID": "node-a", "SWITCHBOARD_LIMITS__MAX_PUBLICATION_BYTES": "64"})
        wait_until("node-a runs the source", lambda: metric_value(a, "source_connected") == 1)
        b = start_server("--config", cfg, "--broker", url, "--jwt-secret", SECRET, env={"SWITCHBOARD_NODE_ID": "node-b"})
        time.sleep(1)
        assert metric_value(b, "source_active") == 0, "the lease is node-a's"
        u = uniq()
        ch = f"pt:plant.{u}.sp"
        allowed = {"Authorization": f"Bearer {token([f'pt:plant.{u}.*'])}"}
        r = http("POST", b.http_url + "/api/publish", {"channel": ch, "data": {"v": 1, "note": "x" * 100}},
                 headers=allowed)
        assert r.status == 413, r.body
        assert "64 bytes" in r.json()["error"]["message"], r.body
        r = http("POST", b.http_url + "/api/publish", {"channel": ch, "data": 7}, headers=allowed)
        assert r.status == 200 and r.json() == {"written": True, "source": "plant"}, r.body
        assert (forwarded(b, "sent"), forwarded(a, "served")) == (2, 2)
        assert metric_value(a, "source_writes_total") == 1, "only the write within node-a's limits reached the device"
    finally:
        redis.kill()
        redis.wait()


def sb_free_port() -> int:
    from mqtt_kit import free_port
    return free_port()


def info_sources(srv: sb.Server) -> dict:
    return {s["name"]: s for s in http("GET", srv.http_url + "/api/info").json().get("sources", [])}


def test_source_mqtt_lease_one_node_at_a_time_and_takeover_without_duplicates(start_server, tmp_path, mosquitto):
    redis, url = _redis(tmp_path)
    try:
        # Every publication delivered (no conflation of the burst after the takeover).
        extra = "source_lease_ttl_s = 3\n[namespaces.pt]\nconflate = false\n"
        cfg = source_config(tmp_path, mosquitto, extra=extra)
        a = start_server("--config", cfg, "--broker", url, env={"SWITCHBOARD_NODE_ID": "node-a"})
        wait_until("node-a runs the source", lambda: info_sources(a)["plant"]["active"])
        b = start_server("--config", cfg, "--broker", url, env={"SWITCHBOARD_NODE_ID": "node-b"})
        time.sleep(2)
        assert not info_sources(b)["plant"]["active"], "the lease is node-a's"
        flowing(b, mosquitto)
        u = uniq()
        ch = f"pt:plant.{u}.seq"
        pub = Publisher(mosquitto.port, uniq("seq-"))
        killed_at = None
        got: list = []
        with WS(b.ws_url) as ws:
            ws.subscribe([ch])

            def collect():
                # Read while publishing: a subscriber that stops reading gets conflated values.
                deadline = time.monotonic() + 30
                while (not got or got[-1]["data"]["v"] != 100) and time.monotonic() < deadline:
                    try:
                        got.extend(ws.pubs(ch, 1, timeout=0.5))
                    except TimeoutError:
                        pass

            reader = threading.Thread(target=collect)
            reader.start()
            for i in range(1, 101):
                pub.publish(f"plant/{u}/seq", str(i))
                if i == 40:
                    os.kill(a.pid, signal.SIGKILL)
                    killed_at = time.monotonic()
                time.sleep(0.05)
            taken = wait_until("node-b takes over", lambda: info_sources(b)["plant"]["active"], limit=15)
            takeover = time.monotonic() - killed_at
            reader.join()
        pub.close()
        assert taken and takeover < 3 + 3, f"takeover after {takeover:.1f}s"
        values = [p["data"]["v"] for p in got]
        offsets = [p["off"] for p in got]
        assert len(values) == len(set(values)), f"duplicates: {values}"
        assert values == sorted(values) and values[-1] == 100, values
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), "one publication per value"
        # The persistent session kept what was published while no node ran the source.
        assert len(values) >= 95, f"lost {100 - len(values)}: {values}"
        assert b.alive()
    finally:
        redis.kill()
        redis.wait()


def forwarded(srv: sb.Server, what: str) -> float:
    text = http("GET", srv.http_url + "/metrics").text
    m = re.search(rf"^switchboard_source_forwarded_writes_{what}_total (\S+)$", text, re.M)
    assert m, f"forwarded_writes_{what} not in /metrics"
    return float(m.group(1))


def listed(srv: sb.Server, headers: dict) -> list:
    names, cursor = [], ""
    while True:
        page = http("GET", srv.http_url + f"/api/channels?limit=1000&cursor={cursor}", headers=headers).json()
        names += [c["channel"] for c in page["channels"]]
        if not page["next"]:
            return names
        cursor = page["next"]


def test_source_mqtt_write_to_a_node_without_the_source_is_forwarded_to_its_node(start_server, tmp_path, mosquitto):
    redis, url = _redis(tmp_path)
    sub = None
    try:
        extra = 'source_lease_ttl_s = 3\n[namespaces.pt]\nclient_publish = true\nwrite_source = "plant"\n'
        cfg = source_config(tmp_path, mosquitto, extra=extra)
        node = lambda name: start_server("--config", cfg, "--broker", url, "--jwt-secret", SECRET,  # noqa: E731
                                         env={"SWITCHBOARD_NODE_ID": name})
        a = node("node-a")
        wait_until("node-a runs the source", lambda: metric_value(a, "source_connected") == 1)
        b = node("node-b")
        time.sleep(1)
        assert metric_value(b, "source_active") == 0, "the lease is node-a's"
        u = uniq()
        ch, topic = f"pt:plant.{u}.sp", f"plant/{u}/sp"
        allowed = {"Authorization": f"Bearer {token([f'pt:plant.{u}.*'])}"}
        denied = {"Authorization": f"Bearer {token(['pt:other.*'])}"}
        sub = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(mosquitto.port), "-t", f"plant/{u}/#",
                                "-v", "-q", "1", "-W", "60"], stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)  # mosquitto_sub subscribed
        # The caller's node checks the permission: refused on node-b, nothing forwarded.
        r = http("POST", b.http_url + "/api/publish", {"channel": ch, "data": 99}, headers=denied)
        assert r.status == 403, r.body
        with WS(b.ws_url + "?token=" + token(["pt:other.*"])) as ws:
            assert ws.request("publish", {"channel": ch, "data": 98})["error"]["code"] == 403
        assert forwarded(b, "sent") == 0
        # Permitted on node-b, which does not run the source: node-a writes, node-b answers.
        r = http("POST", b.http_url + "/api/publish", {"channel": ch, "data": 42}, headers=allowed)
        assert r.status == 200 and r.json() == {"written": True, "source": "plant"}, r.body
        with WS(b.ws_url + "?token=" + token([f"pt:plant.{u}.*"])) as ws:
            reply = ws.request("publish", {"channel": ch, "data": {"v": 43, "t": 1, "q": "good"}})
            assert reply["ok"] == {"written": True, "source": "plant"}, reply
        r = http("POST", b.http_url + "/api/publish", {"batch": [{"channel": ch, "data": 44}]}, headers=allowed)
        assert r.json() == {"results": [{"written": True, "source": "plant"}]}, r.body
        assert (forwarded(b, "sent"), forwarded(a, "served"), forwarded(b, "timed_out")) == (3, 3, 0)
        assert metric_value(a, "source_writes_total") == 3
        # The request and reply channels are nobody's to see.
        names = listed(b, allowed)
        assert ch in names and not [n for n in names if n.startswith("$")], names
        # The holder dies: node-b takes the source over and writes itself...
        os.kill(a.pid, signal.SIGKILL)
        wait_until("node-b runs the source", lambda: metric_value(b, "source_connected") == 1, limit=20)
        r = http("POST", b.http_url + "/api/publish", {"channel": ch, "data": 45}, headers=allowed)
        assert r.status == 200 and r.json() == {"written": True, "source": "plant"}, r.body
        # ...and takes the writes a newcomer forwards.
        c = node("node-c")
        time.sleep(0.5)
        r = http("POST", c.http_url + "/api/publish", {"channel": ch, "data": 46}, headers=allowed)
        assert r.status == 200 and r.json() == {"written": True, "source": "plant"}, r.body
        assert forwarded(c, "sent") == 1 and forwarded(b, "served") == 1
        time.sleep(0.5)
    finally:
        if sub is not None:
            sub.send_signal(signal.SIGTERM)
            out, _ = sub.communicate(timeout=10)
        redis.kill()
        redis.wait()
    lines = [line for line in out.splitlines() if line]
    assert lines == [f"{topic} 42", f'{topic} {{"v":43,"t":1,"q":"good"}}', f"{topic} 44", f"{topic} 45",
                     f"{topic} 46"], lines
