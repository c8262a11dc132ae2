"""Hooks under load and failure (docs/backend.md, "Calls in flight" and "A hook that fails
refuses"): the node's calls in flight to the backend are capped (`proxy.max_in_flight`) however
many clients subscribe; a call that gets no slot in time fails like a timed-out hook; a burst of
failing calls writes a few log lines with a count of those left out; and the reason a client is
given never carries the node's own error text (a refused connection, an errno). Against the
real binary, a Python hook backend (backend_kit.HookBackend) and independent clients."""

from __future__ import annotations

import http.client as httpclient
import json
import re
import socket
import threading
import time

import pytest

import sb
from backend_kit import HookBackend
from sb import http, uniq
from test_auth import API_KEY, AuthWS

# What a client must never see: the node's socket errors and the HTTP client's wording.
INTERNAL = ("refused", "os error", "errno", "tcp", "connect error", "hyper", "dns", "111")


def hooks_config(tmp_path, *, connect: str, subscribe: str, timeout_ms: int, max_in_flight: int | None = None) -> str:
    path = tmp_path / "hooks.toml"
    cap = f"max_in_flight = {max_in_flight}\n" if max_in_flight is not None else ""
    path.write_text(f"""
[proxy]
connect_url = "{connect}/connect"
subscribe_url = "{subscribe}/subscribe"
timeout_ms = {timeout_ms}
{cap}
[namespaces.app]
proxy_subscribe = true
""")
    return str(path)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def backend():
    b = HookBackend()
    yield b
    b.close()


def test_hooks_node_wide_cap_holds_however_many_clients_subscribe(start_server, backend, tmp_path):
    cap, clients, per_client = 4, 12, 6
    backend.answers["connect"] = {"result": {"user": "ann"}}
    backend.answers["subscribe"] = "slow"
    backend.slow_s = 0.25
    # The deadline is long enough for every queued call to get a slot: calls wait, none fails.
    node = start_server("--config", hooks_config(tmp_path, connect=backend.url(""), subscribe=backend.url(""),
                                                 timeout_ms=20_000, max_in_flight=cap))
    sockets = []
    for _ in range(clients):
        ws = AuthWS(node.ws_url)
        ws.ok("connect", {})
        sockets.append(ws)
    results: list = [None] * clients

    def subscribe(i):
        channels = ["app:" + uniq() for _ in range(per_client)]
        results[i] = sockets[i].request("subscribe", {"channels": channels}, timeout=60)

    threads = [threading.Thread(target=subscribe, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert all(not t.is_alive() for t in threads)
    for r in results:
        got = r["ok"]["channels"]
        assert all("offset" in v for v in got.values()), got
    assert len(backend.calls_of("subscribe")) == clients * per_client
    # Each client alone would have all its calls in flight at once (clients x per_client).
    assert backend.max_in_flight <= cap, backend.max_in_flight
    assert backend.max_in_flight >= 2, backend.max_in_flight
    for ws in sockets:
        ws.close()


def test_hooks_call_without_a_slot_in_time_fails_like_a_timed_out_hook(start_server, backend, tmp_path):
    backend.answers["connect"] = {"result": {"user": "ann"}}
    backend.answers["subscribe"] = "slow"
    backend.slow_s = 3.0
    node = start_server("--config", hooks_config(tmp_path, connect=backend.url(""), subscribe=backend.url(""),
                                                 timeout_ms=800, max_in_flight=1))
    ws = AuthWS(node.ws_url)
    ws.ok("connect", {})
    # Four calls at once for one slot, each with 800 ms: the first holds the slot until its
    # deadline, which is the others' too; a slot freed with under 10 ms left is not taken
    # (docs/backend.md), so the others fail unsent.
    channels = ["app:" + uniq() for _ in range(4)]
    got = ws.request("subscribe", {"channels": channels}, timeout=10)["ok"]["channels"]
    for ch in channels:
        err = got[ch]["error"]
        assert err["code"] == 503 and err["message"] == "the application's backend is unavailable (subscribe hook)", err
    assert len(backend.calls_of("subscribe")) <= 2, backend.calls_of("subscribe")
    assert sb.metric(node, "switchboard_hook_busy_total", required=True, hook="subscribe") >= 2
    ws.close()


def warning_lines(node) -> list[str]:
    with open(node.stderr_path, encoding="utf-8", errors="replace") as f:
        return [line for line in f if "application's backend failed" in line]


def test_hooks_failure_warnings_are_rate_limited_with_a_suppressed_count(start_server, backend, tmp_path):
    backend.answers["connect"] = {"result": {"user": "ann"}}
    node = start_server("--config", hooks_config(tmp_path, connect=backend.url(""), subscribe=closed_port_url(),
                                                 timeout_ms=2000))
    ws = AuthWS(node.ws_url)
    ws.ok("connect", {})
    channels = ["app:" + uniq() for _ in range(200)]
    got = ws.request("subscribe", {"channels": channels}, timeout=30)["ok"]["channels"]
    assert all(v["error"]["code"] == 503 for v in got.values()), got
    assert sb.metric(node, "switchboard_hook_errors_total", required=True, hook="subscribe") == 200
    lines = warning_lines(node)
    assert 1 <= len(lines) <= 3, lines
    # The next failure after the interval (log_limit::INTERVAL, 10 s) says how many were left out.
    time.sleep(10.5)
    ch = "app:" + uniq()
    assert ws.request("subscribe", {"channels": [ch]})["ok"]["channels"][ch]["error"]["code"] == 503
    lines = sb.wait_until("the next warning line", lambda: warning_lines(node)[1:] or None, 5)
    counts = [int(m.group(1)) for m in (re.search(r"suppressed=(\d+)", line) for line in lines) if m]
    assert counts and counts[0] >= 197, lines
    ws.close()


def test_hooks_failure_reasons_to_clients_are_generic(start_server, tmp_path):
    dead = closed_port_url()
    node = start_server("--config", hooks_config(tmp_path, connect=dead, subscribe=dead, timeout_ms=1000),
                        "--api-key", API_KEY)
    # WebSocket: the connect hook is asked on the first message; 4503 with a generic reason.
    ws = AuthWS(node.ws_url)
    ws.send({"id": 1, "connect": {}})
    closed = ws.wait_closed(timeout=10)
    assert closed.code == 4503, (closed.code, closed.reason)
    assert "backend" in closed.reason and "unavailable" in closed.reason, closed.reason
    assert not any(word in closed.reason.lower() for word in INTERNAL), closed.reason
    # SSE: the connect hook runs at the open; 503 with the JSON error, generic too.
    conn = httpclient.HTTPConnection("127.0.0.1", node.port, timeout=10)
    conn.request("GET", f"/sse?channels=room:{uniq()}")
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    assert resp.status == 503, (resp.status, body)
    message = json.loads(body)["error"]["message"]
    assert "backend" in message and not any(word in message.lower() for word in INTERNAL), message
    # Long-polling: the session's refusal comes as a disconnect with the same reason.
    opened = http("POST", node.http_url + "/poll", raw=b'{"id": 1, "connect": {}}')
    text = opened.body.decode()
    if opened.status == 200:
        text = http("GET", node.http_url + f"/poll/{opened.json()['session']}?timeout=2").body.decode()
    assert "backend" in text and not any(word in text.lower() for word in INTERNAL), (opened.status, text)
    # The cause is the operator's: in the log.
    assert any("refused" in line.lower() for line in warning_lines(node)), warning_lines(node)
