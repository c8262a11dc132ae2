"""MQTT test parts written from the public specifications, nothing from the project itself:

- `Mosquitto`: a real mosquitto broker on a spare loopback port, with its own config file in a
  scratch directory, stopped (and restartable on the same port) by PID.
- `Publisher`: a minimal MQTT 3.1.1 publisher over a plain socket (CONNECT, PUBLISH QoS 0/1,
  DISCONNECT), fast enough to publish thousands of topics per second from one process.
- `Subscriber`: a minimal MQTT 3.1.1 subscriber over a plain socket that collects every
  message of a topic filter (topic and raw payload) on a background thread.
- `sparkplug_payload`/`metric`: a hand-written protobuf encoder of Sparkplug B payloads;
  `decode_sparkplug` the decoder of the same schema.
- `mosquitto`: the fixture of one broker per test module.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest


# Debian installs the broker in /usr/sbin, which is not on every PATH.
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mosquitto:
    def __init__(self, workdir, port: int | None = None):
        self.port = port or free_port()
        self.dir = workdir
        self.conf = os.path.join(str(workdir), f"mosquitto-{self.port}.conf")
        with open(self.conf, "w") as f:
            f.write(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    "max_queued_messages 100000\nmax_inflight_messages 100\n")
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Mosquitto":
        log = open(os.path.join(str(self.dir), f"mosquitto-{self.port}.log"), "ab")
        self.proc = subprocess.Popen([MOSQUITTO, "-c", self.conf], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"mosquitto did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _mqtt_str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(b)) + b


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _varint(len(body)) + body


class Publisher:
    """MQTT 3.1.1 over a socket. QoS 1 publishes are acknowledged lazily: `flush()` reads the
    PUBACKs owed."""

    def __init__(self, port: int, client_id: str = "py-pub", host: str = "127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = _mqtt_str("MQTT") + bytes([4, 0x02]) + struct.pack("!H", 60) + _mqtt_str(client_id)
        self.sock.sendall(_packet(0x10, body))
        ack = self._read(4)
        assert ack[0] == 0x20 and ack[3] == 0, f"CONNACK {ack!r}"
        self.next_id = 1
        self.owed = 0

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return buf

    def packet(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> bytes:
        body = _mqtt_str(topic)
        if qos:
            body += struct.pack("!H", self.next_id)
            self.next_id = self.next_id % 65535 + 1
            self.owed += 1
        return _packet(0x30 | (qos << 1) | int(retain), body + payload)

    def publish(self, topic: str, payload: bytes | str, qos: int = 1, retain: bool = False) -> None:
        if isinstance(payload, str):
            payload = payload.encode()
        self.sock.sendall(self.packet(topic, payload, qos, retain))
        if qos:
            self.flush()

    def publish_many(self, items, qos: int = 0) -> None:
        """Sends `(topic, payload)` pairs in one write."""
        self.sock.sendall(b"".join(self.packet(t, p if isinstance(p, bytes) else p.encode(), qos) for t, p in items))

    def flush(self) -> None:
        while self.owed:
            ack = self._read(4)
            assert ack[0] == 0x40, f"PUBACK {ack!r}"
            self.owed -= 1

    def close(self) -> None:
        try:
            self.flush()
            self.sock.sendall(b"\xe0\x00")
        except OSError:
            pass
        self.sock.close()


class Subscriber:
    """MQTT 3.1.1 over a socket: subscribes to `topic_filter` (QoS 1; no keep-alive) and keeps
    every message that arrives as `(topic, payload bytes)` in `messages`, acknowledging QoS 1
    ones. Subscribed once the constructor returns (SUBACK received)."""

    def __init__(self, port: int, topic_filter: str, client_id: str = "py-sub", host: str = "127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=10)
        body = _mqtt_str("MQTT") + bytes([4, 0x02]) + struct.pack("!H", 0) + _mqtt_str(client_id)
        self.sock.sendall(_packet(0x10, body))
        first, packet = self._read_packet()
        assert first == 0x20 and packet[1] == 0, f"CONNACK {packet!r}"
        self.sock.sendall(_packet(0x82, struct.pack("!H", 1) + _mqtt_str(topic_filter) + bytes([1])))
        first, packet = self._read_packet()
        assert first == 0x90 and packet[2] != 0x80, f"SUBACK {packet!r}"
        self.sock.settimeout(None)
        self.messages: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return buf

    def _read_packet(self) -> tuple[int, bytes]:
        first = self._read(1)[0]
        length, shift = 0, 0
        while True:
            b = self._read(1)[0]
            length |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        return first, self._read(length)

    def _run(self) -> None:
        try:
            while True:
                first, packet = self._read_packet()
                if first >> 4 != 3:
                    continue
                qos = (first >> 1) & 3
                (n,) = struct.unpack("!H", packet[:2])
                topic, rest = packet[2:2 + n].decode(), packet[2 + n:]
                if qos:
                    self.sock.sendall(_packet(0x40, rest[:2]))
                    rest = rest[2:]
                with self.lock:
                    self.messages.append((topic, rest))
        except OSError:
            pass

    def received(self, topic: str | None = None) -> list[tuple[str, bytes]]:
        """The messages so far, of `topic` only when given."""
        with self.lock:
            return [m for m in self.messages if topic is None or m[0] == topic]

    def wait_for(self, topic: str, count: int = 1, timeout: float = 10.0) -> list[bytes]:
        """Payloads of the first `count` messages of `topic`, waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            got = [p for _, p in self.received(topic)]
            if len(got) >= count:
                return got[:count]
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(got)} of {count} messages of {topic} arrived")
            time.sleep(0.02)

    def close(self) -> None:
        try:
            self.sock.sendall(b"\xe0\x00")
        except OSError:
            pass
        self.sock.close()


# ------------------------------------------------------------------------------------------
# Sparkplug B: protobuf by hand (field numbers from the Sparkplug B specification's schema).
# ------------------------------------------------------------------------------------------

INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64 = 1, 2, 3, 4, 5, 6, 7, 8
FLOAT, DOUBLE, BOOLEAN, STRING, DATETIME, TEXT = 9, 10, 11, 12, 13, 14
# The datatypes whose values go in `int_value` (signed ones as 32-bit two's complement).
_INT_VALUE_TYPES = (INT8, INT16, INT32, UINT8, UINT16, UINT32)


def _key(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _len(field: int, data: bytes) -> bytes:
    return _key(field, 2) + _varint(len(data)) + data


def metric(name: str | None = None, alias: int | None = None, datatype: int | None = None, value=None,
           is_null: bool = False, timestamp: int | None = None) -> bytes:
    out = b""
    if name is not None:
        out += _len(1, name.encode())
    if alias is not None:
        out += _key(2, 0) + _varint(alias)
    if timestamp is not None:
        out += _key(3, 0) + _varint(timestamp)
    if datatype is not None:
        out += _key(4, 0) + _varint(datatype)
    if is_null:
        out += _key(7, 0) + _varint(1)
    if value is not None:
        if isinstance(value, bool):
            out += _key(14, 0) + _varint(int(value))
        elif isinstance(value, float):
            out += _key(13, 1) + struct.pack("<d", value)
        elif isinstance(value, int) and datatype in _INT_VALUE_TYPES:
            out += _key(10, 0) + _varint(value & 0xFFFFFFFF)
        elif isinstance(value, int):
            out += _key(11, 0) + _varint(value & 0xFFFFFFFFFFFFFFFF)
        else:
            out += _len(15, str(value).encode())
    return out


def sparkplug_payload(metrics: list[bytes], timestamp: int | None = None, seq: int = 0) -> bytes:
    out = b""
    if timestamp is not None:
        out += _key(1, 0) + _varint(timestamp)
    for m in metrics:
        out += _len(2, m)
    out += _key(3, 0) + _varint(seq)
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n, shift = 0, 0
    while True:
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def _fields(data: bytes):
    """(field number, wire type, value) of each field of a protobuf message: an int for varint
    and fixed fields, bytes for length-delimited ones."""
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        elif wire == 2:
            n, i = _read_varint(data, i)
            value, i = data[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wire}")
        yield field, wire, value


def _signed(n: int, bits: int) -> int:
    return n - (1 << bits) if n >= 1 << (bits - 1) else n


def decode_sparkplug(payload: bytes) -> dict:
    """A Sparkplug B payload as `{"timestamp", "seq", "metrics": [{"name", "alias", "timestamp",
    "datatype", "is_null", "value"}]}` (absent fields absent). Values: int_value and long_value
    read per the metric's datatype (signed ones as two's complement), float, double, boolean,
    string, bytes."""
    out: dict = {"metrics": []}
    for field, _, value in _fields(payload):
        if field == 1:
            out["timestamp"] = value
        elif field == 3:
            out["seq"] = value
        elif field == 2:
            m: dict = {}
            for f, _, v in _fields(value):
                if f == 1:
                    m["name"] = v.decode()
                elif f in (2, 3, 4):
                    m[{2: "alias", 3: "timestamp", 4: "datatype"}[f]] = v
                elif f == 7:
                    m["is_null"] = bool(v)
                elif f == 10:
                    m["value"] = _signed(v & 0xFFFFFFFF, 32) if m.get("datatype") in (INT8, INT16, INT32) else v
                elif f == 11:
                    m["value"] = _signed(v, 64) if m.get("datatype") == INT64 else v
                elif f == 12:
                    m["value"] = struct.unpack("<f", v)[0]
                elif f == 13:
                    m["value"] = struct.unpack("<d", v)[0]
                elif f == 14:
                    m["value"] = bool(v)
                elif f == 15:
                    m["value"] = v.decode()
                elif f == 16:
                    m["value"] = bytes(v)
            out["metrics"].append(m)
    return out


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory):
    m = Mosquitto(tmp_path_factory.mktemp("mosquitto")).start()
    yield m
    m.stop()
