"""Idempotency keys belong to their publisher and are bounded (SPEC §6a, docs/protocol.md
"Publishing exactly once"), from the outside: httpx for `POST /api/publish`, the `websockets`
library (through `AuthWS`) for WebSocket publishes and subscribers, PyJWT tokens.

- A key answers only its own publisher's retries: another user, or an API key, publishing on
  the same channel with the same key publishes its own data (on the memory broker and on a
  real redis-server);
- the memory broker holds at most 10,000 keys per channel and 100,000 in all; past either a
  keyed publish is 429 with `Retry-After`, never published without its key, while unkeyed
  publishes and retries of held keys go on.
"""

from __future__ import annotations

import httpx
import pytest

from redis_kit import redis  # noqa: F401 (the fixture)
from sb import uniq
from test_auth import API_KEY, SECRET, AuthWS, bearer, token

MAX_KEYS_PER_CHANNEL = 10_000
MAX_KEYS = 100_000


@pytest.fixture(params=["memory", "redis"])
def node(request, start_server):
    broker = "memory" if request.param == "memory" else request.getfixturevalue("redis").url
    return start_server("--broker", broker, "--jwt-secret", SECRET, "--api-key", API_KEY)


def ws_publish(ws, channel, data, key):
    return ws.request("publish", {"channel": channel, "data": data, "idempotency_key": key})


def api_publish(node, body, key=API_KEY) -> httpx.Response:
    return httpx.post(f"{node.http_url}/api/publish", json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=60)


def test_idempotency_keys_answer_only_their_own_publishers_retries(node):
    ch = uniq("room:orders-")
    watcher = AuthWS(node.ws_url, headers=bearer(token(sub="watcher")))
    watcher.subscribe([ch])
    bob = AuthWS(node.ws_url, headers=bearer(token(sub="bob")))
    alice = AuthWS(node.ws_url, headers=bearer(token(sub="alice")))
    # A token whose sub spells an API key's audit name is still a user.
    spoof = AuthWS(node.ws_url, headers=bearer(token(sub="key:api-key-0")))
    first = ws_publish(bob, ch, {"by": "bob"}, "order-1001")["ok"]
    assert ws_publish(bob, ch, {"by": "bob, again"}, "order-1001")["ok"] == first, "bob's retry: his first answer"
    theirs = ws_publish(alice, ch, {"by": "alice"}, "order-1001")["ok"]
    assert theirs["offset"] == first["offset"] + 1, (first, theirs)
    spoofed = ws_publish(spoof, ch, {"by": "spoof"}, "order-1001")["ok"]
    keyed = api_publish(node, {"channel": ch, "data": {"by": "api key"}, "idempotency_key": "order-1001"})
    assert keyed.status_code == 200, keyed.text
    assert keyed.json()["offset"] == spoofed["offset"] + 1
    again = api_publish(node, {"channel": ch, "data": {"by": "api key, again"}, "idempotency_key": "order-1001"})
    assert again.json() == keyed.json(), "the API key's retry: its first answer"
    got = [p["data"]["by"] for p in watcher.pubs(ch, 4)]
    assert got == ["bob", "alice", "spoof", "api key"], got
    # The same key on another channel is another key.
    other = ws_publish(bob, uniq("room:other-"), {"by": "bob"}, "order-1001")["ok"]
    assert other["offset"] == 1


def test_idempotency_keys_are_bounded_per_channel_and_per_node(start_server):
    # Batches of thousands a second: past the API key's default publish rate.
    node = start_server("--api-key", API_KEY, env={"SWITCHBOARD_LIMITS__PUBLISHES_PER_API_KEY_PER_S": "10000000"})
    ch = uniq("room:keyed-")
    for start in range(0, MAX_KEYS_PER_CHANNEL, 2_000):
        batch = [{"channel": ch, "data": i, "idempotency_key": f"k-{i}"} for i in range(start, start + 2_000)]
        r = api_publish(node, {"batch": batch})
        assert r.status_code == 200 and all("offset" in x for x in r.json()["results"]), r.text[:300]
    # Full: a new key is refused with when to come back (the oldest key's window), a held key
    # still answers its first result, and an unkeyed publication is published.
    r = api_publish(node, {"channel": ch, "data": "one more", "idempotency_key": "k-new"})
    assert r.status_code == 429, r.text
    assert "the channel holds its maximum of 10000 idempotency keys" in r.json()["error"]["message"], r.text
    assert 200 < int(r.headers["Retry-After"]) <= 300, r.headers
    r = api_publish(node, {"channel": ch, "data": "a retry", "idempotency_key": "k-7"})
    assert r.status_code == 200 and r.json()["offset"] == 8, r.text
    r = api_publish(node, {"channel": ch, "data": "no key"})
    assert r.status_code == 200 and r.json()["offset"] == MAX_KEYS_PER_CHANNEL + 1, r.text
    # In a batch the refused item fails alone.
    r = api_publish(node, {"batch": [{"channel": ch, "data": 1, "idempotency_key": "k-new"},
                                     {"channel": ch, "data": 2}]})
    first, second = r.json()["results"]
    assert first["error"]["code"] == 429 and "offset" in second, r.json()
    # The node's bound: keys over many channels.
    held = MAX_KEYS_PER_CHANNEL
    n = 0
    while held < MAX_KEYS:
        batch = [{"channel": f"{ch}-{n}-{i % 10}", "data": i, "idempotency_key": f"k-{i}"} for i in range(5_000)]
        r = api_publish(node, {"batch": batch})
        refused = [x for x in r.json()["results"] if "offset" not in x]
        assert r.status_code == 200 and not refused, refused[:3]
        held += 5_000
        n += 1
    r = api_publish(node, {"channel": uniq("room:fresh-"), "data": 1, "idempotency_key": "k-1"})
    assert r.status_code == 429, r.text
    assert "this node holds its maximum of 100000 idempotency keys" in r.json()["error"]["message"], r.text
    assert int(r.headers["Retry-After"]) >= 1
    assert api_publish(node, {"channel": uniq("room:fresh-"), "data": 1}).status_code == 200
