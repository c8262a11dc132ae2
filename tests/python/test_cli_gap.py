"""`switchboard sub` across a gap (docs/cli.md, "Output"; docs/protocol.md, "Gaps"): when a
reconnect cannot replay what was missed — the channel keeps no history, or its epoch changed
with a node restart — the gap is said on stderr and the channel's latest value is printed, so
stdout never stays on a value the channel has replaced. Every line carries its epoch; a channel
with nothing missed reports no gap. The real binary against real nodes (and a real Redis)."""

from __future__ import annotations

import json
import subprocess
import threading

import sb
from sb import uniq


class Sub:
    """`switchboard sub ARGS` running, its stdout lines parsed and its stderr collected."""

    def __init__(self, binary: str, *args):
        self.proc = subprocess.Popen([binary, "sub", *[str(a) for a in args]], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                     env=sb.server_env())
        self.lines: list = []
        self.errors: list = []
        threading.Thread(target=lambda: self.lines.extend(map(json.loads, self.proc.stdout)), daemon=True).start()
        threading.Thread(target=lambda: self.errors.extend(self.proc.stderr), daemon=True).start()

    def of(self, ch: str) -> list:
        return [line for line in list(self.lines) if line["ch"] == ch]

    def stderr(self) -> str:
        return "".join(list(self.errors))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)


def publish_until_printed(sub: Sub, publish, ch: str, data) -> None:
    """Publishes `data` again until `sub` (which may still be subscribing) prints it."""
    def printed() -> bool:
        if not any(line["data"] == data for line in sub.of(ch)):
            publish(ch, data)
        return any(line["data"] == data for line in sub.of(ch))
    sb.wait_until(f"{ch} = {data} printed", printed, 20, every=0.3)


def test_cli_sub_after_a_memory_node_restart_prints_the_latest_value_with_its_new_epoch(switchboard_bin, tmp_path):
    port = sb.free_port()
    node = sb.start_on_port(switchboard_bin, port, [], str(tmp_path / "node.log"))
    room, quiet = f"room:{uniq()}", f"room:{uniq('quiet')}"
    sub = Sub(switchboard_bin, room, quiet, "--initial", "--url", f"ws://127.0.0.1:{port}")
    try:
        publish_until_printed(sub, lambda ch, d: sb.api_publish(node, ch, d), room, {"n": 1})
        before = sub.of(room)[-1]
        assert before["off"] >= 1 and before["epoch"], before

        node.kill()  # the memory broker's channels, history and epochs are gone
        node = sb.start_on_port(switchboard_bin, port, [], str(tmp_path / "node2.log"))
        after = sb.api_publish(node, room, {"n": 2})
        assert after["offset"] == 1 and after["epoch"] != before["epoch"], (after, before)
        sb.wait_until("the value published after the restart", lambda: any(
            line["data"] == {"n": 2} for line in sub.of(room)), 30)

        # The same offset of two epochs, told apart by the epoch each line carries.
        assert sub.of(room)[-1] == {"ch": room, "epoch": after["epoch"], "off": 1, "data": {"n": 2}}, sub.lines
        err = sub.stderr()
        assert f"{room}: the channel's history restarted" in err, err
        assert f"publications after offset {before['off']} of epoch {before['epoch']} may be lost" in err, err
        # Never published before or after: nothing was missed, nothing is said.
        assert quiet not in err, err
        assert sub.of(quiet) == [], sub.lines
        assert sub.proc.poll() is None, "sub keeps running across the restart"
    finally:
        sub.stop()
        node.kill()


def test_cli_sub_after_its_node_restarts_prints_the_point_published_through_another_node(start_server,
                                                                                         switchboard_bin,
                                                                                         redis_url, tmp_path):
    """The issue's case: `sub` on node A of two sharing a Redis; A restarts while a point
    channel (no history) is published through node B. The offsets missed cannot be replayed:
    the gap is said, then the channel's latest value is printed, in the same epoch."""
    port = sb.free_port()
    a = sb.start_on_port(switchboard_bin, port, ["--broker", redis_url], str(tmp_path / "a.log"))
    b = start_server("--broker", redis_url)
    pt, lobby = f"pt:boiler{uniq()}.temp", f"room:{uniq('lobby')}"
    sub = Sub(switchboard_bin, lobby, pt, "--initial", "--url", f"http://127.0.0.1:{port}")
    try:
        publish_until_printed(sub, lambda ch, d: sb.api_publish(b, ch, d), pt, {"v": 200})
        seen = sub.of(pt)[-1]
        a.kill()
        for v in (301, 302, 303):
            latest = sb.api_publish(b, pt, {"v": v})
        a = sb.start_on_port(switchboard_bin, port, ["--broker", redis_url], str(tmp_path / "a2.log"))
        sb.wait_until("the latest value after the gap", lambda: any(
            line["data"] == {"v": 303} for line in sub.of(pt)), 30)

        # Only the latest value stands for what was missed, once, with its offset and epoch.
        values = [line["data"]["v"] for line in sub.of(pt)]
        assert values[values.index(303) - 1:] == [200, 303], values
        assert sub.of(pt)[-1] == {"ch": pt, "epoch": latest["epoch"], "off": latest["offset"], "data": {"v": 303}}
        assert seen["epoch"] == latest["epoch"], "Redis kept the channel's epoch"
        err = sub.stderr()
        assert f"{pt}: publications after offset {seen['off']} are no longer in history; the latest value follows" \
            in err, err
        # The lobby was never published: no gap for it.
        assert lobby not in err, err
        # Live publications go on after the gap.
        sb.api_publish(b, pt, {"v": 304})
        sb.wait_until("live after the gap", lambda: sub.of(pt)[-1]["data"] == {"v": 304}, 10)
    finally:
        sub.stop()
        a.kill()
