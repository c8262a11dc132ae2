"""Writes to plant devices (docs/sources.md, "Write audit") against a real mosquitto, with
paho-mqtt as the device: a write passes the publish checks before the source sees it (a write
over `limits.max_publication_bytes` is 413 and never reaches the MQTT broker, and the source
stays connected), and every attempt — by an API key or a token user, accepted, too large,
forbidden, to a dead source — is audited: `GET /api/writes` (newest first, API keys only),
the `switchboard::writes` log line and `switchboard_source_write_attempts_total`. The audit's
`by` says the kind of caller (`user:`, `key:`), so a name one kind chose cannot pass for another's.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time

import jwt
import paho.mqtt.client as paho

import sb
from mqtt_kit import Mosquitto, Publisher, free_port
from mqtt_kit import mosquitto  # noqa: F401 (the module's mosquitto, a fixture)
from sb import WS, http, uniq
from test_auth import basic

SECRET = "write-audit-secret-5a4b3c2d1e0f-00112233445566778899"
API_KEY = "write-audit-api-key-0f1e2d3c4b5a6978"
LIMIT = 4096  # limits.max_publication_bytes of the node under test

wait_until = functools.partial(sb.wait_until, limit=20.0)


class Device:
    """A device on the MQTT broker (paho-mqtt): records every command it receives."""

    def __init__(self, port: int, topic_filter: str):
        self.got: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=uniq("device-"))
        self.client.on_connect = lambda c, *_: c.subscribe(topic_filter, qos=1)
        self.client.on_subscribe = lambda *_: self.ready.set()
        self.client.on_message = self._message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.ready.wait(10), "the device never subscribed"

    def _message(self, _c, _u, msg) -> None:
        with self.lock:
            self.got.append((msg.topic, msg.payload))

    def received(self) -> list[tuple[str, bytes]]:
        with self.lock:
            return list(self.got)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def config(tmp_path, mq: Mosquitto) -> str:
    dead = free_port()  # nothing listens there: the source never connects
    path = tmp_path / f"audit-{uniq()}.toml"
    path.write_text(f"""
[limits]
max_publication_bytes = {LIMIT}

[[sources]]
kind = "mqtt"
name = "plant"
url = "{mq.url}"
topics = ["plant/#"]
channel = "pt:{{topic}}"
client_id = "{uniq('sb-read-')}"

[[sources]]
kind = "mqtt"
name = "plant-set"
url = "{mq.url}"
topics = ["set/#"]
channel = "cmd:{{topic}}"
client_id = "{uniq('sb-set-')}"

[[sources]]
kind = "mqtt"
name = "dead"
url = "mqtt://127.0.0.1:{dead}"
topics = ["dead/#"]
channel = "dead:{{topic}}"

[namespaces.cmd]
client_publish = true
write_source = "plant-set"

[namespaces.dead]
client_publish = true
write_source = "dead"
""")
    return str(path)


def token(user: str, publish: list) -> str:
    claims = {"sub": user, "exp": int(time.time()) + 600, "publish": publish}
    return jwt.encode(claims, SECRET, algorithm="HS256")


def attempts(srv: sb.Server, source: str, outcome: str) -> float:
    text = http("GET", srv.http_url + "/metrics").text
    m = re.search(rf'^switchboard_source_write_attempts_total{{source="{source}",outcome="{outcome}"}} (\S+)$',
                  text, re.M)
    assert m, f"write attempts of {source}/{outcome} not in /metrics"
    return float(m.group(1))


def connected(srv: sb.Server, source: str) -> bool:
    text = http("GET", srv.http_url + "/metrics").text
    return f'switchboard_source_connected{{source="{source}",kind="mqtt"}} 1' in text


def test_write_audit_checks_and_lists_every_attempt(start_server, tmp_path, mosquitto):
    srv = start_server("--config", config(tmp_path, mosquitto), "--jwt-secret", SECRET, "--api-key", API_KEY)
    key = {"Authorization": f"Bearer {API_KEY}"}
    u = uniq()
    sp, sp_topic = f"cmd:set.{u}.sp", f"set/{u}/sp"
    wait_until("both live sources connected", lambda: connected(srv, "plant") and connected(srv, "plant-set"))
    device = Device(mosquitto.port, "set/#")
    plant = Publisher(mosquitto.port, uniq("plant-"))
    try:
        # 1. A token user writes over the WebSocket: the device receives the command.
        ana = token("ana", [f"cmd:set.{u}.*"])
        with WS(srv.ws_url + "?token=" + ana) as ws:
            reply = ws.request("publish", {"channel": sp, "data": {"v": 42}})
            assert reply["ok"] == {"written": True, "source": "plant-set"}, reply
        wait_until("the device got the setpoint", lambda: device.received() == [(sp_topic, b'{"v":42}')])

        # 2. The API key writes more than limits.max_publication_bytes: 413 before the source.
        big = {"v": "x" * (2 * LIMIT)}
        r = http("POST", srv.http_url + "/api/publish", {"channel": sp, "data": big}, headers=key)
        assert r.status == 413, r.body
        with WS(srv.ws_url + "?token=" + ana) as ws:
            reply = ws.request("publish", {"channel": sp, "data": big})
            assert reply["error"]["code"] == 413, reply
        # The source stays connected: its other channels keep updating.
        temp = f"pt:plant.{u}.temp"
        with WS(srv.ws_url + "?token=" + ana) as ws:
            ws.subscribe([temp])
            for v in (20.5, 21.5):
                plant.publish(f"plant/{u}/temp", str(v))
                assert ws.pubs(temp, 1, timeout=10)[0]["data"]["v"] == v
        assert connected(srv, "plant-set") and connected(srv, "plant")

        # 3. The API key writes to a source that is not connected: 503.
        r = http("POST", srv.http_url + "/api/publish", {"channel": f"dead:dead.{u}.x", "data": 1}, headers=key)
        assert r.status == 503, r.body

        # 4. A user without the permission: 403, audited too.
        ben = token("ben", ["cmd:other.*"])
        r = http("POST", srv.http_url + "/api/publish", {"channel": sp, "data": 7},
                 headers={"Authorization": f"Bearer {ben}"})
        assert r.status == 403, r.body

        time.sleep(1.0)
        assert device.received() == [(sp_topic, b'{"v":42}')], "only the accepted write reached the device"
    finally:
        device.close()
        plant.close()

    # The audit: API keys only.
    assert http("GET", srv.http_url + "/api/writes").status == 401
    r = http("GET", srv.http_url + "/api/writes", headers={"Authorization": f"Bearer {ana}"})
    assert r.status == 403, r.body
    assert http("GET", srv.http_url + "/api/writes?limit=0", headers=key).status == 400
    r = http("GET", srv.http_url + "/api/writes", headers=key)
    assert r.status == 200, r.body
    body = r.json()
    assert body["capacity"] == 1000
    got = [(w["by"], w["auth"], w["channel"], w["source"], w["outcome"], w["code"]) for w in body["writes"]]
    # Sizes as sent: the HTTP client's JSON has spaces, the WebSocket client's none.
    http_big, ws_big = len(json.dumps(big)), len(json.dumps(big, separators=(",", ":")))
    assert got == [
        ("user:ben", "token", sp, "plant-set", "forbidden", 403),
        ("key:api-key-0", "api_key", f"dead:dead.{u}.x", "dead", "unavailable", 503),
        ("user:ana", "token", sp, "plant-set", "too_large", 413),
        ("key:api-key-0", "api_key", sp, "plant-set", "too_large", 413),
        ("user:ana", "token", sp, "plant-set", "written", 200),
    ], got
    writes = body["writes"]
    assert [w["bytes"] for w in writes] == [1, 1, ws_big, http_big, len('{"v":42}')], writes
    assert all(w["forwarded"] is False and w["latency_ms"] >= 0 for w in writes)
    assert "message" not in writes[-1] and "larger than 4096 bytes" in writes[2]["message"]
    times = [w["t"] for w in writes]
    assert times == sorted(times, reverse=True) and abs(times[0] - time.time() * 1000) < 60_000, times
    assert [w["outcome"] for w in http("GET", srv.http_url + "/api/writes?limit=2", headers=key).json()["writes"]] \
        == ["forbidden", "unavailable"]

    # Counted by outcome.
    assert attempts(srv, "plant-set", "written") == 1
    assert attempts(srv, "plant-set", "too_large") == 2
    assert attempts(srv, "plant-set", "forbidden") == 1
    assert attempts(srv, "plant-set", "refused") == 0
    assert attempts(srv, "dead", "unavailable") == 1

    # One log line per attempt, at info, with its fields (never the data).
    log = srv.stderr_tail(200_000)
    lines = [line for line in log.splitlines() if "switchboard::writes" in line]
    assert len(lines) == 5, lines
    assert 'by="user:ana"' in lines[0] and 'outcome="written"' in lines[0] and "INFO" in lines[0], lines[0]
    assert "xxxx" not in log


def test_write_audit_lines_quote_the_names_clients_choose(start_server, tmp_path, mosquitto):
    """A token's `sub` is the caller's text: one that spells other fields of the audit line, or a
    line break of its own (U+2028), stays inside its quoted `by` value."""
    srv = start_server("--config", config(tmp_path, mosquitto), "--jwt-secret", SECRET, "--api-key", API_KEY)
    forged = 'api-key-0 auth="api_key" outcome="written" code=200 x=\u2028INFO switchboard::writes: by=ana'
    u = uniq()
    r = http("POST", srv.http_url + "/api/publish", {"channel": f"dead:dead.{u}.x", "data": 1},
             headers={"Authorization": f"Bearer {token(forged, ['dead:**'])}"})
    assert r.status == 503, r.body
    writes = http("GET", srv.http_url + "/api/writes", headers={"Authorization": f"Bearer {API_KEY}"}).json()["writes"]
    assert [(w["by"], w["auth"], w["outcome"]) for w in writes] == [("user:" + forged, "token", "unavailable")], writes
    log = srv.stderr_tail(200_000)
    assert "\u2028" not in log, "the caller's line separator reached the log"
    [line] = [line for line in log.splitlines() if "switchboard::writes" in line]
    # The line's fields, a quoted value read whole (escapes and all): each field once.
    fields = re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line.split("switchboard::writes:", 1)[1])
    keys = [k for k, _ in fields]
    assert len(keys) == len(set(keys)), line
    got = dict(fields)
    assert (got["auth"], got["outcome"], got["code"]) == ('"token"', '"unavailable"', "503"), line
    assert json.loads(got["by"].replace("\\u{2028}", "\\u2028")) == "user:" + forged, line



def test_write_audit_by_says_the_kind_of_caller(start_server, switchboard_bin, tmp_path, mosquitto):
    """A token whose `sub` is `api-key-0` and a users-file user of that name are users
    (`user:api-key-0`), never the node's first API key (`key:api-key-0`), in the ring and the log."""
    users, password = tmp_path / "users", "audit-user-password-7f6e5d"
    sb.add_user(switchboard_bin, users, "api-key-0", password)
    srv = start_server("--config", config(tmp_path, mosquitto), "--jwt-secret", SECRET, "--api-key", API_KEY,
                       "--users", str(users))
    callers = [
        {"Authorization": f"Bearer {token('api-key-0', ['dead:**'])}"},
        basic("api-key-0", password),
        {"Authorization": f"Bearer {API_KEY}"},
    ]
    for headers in callers:
        r = http("POST", srv.http_url + "/api/publish", {"channel": f"dead:dead.{uniq()}.x", "data": 1},
                 headers=headers)
        assert r.status == 503, r.body
    writes = http("GET", srv.http_url + "/api/writes", headers=callers[2]).json()["writes"]
    assert [(w["by"], w["auth"]) for w in writes] == [
        ("key:api-key-0", "api_key"), ("user:api-key-0", "password"), ("user:api-key-0", "token")], writes
    lines = [line for line in srv.stderr_tail(200_000).splitlines() if "switchboard::writes" in line]
    by_auth = [re.search(r' by=("[^"]*") auth=("[^"]*")', line).groups() for line in lines]
    assert by_auth == [('"user:api-key-0"', '"token"'), ('"user:api-key-0"', '"password"'),
                       ('"key:api-key-0"', '"api_key"')], lines
