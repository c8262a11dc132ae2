"""Publishing with `idempotency_key` and publishing through a Redis outage, from the outside:
httpx for `POST /api/publish`, the `websockets` library for subscribers and WebSocket
publishes, and a real `redis-server` this file starts (and stops and restarts by PID on the
same port).

The contract (docs/protocol.md "Publishing exactly once", docs/operations.md):
- a publish retried with the same `idempotency_key` on the same channel within 5 minutes
  answers the first result (same offset and epoch) and publishes nothing;
- a key is 1-128 characters of [A-Za-z0-9_.:-]; anything else is 400 naming the field;
- during a broker outage a publish waits up to 5 s for Redis, then answers 503 (nothing was
  published) or 504 (the outcome is unknown: retry with the same key) - never 500.
"""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from redis_kit import redis  # noqa: F401 (the fixture)
from sb import uniq

JSON_PROTOCOL = "switchboard.v1.json"


@pytest.fixture
def node(start_server, redis):
    return start_server("--broker", redis.url)


def publish(node, channel, data, key=None, timeout=20.0) -> httpx.Response:
    body = {"channel": channel, "data": data}
    if key is not None:
        body["idempotency_key"] = key
    return httpx.post(f"{node.http_url}/api/publish", json=body, timeout=timeout)


class Subscriber:
    """A WebSocket client subscribed to one channel, collecting its pushes."""

    def __init__(self, node, channel):
        # Entered as a context manager (websockets' non-deprecated way to hold a connection);
        # close() ends it.
        self.ws = ws_connect(node.ws_url, subprotocols=[JSON_PROTOCOL], open_timeout=5, proxy=None).__enter__()
        self.channel = channel
        self.pushes: list[dict] = []
        self.next_id = 1
        self.request("connect", {})
        self.request("subscribe", {"channels": [channel]})

    def messages(self, timeout: float):
        for line in self.ws.recv(timeout=timeout).split("\n"):
            if line.strip():
                yield json.loads(line)

    def request(self, command: str, body: dict) -> dict:
        rid = self.next_id
        self.next_id += 1
        self.ws.send(json.dumps({"id": rid, command: body}))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for m in self.messages(timeout=deadline - time.monotonic()):
                if "pub" in m:
                    self.pushes.append(m["pub"])
                elif m.get("id") == rid:
                    return m
        raise AssertionError(f"no reply to {command}")

    def wait_offset(self, offset: int) -> list[int]:
        """Reads pushes until one with `offset` arrived; the offsets pushed, in order."""
        deadline = time.monotonic() + 10
        while not any(p["off"] == offset for p in self.pushes):
            assert time.monotonic() < deadline, f"offset {offset} never pushed: {self.pushes}"
            for m in self.messages(timeout=deadline - time.monotonic()):
                if "pub" in m:
                    self.pushes.append(m["pub"])
        return [p["off"] for p in self.pushes if p["ch"] == self.channel]

    def close(self):
        self.ws.close()


def test_publish_retry_same_key_answers_the_first_result_and_delivers_once(node):
    ch = uniq("room:")
    sub = Subscriber(node, ch)
    try:
        first = publish(node, ch, {"n": 1}, key="order-17")
        assert first.status_code == 200, first.text
        again = publish(node, ch, {"n": 1}, key="order-17")
        assert again.status_code == 200, again.text
        assert again.json() == first.json(), "a retry answers the first offset and epoch"
        # Same key through the WebSocket and in a batch: still the first result.
        ws_again = sub.request("publish", {"channel": ch, "data": {"n": 1}, "idempotency_key": "order-17"})
        assert ws_again["ok"] == first.json(), ws_again
        batch = httpx.post(f"{node.http_url}/api/publish", timeout=20, json={"batch": [
            {"channel": ch, "data": {"n": 1}, "idempotency_key": "order-17"},
            {"channel": ch, "data": {"n": 2}, "idempotency_key": "order-18"},
            {"channel": ch, "data": {"n": 2}, "idempotency_key": "order-18"},
        ]})
        assert batch.status_code == 200, batch.text
        results = batch.json()["results"]
        assert results[0] == first.json()
        assert results[1]["offset"] == first.json()["offset"] + 1
        assert results[2] == results[1]
        last = publish(node, ch, {"n": 3})
        assert last.status_code == 200
        offsets = sub.wait_offset(last.json()["offset"])
        o = first.json()["offset"]
        assert offsets == [o, o + 1, o + 2], "each publication delivered once"
        history = httpx.get(f"{node.http_url}/api/channels/{ch}/history", timeout=10).json()
        assert [p["data"]["n"] for p in history["publications"]] == [1, 2, 3]
    finally:
        sub.close()


def test_publish_retry_different_keys_and_no_key_publish_again(node):
    ch = uniq("room:")
    a = publish(node, ch, {"n": 1}, key="a-1").json()
    b = publish(node, ch, {"n": 1}, key="a-2").json()
    c = publish(node, ch, {"n": 1}).json()
    d = publish(node, ch, {"n": 1}).json()
    assert [a["offset"], b["offset"], c["offset"], d["offset"]] == [1, 2, 3, 4]
    # A key is per channel: the same key elsewhere publishes there.
    other = publish(node, uniq("room:"), {"n": 1}, key="a-1").json()
    assert other["offset"] == 1


@pytest.mark.parametrize("key", ["", "has space", "x" * 129, "brace{}", "slash/", 17, "é"])
def test_publish_retry_bad_keys_are_400_naming_the_field(node, key):
    ch = uniq("room:")
    r = publish(node, ch, {"n": 1}, key=key)
    assert r.status_code == 400, r.text
    assert "idempotency_key" in r.text
    r = httpx.post(f"{node.http_url}/api/publish", timeout=10,
                   json={"batch": [{"channel": ch, "data": 1, "idempotency_key": key}]})
    if r.status_code == 200:
        error = r.json()["results"][0]["error"]
        assert error["code"] == 400 and "idempotency_key" in error["message"], error
    else:
        assert r.status_code == 400 and "idempotency_key" in r.text, r.text
    with ws_connect(node.ws_url, subprotocols=[JSON_PROTOCOL], open_timeout=5, proxy=None) as ws:
        ws.send(json.dumps({"id": 1, "publish": {"channel": ch, "data": 1, "idempotency_key": key}}))
        reply = json.loads(ws.recv(timeout=10).split("\n")[0])
        assert reply["error"]["code"] == 400 and "idempotency_key" in reply["error"]["message"], reply
    assert httpx.get(f"{node.http_url}/api/channels/{ch}/history", timeout=10).status_code == 404


def test_publish_retry_through_a_redis_outage_waits_or_answers_503_never_500(node, redis):
    """Redis is killed, publishes are made while it is down, and it is started again on the
    same port within the 5 s wait: each publish succeeds after the wait or answers 503/504,
    and retrying the unknown ones with their key never publishes twice."""
    ch = uniq("room:")
    assert publish(node, ch, {"n": 0}, key="before").status_code == 200
    redis.kill()
    answers: dict[str, httpx.Response] = {}

    def one(key: str):
        answers[key] = publish(node, ch, {"k": key}, key=key)

    threads = [threading.Thread(target=one, args=(f"during-{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the publishes are waiting for Redis by now; bring it back within the bound
    redis.start()
    for t in threads:
        t.join(timeout=30)
    codes = {k: r.status_code for k, r in answers.items()}
    print("answers during the outage:", sorted(codes.values()))
    assert len(codes) == 8
    assert all(c in (200, 503, 504) for c in codes.values()), {k: (r.status_code, r.text) for k, r in answers.items()}
    for k, r in answers.items():
        if r.status_code == 503:
            assert "retry" in r.json()["error"]["message"] if "error" in r.json() else "retry" in r.text
        if r.status_code == 504:
            assert "idempotency_key" in r.text
    # Retries with the same keys: every one ends published exactly once.
    retried = {k: publish(node, ch, {"k": k}, key=k) for k in answers}
    assert all(r.status_code == 200 for r in retried.values()), {k: r.text for k, r in retried.items()}
    for k, r in answers.items():
        if r.status_code == 200:
            assert retried[k].json() == r.json(), "a retry of a published key answers its first result"
    history = httpx.get(f"{node.http_url}/api/channels/{ch}/history?limit=100", timeout=10).json()
    published = [p["data"]["k"] for p in history["publications"] if "k" in p["data"]]
    assert sorted(published) == sorted(answers), f"each key published once: {published}"


def test_publish_retry_during_a_long_outage_answers_503_not_500(node, redis):
    """Redis stays down past the 5 s wait: the publish answers 503 (nothing published), never
    500; once Redis is back the same key publishes it once."""
    ch = uniq("room:")
    redis.kill()
    try:
        started = time.monotonic()
        plain = publish(node, ch, {"n": 2})
        waited = time.monotonic() - started
        assert plain.status_code in (503, 504), (plain.status_code, plain.text)
        assert waited >= 4.0, f"answered after {waited:.1f} s, before the documented 5 s wait"
        r = publish(node, ch, {"n": 1}, key="late-1")
        assert r.status_code in (503, 504), (r.status_code, r.text)
        print("answers past the wait:", plain.status_code, r.status_code, plain.json()["error"]["message"])
        # Each answer is counted by its outcome.
        text = httpx.get(f"{node.http_url}/metrics", timeout=10).text
        counted = {o: float(re.search(rf'switchboard_broker_failures_total{{outcome="{o}"}} (\S+)', text).group(1))
                   for o in ("unavailable", "unknown")}
        codes = [plain.status_code, r.status_code]
        assert counted["unavailable"] >= codes.count(503) and counted["unknown"] >= codes.count(504), counted
    finally:
        redis.start()
    again = publish(node, ch, {"n": 1}, key="late-1")
    assert again.status_code == 200, again.text
    assert publish(node, ch, {"n": 1}, key="late-1").json() == again.json()
