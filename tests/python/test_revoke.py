"""Disconnect and revoke across a cluster (SPEC §6a): two nodes on a real redis-server, API
calls made on one, connections closed on both; a node started later knows the revocations;
bad input gets clear errors."""

from __future__ import annotations

import subprocess
import time

import pytest

from sb import http, wait_until
from test_auth import API_KEY, SECRET, AuthWS, bearer, token


def api(node, path, body, key=API_KEY):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return http("POST", node.http_url + path, body, headers=headers)


@pytest.fixture
def cluster(start_server, redis_url):
    def start():
        return start_server("--broker", redis_url, "--jwt-secret", SECRET, "--api-key", API_KEY)
    a, b = start(), start()
    a.start_more = start
    return a, b


def client(node, **claims) -> AuthWS:
    ws = AuthWS(node.ws_url, headers=bearer(token(claims)))
    ws.ok("ping", {})
    return ws


def closed_with(ws, code: int, reason: str) -> None:
    closed = ws.wait_closed(timeout=10)
    assert (closed.code, closed.reason) == (code, reason), (closed.code, closed.reason)
    (disc,) = [m["disconnect"] for m in closed.messages if "disconnect" in m]
    assert disc["reconnect"] is False, disc


def test_revoke_disconnect_closes_the_user_on_every_node(cluster):
    a, b = cluster
    on_a, on_b = client(a, sub="bob"), client(b, sub="bob")
    other = client(b, sub="carol")
    r = api(a, "/api/disconnect", {"user": "bob"})
    assert r.status == 200 and r.json() == {"disconnected_here": 1}, (r.status, r.body)
    closed_with(on_a, 4003, "disconnected by the application")
    closed_with(on_b, 4003, "disconnected by the application")
    assert "ok" in other.request("ping", {}), "other users stay"
    # Unknown users are not an error.
    assert api(b, "/api/disconnect", {"user": "nobody-at-all"}).json() == {"disconnected_here": 0}


def test_revoke_by_jti_and_by_user_on_every_node_and_for_later_nodes(cluster):
    a, b = cluster
    exp = int(time.time()) + 600
    by_jti = client(b, sub="dan", jti="t-1", exp=exp)
    same_user_other_token = client(b, sub="dan", jti="t-2", exp=exp)
    r = api(a, "/api/revoke", {"jti": "t-1", "expire_at": exp})
    assert r.status == 200, (r.status, r.body)
    closed_with(by_jti, 4001, "token revoked")
    assert "ok" in same_user_other_token.request("ping", {})
    for node in (a, b):
        ws = AuthWS(node.ws_url, headers=bearer(token(sub="dan", jti="t-1", exp=exp)))
        closed_with(ws, 4001, "token revoked")
    # A user's tokens issued before a time.
    cut = int(time.time())
    old = client(a, sub="eve", iat=cut - 60)
    assert api(b, "/api/revoke", {"user": "eve", "issued_before": cut}).status == 200
    closed_with(old, 4001, "token revoked")
    fresh = client(a, sub="eve", iat=cut + 1)
    assert "ok" in fresh.request("ping", {})
    # Refresh with a revoked token is refused too.
    r = fresh.request("refresh", {"token": token(sub="eve", iat=cut - 5)})
    assert r["error"] == {"code": 401, "message": "token revoked"}, r
    # A node that starts later reads the record.
    c = a.start_more()
    def refused_on_c():
        ws = AuthWS(c.ws_url, headers=bearer(token(sub="dan", jti="t-1", exp=exp)))
        reply = None
        try:
            reply = ws.request("ping", {}, timeout=5)
        except Exception:
            pass
        ws.close()
        return reply is None
    wait_until("the late node knows the revocation", refused_on_c, 10, every=0.2)
    ws = AuthWS(c.ws_url, headers=bearer(token(sub="eve", iat=cut - 1)))
    closed_with(ws, 4001, "token revoked")


def test_revoke_bad_input_is_refused_clearly(cluster):
    a, _ = cluster
    for body, want in [({}, 400), ({"jti": "x", "user": "y"}, 400), ({"user": "y"}, 400),
                       ({"jti": ""}, 400), ({"jti": "x", "nope": 1}, 400), ("not an object", 400)]:
        r = api(a, "/api/revoke", body)
        assert r.status == want and r.json()["error"]["message"], (body, r.status, r.body)
    r = http("POST", a.http_url + "/api/revoke", raw=b"{broken", headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status == 400, r.body
    assert api(a, "/api/disconnect", {"who": "x"}).status == 400
    assert api(a, "/api/disconnect", {"user": "x"}, key=None).status == 401
    assert api(a, "/api/disconnect", {"user": "x"}, key=token(sub="x")).status == 403
    assert api(a, "/api/revoke", {"jti": "x", "expire_at": 1}).status == 200, "an expired entry is a no-op"
    r = api(a, "/api/revoke", {"user": "ghost-never-seen", "issued_before": int(time.time())})
    assert r.status == 200 and r.json() == {"closed_here": 0}, (r.status, r.body)


def test_revoke_times_beyond_any_token_are_refused_naming_the_field(cluster):
    a, _ = cluster
    now = int(time.time())
    keep = 86400  # auth.revocation_keep_s unset: one day, the longest token lifetime accepted
    for body, field in [({"jti": "x", "expire_at": 2**64 - 1}, "expire_at"),
                        ({"jti": "x", "expire_at": now + keep + 3600}, "expire_at"),
                        ({"user": "u", "issued_before": now * 1000}, "issued_before"),
                        ({"user": "u", "issued_before": 2**64 - 1}, "issued_before")]:
        r = api(a, "/api/revoke", body)
        assert r.status == 400, (body, r.status, r.body)
        assert r.json()["error"]["message"].startswith(field), (body, r.body)
    # Within the bounds (a caller's clock a little ahead included): taken.
    assert api(a, "/api/revoke", {"jti": "x", "expire_at": now + keep}).status == 200
    assert api(a, "/api/revoke", {"user": "u", "issued_before": now + 60}).status == 200
    # A token living longer than any revocation is kept is refused, on every transport.
    long_lived = token(sub="zoe", exp=now + keep + 3600)
    ws = AuthWS(a.ws_url, headers=bearer(long_lived))
    closed = ws.wait_closed(timeout=10)
    assert closed.code == 4001 and "revocation_keep_s" in closed.reason, (closed.code, closed.reason)
    r = http("GET", a.http_url + "/api/info", headers=bearer(long_lived))
    assert r.status == 401 and "revocation_keep_s" in r.json()["error"]["message"], (r.status, r.body)


def _revoke_all(node, bodies, workers: int = 8) -> list:
    """POSTs each body to `/api/revoke` from `workers` kept-alive connections; the answers, in order."""
    import concurrent.futures

    import httpx

    def run(part):
        with httpx.Client(base_url=node.http_url, headers={"Authorization": f"Bearer {API_KEY}"},
                          timeout=30) as c:
            return [c.post("/api/revoke", json=b) for b in part]

    parts = [bodies[i::workers] for i in range(workers)]
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        done = list(ex.map(run, parts))
    out = [None] * len(bodies)
    for w, answers in enumerate(done):
        for j, r in enumerate(answers):
            out[w + j * workers] = r
    return out


def _refused(node, **claims) -> bool:
    ws = AuthWS(node.ws_url, headers=bearer(token(**claims)))
    try:
        ws.request("ping", {}, timeout=5)
        return False
    except Exception:
        closed = ws.closed
        return closed is not None and (closed.code, closed.reason) == (4001, "token revoked")
    finally:
        ws.close()


def test_revoke_a_flood_holds_on_nodes_started_before_during_and_after_it(start_server, redis_url):
    # The list fills with distinct entries while a second node starts; repeats then change
    # nothing (the full list takes them), expired entries make room first, and a new entry past
    # the bound is 429 with Retry-After. Every node, the one started after the flood included,
    # refuses tokens revoked at its start, middle and end.
    env = {"SWITCHBOARD_AUTH__REVOCATION_KEEP_S": "7200"}
    start = lambda: start_server("--broker", redis_url, "--jwt-secret", SECRET, "--api-key", API_KEY, env=env)
    a = start()
    now = int(time.time())
    first = [{"jti": "soon", "expire_at": now + 3}, {"jti": "early", "expire_at": now + 3600}]
    rest = [{"jti": f"f-{i}", "expire_at": now + 3600} for i in range(9_996)]
    rest.insert(5_000, {"jti": "mid", "expire_at": now + 3600})
    rest.append({"jti": "late", "expire_at": now + 3600})
    assert len(first) + len(rest) == 10_000
    answers = _revoke_all(a, first, workers=1)
    import threading
    flooded: list = []
    flood = threading.Thread(target=lambda: flooded.extend(_revoke_all(a, rest)))
    flood.start()
    # Node b starts while the flood goes on (from this thread: a node dies with the thread
    # that started it).
    wait_until("the flood to start", lambda: subprocess.run(
        ["redis-cli", "-p", redis_url.rsplit(":", 1)[1], "ZCARD", "sb:rec:{$revoke}:x"], capture_output=True,
        text=True, timeout=10).stdout.strip() not in ("", "0", "1", "2"), 30, every=0.05)
    b = start()
    flood.join()
    answers += flooded
    assert [r.status_code for r in answers] == [200] * 10_000
    # Repeats of held entries: one entry each, so the full list takes them.
    again = _revoke_all(a, [{"jti": "early", "expire_at": now + 3600}] * 300 + [{"jti": "mid", "expire_at": now + 60}] * 50)
    assert {r.status_code for r in again} == {200}
    # A new entry: room only once "soon" expired.
    wait_until("the short entry to expire", lambda: time.time() > now + 4, 10, every=0.2)
    assert api(a, "/api/revoke", {"jti": "in-the-room-soon-left", "expire_at": now + 3600}).status == 200
    r = _revoke_all(a, [{"jti": "one-too-many", "expire_at": now + 3600}], workers=1)[0]
    assert r.status_code == 429, (r.status_code, r.text)
    assert "10000" in r.json()["error"]["message"], r.text
    retry = int(r.headers["Retry-After"])
    assert 3000 < retry <= 3600, retry  # when the soonest entry leaves, not 1 s
    # The record in Redis lives as long as its last entry, whatever the channels' idle times.
    port = redis_url.rsplit(":", 1)[1]
    pttl = int(subprocess.run(["redis-cli", "-p", port, "PTTL", "sb:rec:{$revoke}"], capture_output=True,
                              text=True, timeout=10).stdout.strip())
    assert 3000_000 < pttl <= 3600_000, pttl
    c = start()
    for node in (a, b, c):
        for jti in ("early", "mid", "late", "in-the-room-soon-left"):
            assert wait_until(f"{jti} refused on {node.http_url}", lambda: _refused(node, sub="ivy", jti=jti), 10,
                              every=0.2)
        assert not _refused(node, sub="ivy", jti="one-too-many"), "the refused entry revokes nothing"
