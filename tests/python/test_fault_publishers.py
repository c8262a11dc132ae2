"""One publisher cannot crowd out the others, and the cluster lists only real nodes
(docs/security.md "The HTTP API", docs/operations.md "Cluster figures").

Black-box, against the real binary, with clients nobody on the project wrote: httpx for the
HTTP API, PyJWT for tokens, `websockets` (through sb.WS) for a subscriber, and a real
`redis-server` for the cluster.
"""

from __future__ import annotations

import base64
import time

import httpx
import jwt
import pytest

import sb
from sb import uniq

SECRET = "fault-publishers-secret-3e2d1c0b9a8f7e6d5c4b3a29"
API_KEY = "fault-publishers-api-key-9a8b7c6d5e4f"
PASSWORD = "fault-publishers-password-1b2c3d"
USER_RATE = 5


def token(sub: str) -> str:
    return jwt.encode({"sub": sub, "exp": int(time.time()) + 600}, SECRET, algorithm="HS256")


def basic(user: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()}


def bearer(credential: str) -> dict:
    return {"Authorization": f"Bearer {credential}"}


@pytest.fixture
def limited_server(start_server, switchboard_bin, tmp_path):
    users = tmp_path / "users"
    sb.add_user(switchboard_bin, users, "grace", PASSWORD)
    return start_server("--users", str(users), "--jwt-secret", SECRET, "--api-key", API_KEY,
                        env={"SWITCHBOARD_PUBLISHES_PER_USER_PER_S": str(USER_RATE)})


def test_fault_publishers_a_user_past_its_rate_gets_429_while_others_keep_publishing(limited_server):
    srv = limited_server
    flooded, other, keyed = uniq("room:g"), uniq("room:a"), uniq("room:k")
    with httpx.Client(base_url=srv.http_url, timeout=10) as http, \
            sb.WS(srv.ws_url + "?token=" + token("watcher")) as ws:
        for ch in (flooded, other, keyed):
            assert "error" not in ws.subscribe([ch])["channels"][ch]
        # One user floods, with Basic credentials and a token of the same `sub` in turn: one
        # rate for the user, whichever credentials it shows. Bounded: at most 200 requests.
        statuses, refused = [], None
        started = time.monotonic()
        for i in range(200):
            auth = basic("grace") if i % 2 == 0 else bearer(token("grace"))
            r = http.post("/api/publish", json={"channel": flooded, "data": i}, headers=auth)
            statuses.append(r.status_code)
            if r.status_code == 429:
                refused = refused or r.json()["error"]
                if statuses.count(429) >= 20:
                    break
        elapsed = time.monotonic() - started
        assert set(statuses) == {200, 429}, statuses
        assert refused["code"] == 429
        assert "limits.publishes_per_user_per_s" in refused["message"], refused
        assert f"more than {USER_RATE} publications per second" in refused["message"], refused
        accepted = statuses.count(200)
        # A burst of two seconds' worth, then the rate: never one bucket per credential.
        assert accepted <= 2 * USER_RATE + USER_RATE * elapsed + 1, (accepted, elapsed)

        # Meanwhile another user and an API key publish as usual.
        alice = bearer(token("alice"))
        # (Alice's own burst: her nine singles and the one-item batch below fit in it.)
        for i in range(2 * USER_RATE - 1):
            r = http.post("/api/publish", json={"channel": other, "data": i}, headers=alice)
            assert r.status_code == 200, r.text
            assert r.json()["offset"] == i + 1
        for i in range(50):
            r = http.post("/api/publish", json={"channel": keyed, "data": i}, headers=bearer(API_KEY))
            assert r.status_code == 200, r.text

        # A batch of the flooded user: what its rate still allows goes through first, the rest
        # gets 429 item by item. Another user's batch still passes.
        batch = [{"channel": flooded, "data": f"b{i}"} for i in range(30)]
        results = http.post("/api/publish", json={"batch": batch}, headers=basic("grace")).json()["results"]
        codes = [x.get("error", {}).get("code", 200) for x in results]
        assert codes.count(429) >= 30 - 2 * USER_RATE and codes == sorted(codes), codes
        accepted += codes.count(200)
        mine = [{"channel": other, "data": "batch"}]
        res = http.post("/api/publish", json={"batch": mine}, headers=alice).json()["results"]
        assert res == [{"offset": 2 * USER_RATE, "epoch": res[0]["epoch"]}], res

        # The subscriber saw exactly the accepted publications, with contiguous offsets: a 429
        # published nothing, and the flood cost the other channels nothing.
        got = ws.pubs(flooded, accepted)
        assert [p["off"] for p in got] == list(range(1, accepted + 1))
        assert [p["off"] for p in ws.pubs(other, 2 * USER_RATE)] == list(range(1, 2 * USER_RATE + 1))
        assert [p["off"] for p in ws.pubs(keyed, 50)] == list(range(1, 51))
        assert not [m for m in ws.drain(0.3) if "pub" in m], "nothing beyond the accepted ones"
        # The flooded user can publish again once its bucket refills.
        deadline = time.monotonic() + 10
        while http.post("/api/publish", json={"channel": flooded, "data": "again"},
                        headers=basic("grace")).status_code != 200:
            assert time.monotonic() < deadline, "the user's rate never refilled"
            time.sleep(0.25)


def _cluster_ids(srv: sb.Server, http: httpx.Client):
    body = http.get(srv.http_url + "/api/info").json()
    return body.get("cluster", {}).get("node_ids")


def test_fault_publishers_a_fresh_cluster_lists_exactly_its_nodes(start_server, redis_url):
    a = start_server("--broker", redis_url, "--node-id", "a")
    b = start_server("--broker", redis_url, "--node-id", "b")
    with httpx.Client(timeout=5) as http:
        # From the moment both answer, no id but theirs is ever listed, and once both are ready
        # (a health check right after the deploy) both are, at once.
        deadline = time.monotonic() + 15
        while True:
            seen = [_cluster_ids(a, http), _cluster_ids(b, http)]
            for ids in seen:
                assert ids is None or set(ids) <= {"a", "b"}, seen
            ready = [http.get(s.http_url + "/readyz").status_code for s in (a, b)]
            if ready == [200, 200]:
                break
            assert time.monotonic() < deadline, ("never ready", ready)
            time.sleep(0.05)
        assert _cluster_ids(a, http) == ["a", "b"]
        assert _cluster_ids(b, http) == ["a", "b"]
        info = http.get(a.http_url + "/api/info").json()
        assert info["cluster"]["nodes"] == 2, info["cluster"]
