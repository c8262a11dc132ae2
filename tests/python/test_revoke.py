"""Disconnect and revoke across a cluster (SPEC §6a): two nodes on a real redis-server, API
calls made on one, connections closed on both; a node started later knows the revocations;
bad input gets clear errors."""

from __future__ import annotations

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
