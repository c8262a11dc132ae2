"""Command line (SPEC §5): the start-up line, flags, SWITCHBOARD_* environment variables,
exit codes, and `sub` through a shard that goes down."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

import sb
from redis_kit import two_shards  # noqa: F401 (the fixture)
from sb import WS, api_get, uniq


def _run(binary, *args, env=None, timeout=10):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    full_env.update(env or {})
    return subprocess.run([binary, *args], capture_output=True, timeout=timeout, env=full_env,
                          stdin=subprocess.DEVNULL)


def test_cli_serve_prints_exactly_one_listening_line(server):
    # start_server already parsed "switchboard listening on http://127.0.0.1:PORT"; the port is real.
    assert 0 < server.port < 65536
    assert api_get(server, "/healthz").status == 200
    assert server.http_url == f"http://127.0.0.1:{server.port}"


def test_cli_help_exits_0_and_names_serve(switchboard_bin):
    r = _run(switchboard_bin, "--help")
    assert r.returncode == 0
    assert b"serve" in r.stdout


@pytest.mark.parametrize("args", [
    ["serve", "--listen", "127.0.0.1:0", "--no-such-flag"],
    ["serve", "--listen", "127.0.0.1:0", "--max-connections", "lots"],
    ["serve", "--listen", "not-an-address"],
    ["no-such-subcommand"],
])
def test_cli_bad_usage_exits_2(switchboard_bin, args):
    r = _run(switchboard_bin, *args)
    assert r.returncode == 2, (args, r.returncode, r.stderr[-500:])
    assert r.stderr.strip(), "a usage error must say what is wrong"


def test_cli_missing_config_file_exits_2(switchboard_bin, tmp_path):
    r = _run(switchboard_bin, "serve", "--listen", "127.0.0.1:0", "--config", str(tmp_path / "nope.toml"))
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])


def test_cli_bad_config_value_exits_2_naming_the_key(switchboard_bin, tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[limits]\nmax_connections = "many"\n')
    r = _run(switchboard_bin, "serve", "--listen", "127.0.0.1:0", "--config", str(cfg))
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
    assert b"max_connections" in r.stderr, r.stderr[-500:]


def test_cli_unparsable_config_file_exits_2(switchboard_bin, tmp_path):
    cfg = tmp_path / "broken.toml"
    cfg.write_text("this is = = not toml\n")
    r = _run(switchboard_bin, "serve", "--listen", "127.0.0.1:0", "--config", str(cfg))
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])


def test_cli_config_file_defines_a_namespace(start_server, tmp_path):
    cfg = tmp_path / "ns.toml"
    cfg.write_text("[namespaces.news]\nclient_publish = true\nhistory_size = 3\nhistory_ttl_s = 60\n")
    srv = start_server("--config", str(cfg))
    ch = uniq("news:")
    with WS(srv.ws_url) as ws:
        epoch = ws.subscribe([ch])["channels"][ch]["epoch"]
        for i in range(1, 6):
            assert ws.ok("publish", {"channel": ch, "data": i}) == {"offset": i, "epoch": epoch}
        hist = ws.ok("history", {"channel": ch})
        assert hist["publications"] == [{"ch": ch, "off": i, "data": i} for i in (3, 4, 5)]
    with WS(srv.ws_url) as ws:
        r = ws.subscribe([ch], recover={ch: {"epoch": epoch, "offset": 1}})["channels"][ch]
        assert r["complete"] is False
        r2 = ws.ok("subscribe", {"channels": [uniq("news:")]})
        assert "channels" in r2


@pytest.mark.parametrize("command", ["serve", "echo"])
def test_cli_listening_beyond_loopback_without_auth_is_refused(switchboard_bin, command):
    r = _run(switchboard_bin, command, "--listen", "0.0.0.0:0", timeout=10)
    assert r.returncode == 2, (r.returncode, r.stdout[-300:], r.stderr[-500:])
    assert b"allow-anonymous" in r.stderr, r.stderr[-500:]


def test_cli_environment_variable_sets_config(start_server):
    srv = start_server(env={"SWITCHBOARD_MAX_CONNECTIONS": "1"})
    with WS(srv.ws_url) as first:
        assert first.ping(1) == {"data": 1}
        second = WS(srv.ws_url)
        closed = second.wait_closed()
        assert closed.code == 4029


def test_cli_simulate_publishes_points(start_server):
    srv = start_server("--simulate", "20@5")
    deadline = time.monotonic() + 5
    while True:
        rows = api_get(srv, "/api/channels").json()["channels"]
        live = [r for r in rows if r["offset"] >= 1]
        if len(live) >= 20:
            break
        assert time.monotonic() < deadline, f"only {len(live)} simulated channels after 5 s"
        time.sleep(0.2)
    ch = live[0]["channel"]
    with WS(srv.ws_url) as ws:
        ws.subscribe([ch])
        p = ws.pubs(ch, 1)[0]
        assert set(p["data"]) >= {"v", "t"}, p
        assert p["off"] > live[0]["offset"] - 1


@pytest.mark.parametrize("server", [["--workers", "1"]], indirect=True)
def test_cli_workers_flag_runs_and_everything_works_on_one_worker(server):
    ch = uniq("w1.")
    with WS(server.ws_url) as a, WS(server.ws_url) as b:
        a.subscribe([ch])
        b.subscribe([ch])
        sb.api_batch(server, [{"channel": ch, "data": i} for i in range(1, 501)])
        for ws in (a, b):
            assert [p["off"] for p in ws.pubs(ch, 500)] == list(range(1, 501))
    info = api_get(server, "/api/info").json()
    if "workers" in info:
        assert info["workers"] == 1


def test_cli_sub_subscribes_the_channels_of_a_dead_shard_again_until_it_is_back(start_server, switchboard_bin,
                                                                                two_shards):
    """Two Redis shards, one killed: `switchboard sub` streams the live shard's channels and
    subscribes the dead shard's (refused 503 for now) again until the shard is back."""
    import json
    import threading

    shards = two_shards
    proc = None
    try:
        srv = start_server("--broker", ",".join(r.url for r in shards))
        channels = [f"room:{uniq()}" for _ in range(8)]
        sb.api_batch(srv, [{"channel": c, "data": {"n": 0}} for c in channels])
        shards[1].kill()
        results = sb.api_batch(srv, [{"channel": c, "data": {"n": 1}} for c in channels])
        dead = [c for c, r in zip(channels, results) if "error" in r]
        live = [c for c in channels if c not in dead]
        assert dead and live, results
        proc = subprocess.Popen([switchboard_bin, "sub", *channels, "--url", srv.ws_url],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: list = []
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()

        def got(ch: str, n: int) -> bool:
            return any(json.loads(line).get("ch") == ch and json.loads(line)["data"].get("n") == n
                       for line in list(lines))

        def delivered(chans: list, n: int):
            """Publishes `n` to `chans` (the subscriber may still be subscribing) until each is printed."""
            def check() -> bool:
                sb.api_batch(srv, [{"channel": c, "data": {"n": n}} for c in chans])
                return all(got(c, n) for c in chans)
            return check

        sb.wait_until("the live shard's channels", delivered(live, 2), 20, every=0.5)
        assert proc.poll() is None, "sub keeps running while a shard is down"
        shards[1].start()
        sb.wait_until("the dead shard's channels, subscribed again", delivered(dead, 3), 40, every=0.5)
        assert proc.poll() is None
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)


def test_cli_sub_keeps_streaming_when_a_shard_fails_under_it_and_resumes_its_channels(start_server,
                                                                                      switchboard_bin, two_shards):
    """`switchboard sub` already streaming when a shard dies: the server ends that shard's
    channels alone (`unsubscribed`); sub keeps printing the live shard's channels, each
    publication once, and subscribes the others again (with recover) until the shard is back."""
    import json
    import threading

    shards = two_shards
    proc = None
    try:
        srv = start_server("--broker", ",".join(r.url for r in shards))
        channels = [f"room:{uniq()}" for _ in range(8)]
        sb.api_batch(srv, [{"channel": c, "data": {"n": 0}} for c in channels])
        proc = subprocess.Popen([switchboard_bin, "sub", *channels, "--url", srv.ws_url],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: list = []
        errors: list = []
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True).start()

        def printed(ch: str) -> list:
            return [json.loads(line)["data"]["n"] for line in list(lines) if json.loads(line)["ch"] == ch]

        def delivered(chans: list, n: int):
            def check() -> bool:
                sb.api_batch(srv, [{"channel": c, "data": {"n": n}} for c in chans if n not in printed(c)])
                return all(n in printed(c) for c in chans)
            return check

        sb.wait_until("every channel streaming", delivered(channels, 1), 20, every=0.5)
        shards[1].kill()
        # n=2 to every channel until the live shard's take it (each once) and the dead shard's
        # keep being refused: on a loaded machine the first attempt may be refused whole.
        live, dead, results = [], list(channels), []
        for _ in range(10):
            results = sb.api_batch(srv, [{"channel": c, "data": {"n": 2}} for c in dead])
            taken = [c for c, r in zip(dead, results) if "error" not in r]
            live += taken
            dead = [c for c in dead if c not in taken]
            if live and dead and not taken:
                break
            time.sleep(0.5)
        assert dead and live, results
        sb.wait_until("the dead shard's channels ended by the server",
                      lambda: all(any(c in e and "subscribing again" in e for e in list(errors)) for c in dead), 20)
        for n in (3, 4):
            sb.api_batch(srv, [{"channel": c, "data": {"n": n}} for c in live])
        sb.wait_until("the live shard's channels", lambda: all(4 in printed(c) for c in live), 20)
        shards[1].start()
        sb.wait_until("the dead shard's channels, subscribed again", delivered(dead, 5), 40, every=0.5)
        assert proc.poll() is None
        for c in live:
            # n=1 may have been published twice while sub was still subscribing.
            assert [n for n in printed(c) if n != 1] == [2, 3, 4], (c, printed(c))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)


def test_cli_sub_reconnects_after_its_node_restarts_and_prints_each_publication_once(start_server, switchboard_bin,
                                                                                   redis_url, tmp_path):
    """`switchboard sub` on node A of two nodes sharing a Redis: A is killed (-9), publications
    go on through node B, A comes back on its port; sub reconnects, recovers what it missed and
    prints every publication once, in order."""
    import json
    import threading

    port, ch = sb.free_port(), f"room:{uniq()}"
    a = sb.start_on_port(switchboard_bin, port, ["--broker", redis_url], str(tmp_path / "a.log"))
    b = start_server("--broker", redis_url)
    proc = subprocess.Popen([switchboard_bin, "sub", ch, "--url", f"ws://127.0.0.1:{port}/ws"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()

    def printed() -> list:
        return [json.loads(line)["data"]["n"] for line in list(lines)]

    try:
        def publish_until_printed(n: int) -> bool:
            if n not in printed():
                sb.api_publish(b, ch, {"n": n})
            return n in printed()

        # The first value is published again until sub (still subscribing) prints it.
        sb.wait_until("sub streaming", lambda: publish_until_printed(0), 20, every=0.3)
        for n in (1, 2):
            sb.api_publish(b, ch, {"n": n})
        sb.wait_until("1 and 2 printed", lambda: 2 in printed(), 10)
        a.kill()
        for n in (3, 4, 5):
            sb.api_publish(b, ch, {"n": n})
        a = sb.start_on_port(switchboard_bin, port, ["--broker", redis_url], str(tmp_path / "a2.log"))
        sb.api_publish(b, ch, {"n": 6})
        sb.wait_until("the missed and the new publications", lambda: 6 in printed(), 30)
        assert proc.poll() is None, "sub keeps running across the restart"
        got = [n for n in printed() if n != 0]
        assert got == [1, 2, 3, 4, 5, 6], printed()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        a.kill()


def test_cli_sub_subscribes_channels_past_one_replys_budget_in_further_commands(server, switchboard_bin):
    """`switchboard sub --initial` of more latest values than one subscribe reply carries (512 KiB):
    the channels refused with 413 are subscribed again in further commands, so every channel's
    latest value is printed and none is reported refused."""
    import json
    import threading

    channels = [f"big:{uniq()}" for _ in range(20)]
    for i, c in enumerate(channels):
        sb.api_publish(server, c, {"i": i, "pad": "x" * 60_000})
    proc = subprocess.Popen([switchboard_bin, "sub", "--initial", *channels, "--url", server.ws_url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list = []
    errors: list = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True).start()
    try:
        sb.wait_until("every channel's latest value", lambda: len(lines) >= len(channels), 20)
        got = [json.loads(line) for line in list(lines)]
        assert [p["ch"] for p in got] == channels, [p["ch"] for p in got]
        assert [p["data"]["i"] for p in got] == list(range(len(channels)))
        assert proc.poll() is None
        assert not any("413" in e for e in errors), errors
    finally:
        proc.terminate()
        proc.wait(timeout=10)
