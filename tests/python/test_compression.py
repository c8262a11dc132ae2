"""permessage-deflate (RFC 7692; docs/protocol.md, "Compression") on the node's `/ws`, held to
the standard by clients nobody on the project wrote: the `websockets` library, which offers the
extension by default, and Python's zlib reading raw frames.

- `websockets` negotiates the extension, receives publications (≈1 KiB JSON documents published
  over HTTP) identical to what was published, and its own compressed commands are read.
- The project's Python client (`switchboard_client`) offers it by default and not with
  `compression=None`; either way its publications arrive identical, compressed on the wire only
  when negotiated (the node's `switchboard_bytes_out_total`), and the node's
  `switchboard_deflate_*` counters show the connection and each publication compressed. Any
  other value is a `ValueError`.
- `switchboard sub` (the Rust client, which inflates under tungstenite) does the same by
  default and not with `--compression off`.
- On raw frames: the answer always carries both `no_context_takeover` parameters, so every
  compressed message inflates on its own with a fresh decompressor; it is compressed with no
  more window than the client asked for (`server_max_window_bits` 8..15, checked by inflating
  with exactly that window and output in small pieces, so zlib looks back through its window
  rather than through the output); messages under `compression_min_bytes` come uncompressed.
- A compressed message that is not DEFLATE data fails the connection with 1007, one that
  inflates past `max_frame_bytes` with 1009; RSV1 on a continuation or without the extension
  with 1002. `compression = "off"` declines every offer.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import queue
import random
import socket
import struct
import subprocess
import threading
import time
import zlib

import pytest
from websockets.sync.client import connect

from sb import JSON_PROTOCOL, api_publish, metric, server_env, uniq
from sb import plant_document as document
from switchboard_client import Client
from switchboard_client import sync as sbsync

OP_CONT, OP_TEXT, OP_CLOSE, OP_PING = 0, 1, 8, 9
BOTH = "permessage-deflate; server_no_context_takeover; client_no_context_takeover"


def deflate(data: bytes, wbits: int = 15) -> bytes:
    """One message compressed as RFC 7692 §7.2.1 says: raw DEFLATE, sync flush, tail removed."""
    c = zlib.compressobj(6, zlib.DEFLATED, -wbits)
    out = c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
    assert out.endswith(b"\x00\x00\xff\xff")
    return out[:-4]


def inflate(data: bytes, wbits: int = 15) -> bytes:
    """Inflates one message with a fresh decompressor whose window is `wbits`, 64 bytes of
    output at a time: a back-reference beyond the window fails ("invalid distance too far
    back") instead of being served from the output already made."""
    d = zlib.decompressobj(-wbits)
    out, rest = b"", data + b"\x00\x00\xff\xff"
    while True:
        chunk = d.decompress(rest, 64)
        out += chunk
        rest = d.unconsumed_tail
        if not chunk and not rest:
            return out


class DeflateSocket:
    """A WebSocket client on a raw socket that offers `offer` and reads frames itself."""

    def __init__(self, port: int, offer: str | None = "permessage-deflate", path: str = "/ws"):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        key = base64.b64encode(os.urandom(16)).decode()
        head = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n")
        if offer is not None:
            head += f"Sec-WebSocket-Extensions: {offer}\r\n"
        self.sock.sendall((head + "\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            assert chunk, f"closed during the handshake: {self.buf!r}"
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw.decode("latin-1").split("\r\n")
        assert " 101 " in lines[0] + " ", lines
        self.headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
        self.extensions = self.headers.get("sec-websocket-extensions")

    def send(self, opcode: int, payload: bytes, fin: bool = True, rsv1: bool = False) -> None:
        b0 = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
        n = len(payload)
        head = struct.pack("!BB", b0, 0x80 | n) if n < 126 else (
            struct.pack("!BBH", b0, 0x80 | 126, n) if n < 65536 else struct.pack("!BBQ", b0, 0x80 | 127, n))
        key = os.urandom(4)
        self.sock.sendall(head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload)))

    def send_json(self, obj, compressed: bool = False) -> None:
        text = json.dumps(obj, separators=(",", ":")).encode()
        self.send(OP_TEXT, deflate(text) if compressed else text, rsv1=compressed)

    def _take(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def frame(self, timeout: float = 5.0):
        """(rsv1, opcode, payload) of the next frame (the server sends messages unfragmented)."""
        deadline = time.monotonic() + timeout
        b0, b1 = self._take(2, deadline)
        assert b0 & 0x80 and not b0 & 0x30, f"FIN, no RSV2/RSV3: {b0:#x}"
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._take(2, deadline))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._take(8, deadline))[0]
        return bool(b0 & 0x40), b0 & 0x0F, self._take(n, deadline)

    def messages(self, wbits: int = 15, timeout: float = 5.0):
        """The next text frame's messages, each (compressed, JSON value); inflated with a window
        of `wbits`."""
        while True:
            rsv1, opcode, payload = self.frame(timeout)
            if opcode == OP_TEXT:
                text = inflate(payload, wbits) if rsv1 else payload
                return [(rsv1, json.loads(line)) for line in text.decode().split("\n") if line]
            assert not rsv1, "RSV1 on a control frame"

    def reply(self, cid: int, wbits: int = 15):
        while True:
            for _, m in self.messages(wbits):
                if m.get("id") == cid:
                    return m

    def close_code(self, timeout: float = 5.0) -> int | None:
        """Reads until the server's close frame; its code."""
        while True:
            _, opcode, payload = self.frame(timeout)
            if opcode == OP_CLOSE:
                return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None

    def close(self) -> None:
        self.sock.close()


def test_compression_websockets_client_receives_identical_publications(server):
    ch = uniq("room:deflate-")
    docs = [document(i) for i in range(40)]
    assert 900 <= len(json.dumps(docs[0])) <= 1200
    with connect(server.ws_url, subprotocols=[JSON_PROTOCOL], proxy=None, max_size=None) as ws:
        assert ws.response.headers["Sec-WebSocket-Extensions"] == BOTH
        ws.send(json.dumps({"id": 1, "subscribe": {"channels": [ch]}}))
        assert "ok" in json.loads(ws.recv(timeout=5)), "subscribed"
        for d in docs:
            api_publish(server, ch, d)
        # `websockets` compresses every message it sends: a command the node inflates.
        mine = document(999)
        ws.send(json.dumps({"id": 2, "publish": {"channel": ch, "data": mine}}))
        got, replied = [], False
        while len(got) < len(docs) + 1 or not replied:
            for line in ws.recv(timeout=5).split("\n"):
                m = json.loads(line)
                if "pub" in m:
                    got.append(m["pub"])
                replied |= m.get("id") == 2 and "ok" in m
    assert [p["data"] for p in got] == docs + [mine]
    assert [p["off"] for p in got] == list(range(got[0]["off"], got[0]["off"] + len(docs) + 1))


@pytest.mark.parametrize("options,negotiated", [
    ({}, ["permessage-deflate"]),
    ({"compression": "deflate"}, ["permessage-deflate"]),
    ({"compression": None}, []),
], ids=["default", "deflate", "none"])
def test_compression_python_client_receives_identical_publications(server, options, negotiated):
    ch = uniq("room:pyclient-")
    docs = [document(i) for i in range(40)]
    sent = sum(len(json.dumps(d, separators=(",", ":"))) for d in docs)

    async def main():
        async with Client(server.ws_url, **options) as c:
            assert c.extensions == negotiated
            sub = await c.subscribe(ch)
            before = metric(server, "switchboard_bytes_out_total", required=True)
            for d in docs:
                api_publish(server, ch, d)
            got = [await sub.get(10) for _ in docs]
            written = metric(server, "switchboard_bytes_out_total", required=True) - before
            assert c.extensions == negotiated
        assert c.extensions == [], "none once closed"
        return got, written

    counted = {k: metric(server, f"switchboard_deflate_{k}_total", required=True)
               for k in ("connections", "messages", "input_bytes", "output_bytes")}
    got, written = asyncio.run(asyncio.wait_for(main(), 60))
    grew = {k: metric(server, f"switchboard_deflate_{k}_total", required=True) - v for k, v in counted.items()}
    if negotiated:
        # This client's connection, and each publication compressed once (the node's test
        # server has no other compressing subscriber of this channel).
        assert grew["connections"] == 1 and grew["messages"] >= len(docs), grew
        assert grew["input_bytes"] >= sent and grew["output_bytes"] < grew["input_bytes"] / 2, grew
    else:
        assert grew["connections"] == 0, grew
    assert [p.data for p in got] == docs
    assert [p.offset for p in got] == list(range(got[0].offset, got[0].offset + len(docs)))
    # What the node wrote for them (the last write may be counted a moment after it arrived).
    if negotiated:
        assert written < sent / 2, (written, sent)
    else:
        assert written > sent * 0.9, (written, sent)


@pytest.mark.parametrize("flag,compressed", [([], True), (["--compression", "off"], False)], ids=["default", "off"])
def test_compression_cli_sub_prints_the_same_publications_compressed_or_not(server, switchboard_bin, flag, compressed):
    """`switchboard sub` (the Rust client) offers the extension unless told not to, and prints
    what was published either way."""
    ch = uniq("room:cli-")
    docs = [document(i) for i in range(20)]
    sent = sum(len(json.dumps(d, separators=(",", ":"))) for d in docs)
    proc = subprocess.Popen([switchboard_bin, "sub", ch, "--url", server.http_url, *flag], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=server_env())
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(json.loads(x)) for x in proc.stdout], daemon=True).start()

    def line(timeout: float) -> dict | None:
        try:
            return lines.get(timeout=timeout)
        except queue.Empty:
            return None

    try:

        # Markers until the tool is subscribed and prints, then the documents.
        deadline, first = time.monotonic() + 15, None
        while first is None and time.monotonic() < deadline:
            api_publish(server, ch, {"marker": True})
            first = line(0.3)
        assert first is not None, "sub printed nothing"
        while (extra := line(0.3)) is not None:  # markers published while it started
            assert extra["data"] == {"marker": True}, extra
        before = metric(server, "switchboard_bytes_out_total", required=True)
        for d in docs:
            api_publish(server, ch, d)
        got = [line(10) for _ in docs]
        written = metric(server, "switchboard_bytes_out_total", required=True) - before
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    assert [g["data"] for g in got] == docs
    assert [g["off"] for g in got] == list(range(got[0]["off"], got[0]["off"] + len(docs)))
    if compressed:
        assert written < sent / 2, (written, sent)
    else:
        assert written > sent * 0.9, (written, sent)


def test_compression_python_sync_client_takes_the_option(server):
    with sbsync.Client(server.ws_url) as c:
        assert c.extensions == ["permessage-deflate"]
    with sbsync.Client(server.ws_url, compression=None) as c:
        assert c.extensions == []


@pytest.mark.parametrize("compression", ["gzip", "permessage-deflate", "", "off"])
def test_compression_python_client_refuses_other_values(compression):
    with pytest.raises(ValueError, match="compression must be 'deflate' or None"):
        Client("ws://127.0.0.1:1/ws", compression=compression)
    with pytest.raises(ValueError, match="compression must be 'deflate' or None"):
        sbsync.Client("ws://127.0.0.1:1/ws", compression=compression)


@pytest.mark.parametrize("wbits", [8, 9, 10, 12, 15])
def test_compression_frames_inflate_alone_within_the_window_asked(server, wbits):
    ch = uniq("room:window-")
    offer = f"permessage-deflate; server_max_window_bits={wbits}; client_max_window_bits"
    c = DeflateSocket(server.port, offer)
    try:
        assert c.extensions == f"{BOTH}; server_max_window_bits={wbits}"
        c.send_json({"id": 1, "subscribe": {"channels": [ch]}})
        assert "ok" in c.reply(1, wbits)
        rng = random.Random(wbits)
        words = ["valve", "pump", "boiler", "open", "closed", "temp", "flow", "alarm", "ok", "line"]

        def text(n: int) -> str:
            return " ".join(rng.choice(words) for _ in range(n // 5))[:n]

        # Text that compresses within any window, repeated farther apart than small windows
        # reach (600 and 5000 bytes): a compressor with too large a window would refer back
        # across the repeats.
        near, far = text(600), text(5000)
        published = [document(1), {"near": [near, near, near]}, {"far": [far, far]}, {"small": 1}]
        for d in published:
            api_publish(server, ch, d)
        got = []
        while len(got) < len(published):
            got += [(rsv1, m["pub"]["data"]) for rsv1, m in c.messages(wbits) if "pub" in m]
        assert [d for _, d in got] == published
        # Under compression_min_bytes (256) a message goes as it is.
        assert [rsv1 for rsv1, _ in got] == [True, True, True, False]
    finally:
        c.close()


def test_compression_commands_compressed_by_the_client_are_read(server):
    ch = uniq("room:cmd-")
    c = DeflateSocket(server.port)
    try:
        assert c.extensions == BOTH
        c.send_json({"id": 1, "subscribe": {"channels": [ch]}}, compressed=True)
        assert "ok" in c.reply(1)
        # A compressed message fragmented: RSV1 on its first frame only.
        body = deflate(json.dumps({"id": 2, "publish": {"channel": ch, "data": document(7)}}).encode())
        c.send(OP_TEXT, body[:10], fin=False, rsv1=True)
        c.send(OP_PING, b"between")
        c.send(OP_CONT, body[10:])
        got = []
        while not any("pub" in m for m in got):
            got += [m for _, m in c.messages()]
        assert [m["pub"]["data"] for m in got if "pub" in m] == [document(7)]
    finally:
        c.close()


def bomb() -> bytes:
    """A megabyte of zeros, deflated to about a kilobyte."""
    return deflate(b"\x00" * (1 << 20))


@pytest.mark.parametrize(
    "case,want",
    [("invalid", 1007), ("bomb", 1009), ("continuation", 1002), ("control", 1002), ("not negotiated", 1002)],
)
def test_compression_violations_fail_the_connection(server, case, want):
    c = DeflateSocket(server.port, None if case == "not negotiated" else "permessage-deflate")
    try:
        if case == "invalid":
            c.send(OP_TEXT, b"\xff\xff\xff\xff", rsv1=True)
        elif case == "bomb":
            assert len(bomb()) < 2000
            c.send(OP_TEXT, bomb(), rsv1=True)
        elif case == "continuation":
            c.send(OP_TEXT, b"{", fin=False)
            c.send(OP_CONT, deflate(b"}"), rsv1=True)
        elif case == "control":
            c.send(OP_PING, b"", rsv1=True)
        else:
            assert c.extensions is None
            c.send(OP_TEXT, deflate(b'{"id":1,"ping":{}}'), rsv1=True)
        assert c.close_code() == want
    finally:
        c.close()
    assert server.alive(), "the node outlives a failed connection"


def test_compression_off_declines_every_offer(start_server):
    srv = start_server(env={"SWITCHBOARD_COMPRESSION": "off"})
    c = DeflateSocket(srv.port, "permessage-deflate; client_max_window_bits, permessage-deflate")
    try:
        assert c.extensions is None
        c.send_json({"id": 1, "ping": {"data": "x" * 2000}})
        rsv1, opcode, _ = c.frame()
        assert (rsv1, opcode) == (False, OP_TEXT)
    finally:
        c.close()
    with connect(srv.ws_url, proxy=None) as ws:
        assert "Sec-WebSocket-Extensions" not in ws.response.headers
