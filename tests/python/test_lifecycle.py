"""Channel lifecycle (docs/operations.md, "Bounded state"): a channel with no subscriber, no
present client and no publication for its namespace's `channel_ttl_s` is forgotten entirely;
a client recovering it learns `complete: false` from its new epoch. Driven with urllib and
Python `websockets` against a server whose `room` channels are kept for 1 s."""

from __future__ import annotations

import time

from sb import WS, api_publish, ch_path, http, uniq

ONE_SECOND_ROOMS = {"SWITCHBOARD_NAMESPACES__ROOM__CHANNEL_TTL_S": "1"}


def status(server, channel: str) -> int:
    return http("GET", server.http_url + "/api/channels/" + ch_path(channel)).status


def wait_status(server, channel: str, want: int, limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while status(server, channel) != want:
        assert time.monotonic() < deadline, f"{channel} still not {want} after {limit} s"
        time.sleep(0.1)


def forgotten_total(server) -> int:
    text = http("GET", server.http_url + "/metrics").body.decode()
    line = next(l for l in text.splitlines() if l.startswith("switchboard_channels_forgotten_total "))
    return int(line.split()[1])


def test_idle_channels_are_forgotten_and_recovering_clients_learn_it(start_server):
    server = start_server(env=ONE_SECOND_ROOMS)
    idle, held, point = uniq("room:idle-"), uniq("room:held-"), uniq("pt:valve-")
    first = api_publish(server, idle, {"v": 1})
    api_publish(server, point, {"v": 7})
    with WS(server.ws_url) as ws:
        ws.subscribe([held])
        api_publish(server, held, {"v": 2})
        # Forgotten within about a second of going idle; the subscribed one stays.
        wait_status(server, idle, 404)
        assert forgotten_total(server) >= 1
        time.sleep(1.5)
        assert status(server, held) == 200, "a subscribed channel is never forgotten"
    # Points are kept forever by default.
    assert status(server, point) == 200
    # A client that had seen offset 1 of the forgotten channel recovers: the channel is new
    # (new epoch), so the recovery is incomplete and the client re-reads state.
    with WS(server.ws_url) as ws:
        r = ws.subscribe([idle], recover={idle: {"epoch": first["epoch"], "offset": 1}})["channels"][idle]
        assert r["epoch"] != first["epoch"]
        assert r["complete"] is False, r
    # Once its last subscriber left, the held channel goes too.
    wait_status(server, held, 404)
