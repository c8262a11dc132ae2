"""Internal error text stays out of replies (docs/api.md, "Errors"; docs/protocol.md, "Codes"):
with its Redis killed, a node answers 503 with a generic message — no Redis or socket error
text, no address — over HTTP and WebSocket, and logs the detail; a dashboard store that fails
is answered 500 `dashboard store unavailable (...)` without the io error or the path.
Clients: httpx and sb.WS; Redis from redis_kit (killed by PID)."""

from __future__ import annotations

import httpx

from redis_kit import redis  # noqa: F401 (the fixture)
from sb import WS, api_publish, ch_path, uniq, wait_until

# What a broker's or the operating system's error text carries.
INTERNAL = ("connection refused", "os error", "broken pipe", "reset by peer", "redis:", "io error",
            "127.0.0.1", "errno", "not connected")


def assert_generic(message: str, *also: str) -> None:
    lowered = message.lower()
    leaked = [w for w in INTERNAL + also if w.lower() in lowered]
    assert not leaked, (leaked, message)


def test_error_text_broker_down_is_503_without_the_redis_error(start_server, redis):
    srv = start_server("--broker", redis.url)
    c = httpx.Client(base_url=srv.http_url, timeout=60, trust_env=False)
    wait_until("the node reaches Redis", lambda: c.get("/readyz").status_code == 200, 15)
    ch = uniq("room:")
    api_publish(srv, ch, "before")
    redis.kill()
    port = str(redis.port)

    r = c.get(f"/api/channels/{ch_path(ch)}/history")
    assert r.status_code == 503, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err == {"code": 503, "message": "broker unavailable; nothing was done, retry later"}, err

    r = c.get(f"/api/channels/{ch_path(ch)}")
    assert r.status_code == 503 and r.json()["error"] == err, r.text[:300]

    r = c.post("/api/publish", json={"channel": ch, "data": "after"})
    assert r.status_code in (503, 504), (r.status_code, r.text[:300])
    assert_generic(r.json()["error"]["message"], port)

    with WS(srv.ws_url) as ws:
        reply = ws.request("history", {"channel": ch}, timeout=60)
        assert reply["error"] == err, reply

    # The detail is in the node's log.
    wait_until("the broker failure is logged", lambda: "broker unavailable" in srv.stderr_tail(20_000), 10)


def test_error_text_dashboard_store_failure_is_500_with_a_generic_message(start_server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    # A file where the store's directory should be: every read and write of the store fails
    # (as root too, whom permissions would not stop).
    (data / "dashboards").write_text("not a directory")
    srv = start_server(env={"SWITCHBOARD_DATA_DIR": str(data)})
    c = httpx.Client(base_url=srv.http_url, timeout=30, trust_env=False)
    answers = [
        ("listing dashboards", c.get("/api/dashboards")),
        ("reading dashboard", c.get("/api/dashboards/plant")),
        ("creating the data directory", c.put("/api/dashboards/plant", json={"title": "Plant", "widgets": []})),
    ]
    for what, r in answers:
        assert r.status_code == 500, (what, r.status_code, r.text[:300])
        err = r.json()["error"]
        assert err == {"code": 500, "message": f"dashboard store unavailable ({what})"}, err
        assert_generic(err["message"], str(tmp_path), "not a directory", "file exists")
    wait_until("the store failure is logged", lambda: "dashboard store" in srv.stderr_tail(20_000), 10)
    # Once the store works again, so do the requests.
    (data / "dashboards").unlink()
    assert c.put("/api/dashboards/plant", json={"title": "Plant", "widgets": []}).status_code == 201
    assert [d["id"] for d in c.get("/api/dashboards").json()] == ["plant"]
