"""OPC UA back-fill end to end: a real OPC UA server (the third-party `asyncua` package,
tests/python/opcua_server.py with --history) keeps the history of Temp and none of Flow, both
written every 100 ms with source timestamps. The node reaches it through a TCP relay the test
controls; cutting the relay for 20 s leaves the server running (and historizing) while the
node is cut off. After the reconnect the gap of Temp is read from the server's history and
lands in the channel's trend at its own times and in its history, each value once, marked
`hist`; Flow's gap stays as the bad marker left it; live subscribers never see a back-filled
value as the current one.

The server listens on 127.0.0.2 and the relay on 127.0.0.1 at the same port: the endpoint the
server advertises, its host replaced by the client's, leads through the relay. Every server is
stopped by PID at teardown.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

import sb
from sb import WS
from test_fault_opcua import latest, metric, received
from test_source_opcua import OpcServer, free_port

CUT_S = 20.0


class Relay:
    """Relays 127.0.0.1:`port` to `upstream`:`port`. `cut()` closes every relayed connection
    and refuses new ones (nothing listens) until `restore()`."""

    def __init__(self, port: int, upstream: str):
        self.port, self.upstream = port, upstream
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.listening: threading.Event | None = None

    def restore(self) -> "Relay":
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        listener.settimeout(0.1)
        self.listening = threading.Event()
        self.listening.set()
        threading.Thread(target=self._accept, args=(listener, self.listening), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket, listening: threading.Event) -> None:
        with listener:
            while listening.is_set():
                try:
                    client, _ = listener.accept()
                except (TimeoutError, socket.timeout):
                    continue
                client.settimeout(None)
                try:
                    server = socket.create_connection((self.upstream, self.port), timeout=5)
                    server.settimeout(None)
                except OSError:
                    client.close()
                    continue
                with self.lock:
                    self.sockets += [client, server]
                for a, b in ((client, server), (server, client)):
                    threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        if self.listening is not None:
            self.listening.clear()
            self.listening = None
        # The listener closes within its accept timeout; the relayed connections now.
        time.sleep(0.3)
        with self.lock:
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self.sockets = []


@pytest.fixture
def history_server():
    port = free_port()
    srv = OpcServer(port, ("--host", "127.0.0.2", "--history")).start()
    relay = Relay(port, "127.0.0.2").restore()
    yield srv, relay
    relay.cut()
    srv.stop()


def node(start_server, tmp_path, opc: OpcServer) -> sb.Server:
    cfg = tmp_path / "switchboard.toml"
    cfg.write_text(f"""
[namespaces.pt]
history_size = 2000

[[sources]]
kind = "opcua"
name = "plc"
url = "{opc.url}"
browse = "Objects/Plant/Line1"
sampling_ms = 50
publishing_ms = 100
channel = "pt:{{name}}"
""")
    return start_server("--config", str(cfg))


def buckets(srv: sb.Server, channel: str) -> dict[int, dict]:
    """The channel's one-second trend buckets of the last 5 minutes, by start time."""
    return {b["t"]: b for b in sb.trend(srv, channel, 300, 1)["buckets"]}


@pytest.mark.timeout(180)
def test_opcua_backfill_a_20s_gap_lands_in_the_trend_and_history_at_its_own_times(history_server, start_server, tmp_path):
    opc, relay = history_server
    srv = node(start_server, tmp_path, opc)
    sb.wait_until("Temp and Flow", lambda: latest(srv, "pt:Temp") and latest(srv, "pt:Flow"), limit=30)

    with WS(srv.ws_url) as watcher:
        watcher.subscribe(["pt:Temp"])
        before = watcher.pubs("pt:Temp", 3, timeout=20)
        relay.cut()
        while True:
            p = watcher.pubs("pt:Temp", 1, timeout=30)[0]["data"]
            if p["q"] == "bad":
                break
            before.append({"data": p})
        gap_start = max(b["data"]["t"] for b in before if b["data"]["q"] == "good")
        flow_bad = latest(srv, "pt:Flow")
        assert flow_bad["q"] == "bad", "the gap of a point without history is marked bad"
        time.sleep(CUT_S)
        relay.restore()
        sb.wait_until("the reconnect", lambda: metric(srv, "source_connected") == 1, limit=60, every=0.2)
        gap_end = watcher.pubs("pt:Temp", 1, timeout=20)[0]["data"]["t"]
        sb.wait_until("the back-fill", lambda: metric(srv, "source_backfilled_total") > 0, limit=30, every=0.2)
        time.sleep(1.0)
        # Live subscribers see only values newer than those before them: a back-filled value is
        # never sent as the current one.
        later = [p["data"] for p in received(watcher, 1.0) if p["ch"] == "pt:Temp"]
    assert gap_end - gap_start >= CUT_S * 1000, (gap_start, gap_end)

    # The seconds wholly inside the gap: Temp's trend has its values there, at their own times.
    seconds = [s for s in range(gap_start // 1000 * 1000 + 1000, gap_end, 1000) if s + 1000 <= gap_end]
    temp = buckets(srv, "pt:Temp")
    filled = [s for s in seconds if temp.get(s, {}).get("n", 0) >= 1]
    assert len(filled) >= 0.8 * len(seconds), f"{len(filled)} of {len(seconds)} seconds of the gap back-filled"
    assert all(14.9 <= temp[s]["min"] <= temp[s]["max"] <= 25.1 for s in filled)
    # Flow keeps no history: its gap holds nothing but the mark that said it went bad (its last
    # value again, stamped when the connection was lost).
    flow = buckets(srv, "pt:Flow")
    marked = flow_bad["t"] // 1000 * 1000
    assert not [s for s in seconds if s != marked and flow.get(s, {}).get("n", 0) > 0], "Flow was back-filled"
    backfilled = metric(srv, "source_backfilled_total")
    assert backfilled >= 0.8 * (gap_end - gap_start) / 100 - 10

    # Temp's history holds every back-filled value once, marked, at its own time inside the gap;
    # its live values stay in order around them (Flow keeps no history: nothing of it is there).
    pubs = sb.history_pubs(srv, "pt:Temp")
    past = [p["data"]["t"] for p in pubs if p.get("hist")]
    assert len(past) == backfilled, f"{len(past)} historical publications, {backfilled} back-filled"
    assert len(set(past)) == len(past), "a back-filled value is in history more than once"
    assert all(gap_start < t < gap_end for t in past), [t for t in past if not gap_start < t < gap_end]
    live = [p["data"]["t"] for p in pubs if not p.get("hist")]
    assert live == sorted(live), "the live values are in history in order"

    # Live subscribers saw only values newer than those before them: a back-filled value is
    # never sent as the current one, and the channel's last value stays the newest.
    assert all(p["t"] >= gap_end for p in later), [p["t"] for p in later if p["t"] < gap_end]
    assert latest(srv, "pt:Temp")["t"] >= gap_end, "the live value stays the newest"
    assert srv.alive()
