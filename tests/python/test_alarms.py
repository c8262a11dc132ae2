"""Alarms evaluated by the node (SPEC §7a, docs/alarms.md), tried from outside with httpx-free
plain HTTP and websockets' client: ISA-18.2 states from published values with no screen open,
operators acting as themselves over HTTP and WebSocket, one state on every screen, the journal,
permissions and bad input, a restart, and a two-node cluster on a real redis-server."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from websockets.sync.client import connect as ws_connect

from sb import http, wait_until
from test_auth import API_KEY, SECRET, bearer, token

CONFIG = """
[[alarms]]
id = "boiler-hot"
channel = "pt:boiler.temp"
hi = 80.0
hihi = 95.0
deadband = 2.0
priority = "high"
message = "Boiler temperature high"

[[alarms]]
id = "low"
channel = "pt:line1.*"
lo = 10.0
priority = "critical"

[[alarms]]
id = "quiet"
channel = "pt:feed.flow"
stale_s = 1
bad_quality = false
"""

KEY = {"Authorization": f"Bearer {API_KEY}"}


def write_config(tmp_path, extra: str = "") -> str:
    path = tmp_path / f"alarms{time.monotonic_ns()}.toml"
    path.write_text(CONFIG + extra)
    return str(path)


def pub(node, channel: str, data, headers=KEY) -> None:
    r = http("POST", node.http_url + "/api/publish", {"channel": channel, "data": data}, headers=headers)
    assert r.status == 200, (r.status, r.body)


def get(node, path: str, headers=KEY):
    r = http("GET", node.http_url + path, headers=headers)
    return r.status, r.json() if r.body else None


def post(node, path: str, body=None, headers=KEY):
    r = http("POST", node.http_url + path, body if body is not None else {}, headers=headers)
    return r.status, r.json() if r.body else None


def state(node, alarm: str, headers=KEY) -> dict:
    status, body = get(node, f"/api/alarms/{alarm}", headers)
    assert status == 200, (status, body)
    return body


def wait_state(node, alarm: str, want: str, limit: float = 5.0, headers=KEY) -> dict:
    seen = {}

    def reached():
        s, b = get(node, f"/api/alarms/{alarm}", headers)
        seen["last"] = (s, b)
        return s == 200 and b["state"] == want

    try:
        wait_until(f"{alarm} {want}", reached, limit)
    except AssertionError as e:
        raise AssertionError(f"{e}; last answer {seen.get('last')}") from None
    return seen["last"][1]


def journal(node, **q) -> list:
    query = "&".join(f"{k}={v}" for k, v in q.items())
    status, body = get(node, f"/api/alarms/journal?{query}")
    assert status == 200, (status, body)
    return body["entries"]


def test_alarm_states_follow_isa_18_2_from_published_values(start_server, tmp_path):
    node = start_server("--config", write_config(tmp_path), "--api-key", API_KEY)
    assert state(node, "boiler-hot")["state"] == "normal"
    pub(node, "pt:boiler.temp", {"v": 70})
    pub(node, "pt:boiler.temp", {"v": 83.5})
    s = wait_state(node, "boiler-hot", "active_unacked")
    assert (s["severity"], s["priority"], s["value"], s["active"]) == ("hi", "high", 83.5, True), s
    assert s["message"] == "Boiler temperature high"
    pub(node, "pt:boiler.temp", {"v": 79})  # within the deadband: still hi
    status, s = post(node, "/api/alarms/boiler-hot/ack", {"comment": "called maintenance"})
    assert status == 200 and s["state"] == "active_acked", (status, s)
    assert (s["acked_by"], s["comment"]) == ("key:api-key-0", "called maintenance"), s
    status, again = post(node, "/api/alarms/boiler-hot/ack")
    assert status == 409 and "already acknowledged" in again["error"]["message"], again
    pub(node, "pt:boiler.temp", {"v": 96})
    s = wait_state(node, "boiler-hot", "active_unacked")
    assert s["severity"] == "hihi" and s["acked_by"] is None, "a worse value is unacknowledged again"
    post(node, "/api/alarms/boiler-hot/ack")
    pub(node, "pt:boiler.temp", {"v": 50})
    wait_state(node, "boiler-hot", "normal")
    # Raised and returned before anybody acknowledged: waits in rtn_unacked.
    pub(node, "pt:boiler.temp", 85)
    wait_state(node, "boiler-hot", "active_unacked")
    pub(node, "pt:boiler.temp", 20)
    wait_state(node, "boiler-hot", "rtn_unacked")
    assert post(node, "/api/alarms/boiler-hot/ack")[1]["state"] == "normal"

    # A pattern makes one alarm per channel, named after it.
    pub(node, "pt:line1.t3", {"v": 4, "q": "good"})
    s = wait_state(node, "low.line1.t3", "active_unacked")
    assert (s["def"], s["channel"], s["severity"]) == ("low", "pt:line1.t3", "lo"), s
    # Worst first: unacknowledged critical before the rest.
    status, body = get(node, "/api/alarms")
    assert [a["id"] for a in body["alarms"]][0] == "low.line1.t3", body
    status, body = get(node, "/api/alarms?state=normal")
    assert {a["state"] for a in body["alarms"]} == {"normal"}, body

    # Shelving hides an alarm for a while; the shelf ends into what the condition says.
    status, s = post(node, "/api/alarms/low.line1.t3/shelve", {"for_s": 1, "comment": "sensor swap"})
    assert status == 200 and s["state"] == "shelved" and s["shelved_until"] > s["since"], s
    wait_state(node, "low.line1.t3", "active_unacked", limit=4)
    post(node, "/api/alarms/low.line1.t3/shelve", {"for_s": 600})
    status, s = post(node, "/api/alarms/low.line1.t3/unshelve", {"comment": "back"})
    assert status == 200 and s["state"] == "active_unacked", s

    # No value for stale_s raises the stale alarm, no screen open.
    pub(node, "pt:feed.flow", {"v": 1})
    s = wait_state(node, "quiet", "active_unacked", limit=5)
    assert s["severity"] == "stale", s

    kinds = [e["kind"] for e in journal(node, alarm="boiler-hot", limit=100)]
    assert kinds == ["acked", "returned", "raised", "cleared", "acked", "worsened", "acked", "raised"], kinds
    entries = journal(node, alarm="low", kind="shelved,unshelved")
    assert [(e["kind"], e["user"]) for e in entries] == [
        ("unshelved", "key:api-key-0"), ("shelved", "key:api-key-0"), ("unshelved", None), ("shelved", "key:api-key-0")
    ], entries
    first = journal(node, limit=2)
    status, body = get(node, f"/api/alarms/journal?limit=2&cursor={first[-1]['cursor']}")
    assert body["entries"][0]["t"] <= first[-1]["t"] and body["entries"][0]["cursor"] != first[-1]["cursor"]
    metrics = http("GET", node.http_url + "/metrics").text
    assert 'switchboard_alarm_transitions_total{priority="high",kind="raised"} 2' in metrics, metrics[-2000:]


def test_alarm_one_state_for_every_screen_over_websocket(start_server, tmp_path):
    node = start_server("--config", write_config(tmp_path), "--api-key", API_KEY)
    url = node.ws_url
    with ws_connect(url) as a, ws_connect(url) as b:
        for ws in (a, b):
            ws.send(json.dumps({"id": 1, "subscribe": {"channels": ["alarm:all", "alarm:boiler-hot"], "initial": True}}))
            reply = json.loads(ws.recv(timeout=5))
            assert json.loads(json.dumps(reply))["ok"]["channels"]["alarm:boiler-hot"]["last"]["data"]["state"] == "normal"
        pub(node, "pt:boiler.temp", {"v": 90})

        def next_state(ws, ch="alarm:all"):
            while True:
                for line in ws.recv(timeout=5).split("\n"):
                    m = json.loads(line)
                    if "pub" in m and m["pub"]["ch"] == ch:
                        return m["pub"]["data"]

        assert next_state(a)["state"] == "active_unacked"
        assert next_state(b)["state"] == "active_unacked"
        a.send(json.dumps({"id": 2, "alarm_ack": {"alarm": "boiler-hot", "comment": "on it"}}))
        seen_b = next_state(b)
        assert (seen_b["state"], seen_b["comment"]) == ("active_acked", "on it"), seen_b
        assert seen_b["acked_by"] == "anonymous", "auth is off: anonymous"
        b.send(json.dumps({"id": 3, "alarm_shelve": {"alarm": "boiler-hot", "for_s": 0}}))
        while True:
            m = json.loads(b.recv(timeout=5).split("\n")[-1])
            if m.get("id") == 3:
                break
        assert m["error"]["code"] == 400 and "for_s" in m["error"]["message"], m
        b.send(json.dumps({"id": 4, "alarm_ack": {"alarm": "nope"}}))
        while True:
            m = json.loads(b.recv(timeout=5).split("\n")[-1])
            if m.get("id") == 4:
                break
        assert m["error"]["code"] == 404, m
        # Nobody but the engine publishes alarm states.
        a.send(json.dumps({"id": 5, "publish": {"channel": "alarm:all", "data": {"state": "normal"}}}))
        while True:
            m = json.loads(a.recv(timeout=5).split("\n")[-1])
            if m.get("id") == 5:
                break
        assert m["error"]["code"] == 403, m
    r = http("POST", node.http_url + "/api/publish", {"channel": "alarm:boiler-hot", "data": {}}, headers=KEY)
    assert r.status == 403, r.body


def test_alarm_permissions_and_bad_definitions(start_server, tmp_path):
    extra = '\n[namespaces.pt.allow]\nalarm_ack = "claims"\n'
    node = start_server("--config", write_config(tmp_path, extra), "--jwt-secret", SECRET, "--api-key", API_KEY)
    pub(node, "pt:boiler.temp", {"v": 90})
    wait_state(node, "boiler-hot", "active_unacked")
    viewer = bearer(token({"sub": "vic"}))
    operator = bearer(token({"sub": "ana", "channels": ["pt:boiler.*", "alarm:**"]}))
    assert get(node, "/api/alarms/boiler-hot", viewer)[0] == 200, "anyone authenticated reads"
    assert get(node, "/api/alarms/boiler-hot", {})[0] == 401
    status, body = post(node, "/api/alarms/boiler-hot/ack", {}, viewer)
    assert status == 403 and "acknowledge" in body["error"]["message"], body
    status, body = post(node, "/api/alarms/boiler-hot/ack", {"comment": "ok"}, operator)
    assert status == 200 and body["acked_by"] == "user:ana", body
    assert post(node, "/api/alarms/boiler-hot/shelve", {"for_s": 86401}, operator)[0] == 400
    assert post(node, "/api/alarms/boiler-hot/shelve", {"for_s": 60, "x": 1}, operator)[0] == 400
    assert post(node, "/api/alarms/boiler-hot/snooze", {}, operator)[0] == 404
    assert post(node, "/api/alarms/boiler-hot/ack", {"comment": "x" * 501}, operator)[0] == 400

    def put(id_, body, headers=KEY):
        r = http("PUT", node.http_url + f"/api/alarms/defs/{id_}", body, headers=headers)
        return r.status, r.json() if r.body else None

    for body, field in [
        ({"channel": "pt:x", "hi": 1, "lo": 2}, "hi: must be above lo"),
        ({"channel": "pt:x y", "hi": 1}, "channel:"),
        ({"channel": "alarm:all", "hi": 1}, "channel:"),
        ({"channel": "pt:x", "hi": 1, "priority": "urgent"}, "priority: unknown variant"),
        ({"channel": "pt:x", "bad_quality": False}, "hi: a definition needs"),
        ({"channel": "pt:x", "hi": 1, "stale_s": -1}, "stale_s:"),
    ]:
        status, r = put("d1", body)
        assert status == 400 and field in r["error"]["message"], (body, r)
    assert put("bad%20id", {"channel": "pt:x", "hi": 1})[0] in (400, 404)
    assert put("d1", {"channel": "pt:x", "hi": 1}, operator)[0] == 403, "definitions take an API key"
    assert put("boiler-hot", {"channel": "pt:x", "hi": 1})[0] == 409, "the configuration's are changed there"
    status, r = put("d1", {"channel": "pt:tank.level", "hihi": 9, "priority": "low"})
    assert status == 201 and r["origin"] == "api", r
    assert put("d1", {"channel": "pt:tank.level", "hihi": 8, "priority": "low"})[0] == 200
    pub(node, "pt:tank.level", {"v": 8.5})
    wait_state(node, "d1", "active_unacked")
    status, r = put("d1", {"channel": "pt:tank.level", "hihi": 8, "enabled": False})
    assert status == 200
    wait_state(node, "d1", "out_of_service")
    assert http("DELETE", node.http_url + "/api/alarms/defs/d1", headers=KEY).status == 204
    wait_until("d1 gone", lambda: get(node, "/api/alarms/d1")[0] == 404, 5)
    assert http("DELETE", node.http_url + "/api/alarms/defs/d1", headers=KEY).status == 404
    kinds = [e["kind"] for e in journal(node, alarm="d1")]
    assert kinds[0] == "removed" and "defined" in kinds and "redefined" in kinds and "out_of_service" in kinds, kinds
    assert get(node, "/api/alarms/journal?limit=0")[0] == 400
    assert get(node, "/api/alarms/journal?cursor=nope")[0] == 400
    assert get(node, "/api/alarms/journal?since_ms=abc")[0] == 400


def test_alarm_states_and_journal_survive_a_restart_with_the_memory_broker(start_server, tmp_path):
    data = tmp_path / "data"
    cfg = write_config(tmp_path)
    node = start_server("--config", cfg, "--api-key", API_KEY, "--data-dir", str(data))
    pub(node, "pt:boiler.temp", {"v": 90})
    wait_state(node, "boiler-hot", "active_unacked")
    post(node, "/api/alarms/boiler-hot/ack", {"comment": "before the restart"})
    before = journal(node, alarm="boiler-hot")
    node.terminate()
    node.proc.wait(timeout=10)
    again = start_server("--config", cfg, "--api-key", API_KEY, "--data-dir", str(data))
    s = state(again, "boiler-hot")
    assert (s["state"], s["acked_by"], s["comment"]) == ("active_acked", "key:api-key-0", "before the restart"), s
    assert journal(again, alarm="boiler-hot") == before
    pub(again, "pt:boiler.temp", {"v": 10})
    wait_state(again, "boiler-hot", "normal")
    # A transition of evaluation is journaled by the writer moments after the state shows it.
    wait_until("the clearing journaled", lambda: journal(again, alarm="boiler-hot")[0]["kind"] == "cleared", 5)
    assert [e["kind"] for e in journal(again, alarm="boiler-hot")][:3] == ["cleared", "acked", "raised"]


def test_alarm_cluster_journals_each_transition_once_and_survives_its_evaluator(start_server, redis_url, tmp_path):
    cfg = write_config(tmp_path)

    def start():
        return start_server("--config", cfg, "--broker", redis_url, "--api-key", API_KEY)

    a, b = start(), start()
    for n in (a, b):
        wait_until("alarms loaded", lambda n=n: get(n, "/api/alarms/boiler-hot")[0] == 200, 10)
    pub(b, "pt:boiler.temp", {"v": 90})
    for n in (a, b):
        wait_state(n, "boiler-hot", "active_unacked")
    # Acknowledged on both nodes in turn: one of them forwards to the evaluating one.
    assert post(a, "/api/alarms/boiler-hot/ack", {"comment": "from a"})[0] == 200
    pub(a, "pt:boiler.temp", {"v": 97})
    wait_state(b, "boiler-hot", "active_unacked")
    status, s = post(b, "/api/alarms/boiler-hot/ack", {"comment": "from b"})
    assert status == 200 and s["comment"] == "from b", s
    wait_state(a, "boiler-hot", "active_acked")
    kinds = [e["kind"] for e in journal(a, alarm="boiler-hot")]
    assert kinds == ["acked", "worsened", "acked", "raised"], kinds
    # The evaluating node dies: the other goes on from the stored state within the lease.
    evaluator = a if "alarms: evaluating here" in a.stderr_tail(100_000) else b
    other = b if evaluator is a else a
    os.kill(evaluator.pid, signal.SIGKILL)
    evaluator.proc.wait(timeout=10)
    t0 = time.monotonic()
    wait_until("the other node evaluates", lambda: "alarms: evaluating here" in other.stderr_tail(100_000), 15)
    took = time.monotonic() - t0
    assert took < 12, took
    assert state(other, "boiler-hot")["state"] == "active_acked"
    pub(other, "pt:boiler.temp", {"v": 20})
    wait_state(other, "boiler-hot", "normal")
    c = start()
    wait_state(c, "boiler-hot", "normal")
    kinds = [e["kind"] for e in journal(c, alarm="boiler-hot")]
    assert kinds == ["cleared", "acked", "worsened", "acked", "raised"], kinds


def test_alarm_python_client_acknowledges_and_shelves(start_server, tmp_path):
    from switchboard_client import ConflictError
    from switchboard_client import sync as sbsync

    node = start_server("--config", write_config(tmp_path), "--api-key", API_KEY)
    pub(node, "pt:boiler.temp", {"v": 90})
    wait_state(node, "boiler-hot", "active_unacked")
    with sbsync.Client(node.ws_url) as c:
        s = c.ack("boiler-hot", "from python")
        assert (s["state"], s["comment"]) == ("active_acked", "from python"), s
        with pytest.raises(ConflictError):
            c.ack("boiler-hot")
        assert c.shelve("boiler-hot", 60, "maintenance")["state"] == "shelved"
        assert c.unshelve("boiler-hot")["state"] == "active_unacked"
        sub = c.subscribe("alarm:boiler-hot", initial=True)
        assert sub.get(timeout=5).data["state"] == "active_unacked", "alarm: channels read like any other"
