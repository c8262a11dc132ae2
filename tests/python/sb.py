"""Black-box test helpers for Switchboard: a server process handle, a thin JSON/MessagePack
client around the third-party `websockets` library, a raw-socket WebSocket client (for bad
frames and for a client that stops reading), and a few HTTP helpers built on urllib.

Nothing here comes from the project itself: the tests must hold the server to the contract
(SPEC §2, §4 and docs/protocol.md) from the outside.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import select
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import deque
from dataclasses import dataclass, field

import msgpack
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

JSON_PROTOCOL = "switchboard.v1.json"
MSGPACK_PROTOCOL = "switchboard.v1.msgpack"

DEFAULT_TIMEOUT = 5.0


def wait_until(what: str, cond, limit: float, every: float = 0.05):
    """Polls `cond()` until it is truthy (state the node reaches by itself) and returns it; fails
    naming `what` after `limit` seconds."""
    deadline = time.monotonic() + limit
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def uniq(prefix: str = "t") -> str:
    """A fresh channel name (valid alphabet) so tests never see each other's data."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


# --------------------------------------------------------------------------------------------
# Server process
# --------------------------------------------------------------------------------------------


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    args: list
    stderr_path: str
    _stdout_thread: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self, n: int = 4000) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                data = f.read()
            return data[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def terminate(self) -> None:
        os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.stdout is not None:
            try:
                self.proc.stdout.close()
            except OSError:
                pass


try:  # loaded once in the parent: the pre-exec hook below must not import anything
    import ctypes

    _LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
except Exception:  # not Linux / no glibc: no parent-death signal
    _LIBC = None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL the server if the test runner dies (Linux), so an
    interrupted run never leaves servers behind."""
    if _LIBC is not None:
        _LIBC.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


def server_env() -> dict:
    """This process's environment without `SWITCHBOARD_*`: the runner's own settings
    (`SWITCHBOARD_BIN`, `SWITCHBOARD_FAILPOINTS_BIN`) are not a node's configuration."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}


def add_user(binary: str, users, name: str, password: str) -> None:
    """`switchboard user add NAME --users FILE`, the password on stdin (Basic authentication)."""
    r = subprocess.run([binary, "user", "add", name, "--users", str(users)], input=password + "\n", text=True,
                       capture_output=True, timeout=60, env=server_env())
    assert r.returncode == 0, r.stderr


def start_server(binary: str, args: list, stderr_path: str, startup_timeout: float = 10.0,
                 env: dict | None = None) -> Server:
    args = [str(a) for a in args]
    if "--data-dir" not in args and "SWITCHBOARD_DATA_DIR" not in (env or {}):
        # Each node its own data directory (dashboards, the memory broker's alarm states and
        # journal) beside its log: nodes of one test, or of two tests, never share files.
        args += ["--data-dir", os.path.splitext(os.path.abspath(stderr_path))[0] + ".data"]
    cmd = [binary, "serve", "--listen", "127.0.0.1:0", *args]
    errf = open(stderr_path, "wb")
    full_env = server_env()
    # The server's own temporary files (an OPC UA source's certificate store) go beside its log,
    # in the test's directory: a server killed with SIGKILL cannot remove them itself.
    full_env["TMPDIR"] = os.path.dirname(os.path.abspath(stderr_path))
    full_env.update(env or {})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, stdin=subprocess.DEVNULL,
                            env=full_env, preexec_fn=_die_with_parent)
    errf.close()
    deadline = time.monotonic() + startup_timeout
    line = b""
    fd = proc.stdout.fileno()
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or proc.poll() is not None:
            break
        r, _, _ = select.select([fd], [], [], min(remaining, 0.2))
        if r:
            chunk = os.read(fd, 1)
            if not chunk:
                break
            line += chunk
    text = line.decode("utf-8", "replace").rstrip("\n")
    prefix = "switchboard listening on http://127.0.0.1:"
    if not text.startswith(prefix):
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        with open(stderr_path, "rb") as f:
            err = f.read()[-3000:].decode("utf-8", "replace")
        raise RuntimeError(
            f"server did not announce itself: cmd={cmd} stdout line={text!r} "
            f"exit={proc.poll()} stderr tail:\n{err}"
        )
    port = int(text[len(prefix):])

    # Drain the rest of stdout so the server can never block on a full pipe.
    def drain():
        try:
            while os.read(fd, 65536):
                pass
        except OSError:
            pass

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    return Server(proc=proc, port=port, args=list(args), stderr_path=stderr_path, _stdout_thread=t)


def start_on_port(binary: str, port: int, args: list, log: str) -> Server:
    """A node on a fixed port (the `start_server` fixture always picks a new one), so that a
    restarted node is found at the URL its clients know."""
    env = server_env()
    env["TMPDIR"] = os.path.dirname(os.path.abspath(log))  # as in `start_server`
    with open(log, "ab") as errf, open(log + ".out", "wb") as outf:  # files: no pipe to drain
        proc = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", *args], stdout=outf,
                                stderr=errf, stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent)
    srv = Server(proc=proc, port=port, args=args, stderr_path=log)
    deadline = time.monotonic() + 15
    while b"listening" not in pathlib.Path(log + ".out").read_bytes():
        if time.monotonic() > deadline or proc.poll() is not None:
            srv.kill()
            raise RuntimeError(f"node did not start on {port}: {srv.stderr_tail()}")
        time.sleep(0.05)
    return srv


def free_port() -> int:
    """A loopback port free now (for a node that must come back on the same port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_test_ca(directory) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 and localhost signed by it, made
    with the `openssl` command line (as crates/testkit/src/tls.rs makes them for Redis):
    returns (ca.pem, server.pem, server.key) in `directory`. The CA is a separate certificate,
    as verifiers such as rustls require (a self-signed leaf is not a CA)."""
    d = pathlib.Path(directory)

    def openssl(*args):
        r = subprocess.run(["openssl", *args], cwd=d, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"openssl {args}: {r.stderr}"

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=switchboard test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
    return d / "ca.pem", d / "server.pem", d / "server.key"


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class HttpResponse:
    status: int
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


def http(method: str, url: str, body=None, raw: bytes | None = None, timeout: float = 10.0,
         headers: dict | None = None) -> HttpResponse:
    data = None
    hdrs = dict(headers or {})
    if raw is not None:
        data = raw
        hdrs.setdefault("Content-Type", "application/json")
    elif body is not None:
        data = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with _opener.open(req, timeout=timeout) as resp:
            return HttpResponse(resp.status, _lower(resp.headers), resp.read())
    except urllib.error.HTTPError as e:
        return HttpResponse(e.code, _lower(e.headers), e.read())


def _lower(headers) -> dict:
    """Header names are case-insensitive: key the dict by lower-case names."""
    return {k.lower(): v for k, v in headers.items()}


def api_publish(server: Server, channel: str, data) -> dict:
    r = http("POST", server.http_url + "/api/publish", {"channel": channel, "data": data})
    assert r.status == 200, f"publish {channel}: HTTP {r.status} {r.body[:300]!r}"
    return r.json()


def api_batch(server: Server, items: list) -> list:
    r = http("POST", server.http_url + "/api/publish", {"batch": items}, timeout=30)
    assert r.status == 200, f"batch: HTTP {r.status} {r.body[:300]!r}"
    body = r.json()
    return body["results"]


def api_get(server: Server, path: str) -> HttpResponse:
    return http("GET", server.http_url + path)


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric(server: Server, name: str, required: bool = False, **labels) -> float:
    """One sample of the node's `/metrics`: the series `name` (as the node writes it) whose
    labels are exactly `labels`. 0 when the node has no such sample, unless `required` (then
    it is a failure: a series the node must write)."""
    for line in api_get(server, "/metrics").text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name and dict(_LABEL.findall(m.group(2) or "")) == labels:
            return float(m.group(3))
    assert not required, f"{name}{labels or ''} not in /metrics"
    return 0.0


def plant_document(i: int) -> dict:
    """A JSON document of about 1 KiB: a plant's readings, as dashboards receive them (the
    compression tests and `scripts/bench_compression.py`)."""
    return {
        "seq": i,
        "site": "plant1",
        "points": [
            {"id": f"boiler{k}.temp", "v": round(20 + k * 0.37 + i * 0.01, 3), "q": "good",
             "t": 1_700_000_000_000 + i * 1000 + k}
            for k in range(15)
        ],
    }


def history_all(server: Server, channel: str) -> list[dict]:
    """The data of every publication the channel keeps (`history_pubs`)."""
    return [p["data"] for p in history_pubs(server, channel)]


def history_pubs(server: Server, channel: str) -> list[dict]:
    """Every publication the channel keeps (`{channel, offset, data}`, `hist` for a historical
    one), read page by page; empty while the channel is unknown or the broker does not answer."""
    out: list[dict] = []
    query = "limit=2000"
    while True:
        r = api_get(server, f"/api/channels/{ch_path(channel)}/history?{query}")
        if r.status != 200:
            return []
        body = r.json()
        out += body["publications"]
        if not body["more"] or not body["publications"]:
            return out
        last = body["publications"][-1]["offset"]
        query = f"limit=2000&since_offset={last}&epoch={body['epoch']}"


def trend(server: Server, channel: str, window_s: int, step_s: int | None = None) -> dict:
    """The channel's trend over the last `window_s` seconds (buckets of `step_s`, or the
    node's choice)."""
    step = f"&step_s={step_s}" if step_s else ""
    r = api_get(server, f"/api/channels/{ch_path(channel)}/trend?window_s={window_s}{step}")
    assert r.status == 200, f"trend of {channel}: HTTP {r.status} {r.body[:300]!r}"
    return r.json()


class UnreadGets:
    """`clients` raw-socket HTTP GETs of `path` whose answers are never read (a small receive
    buffer each): entered once every answer has begun to arrive, i.e. the node has built it and
    holds what the socket did not take. `head()` reads the first of them; the sockets are closed
    on exit. Measures what such clients cost the node (`Server.rss_bytes`)."""

    def __init__(self, server: Server, path: str, clients: int, timeout: float = 30.0):
        self.server, self.path, self.clients, self.timeout = server, path, clients, timeout
        self.sockets: list[socket.socket] = []

    def __enter__(self) -> "UnreadGets":
        request = f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        try:
            for _ in range(self.clients):
                s = socket.socket()
                self.sockets.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect(("127.0.0.1", self.server.port))
                s.sendall(request)
                readable, _, _ = select.select([s], [], [], self.timeout)
                assert readable, f"no answer within {self.timeout} s"
        except BaseException:
            self.close()
            raise
        return self

    def head(self) -> bytes:
        return self.sockets[0].recv(4096)

    def close(self) -> None:
        for s in self.sockets:
            s.close()
        self.sockets = []

    def __exit__(self, *exc) -> None:
        self.close()


def ch_path(channel: str) -> str:
    """A channel name as one URL path segment (`/` and the like percent-encoded)."""
    return urllib.parse.quote(channel, safe="")


# --------------------------------------------------------------------------------------------
# WebSocket client on top of the `websockets` library
# --------------------------------------------------------------------------------------------


class Closed(Exception):
    def __init__(self, code, reason, messages):
        super().__init__(f"closed code={code} reason={reason!r}")
        self.code = code
        self.reason = reason
        self.messages = messages


class WS:
    """One connection. Messages are split out of frames (`\\n` for JSON, concatenated maps for
    MessagePack); pushes that arrive while waiting for a reply are kept for `recv`."""

    def __init__(self, url: str, subprotocol: str | None = None, offer: list | None = None,
                 max_queue=16, compression=None, open_timeout: float = 5.0):
        if offer is None:
            offer = [subprotocol] if subprotocol else None
        # Entering the connection as a context manager is websockets' non-deprecated way to use
        # a connection directly; __exit__ is our close().
        self.conn = ws_connect(
            url,
            subprotocols=offer,
            compression=compression,
            proxy=None,
            open_timeout=open_timeout,
            close_timeout=2,
            ping_interval=None,
            max_size=None,
            max_queue=max_queue,
        ).__enter__()
        self.binary = self.conn.subprotocol == MSGPACK_PROTOCOL
        self.pending: deque = deque()
        # What arrived before the message the last `recv_where` (or `request`) returned.
        self.preceding: list = []
        self._id = 0
        self.frames = 0
        self.multi_message_frames = 0
        self.closed: Closed | None = None

    # -- low level
    @property
    def subprotocol(self):
        return self.conn.subprotocol

    def send_raw(self, data, text=None):
        self.conn.send(data, text=text)

    def send(self, obj) -> None:
        if self.binary:
            self.conn.send(msgpack.packb(obj, use_bin_type=True))
        else:
            self.conn.send(json.dumps(obj, separators=(",", ":")))

    def _decode(self, frame) -> list:
        self.frames += 1
        if isinstance(frame, bytes):
            assert self.binary, f"binary frame on the JSON subprotocol: {frame[:80]!r}"
            up = msgpack.Unpacker(raw=False, strict_map_key=False)
            up.feed(frame)
            msgs = list(up)
        else:
            assert not self.binary, f"text frame on the msgpack subprotocol: {frame[:80]!r}"
            msgs = [json.loads(part) for part in frame.split("\n") if part != ""]
        if len(msgs) > 1:
            self.multi_message_frames += 1
        return msgs

    def _read_frame(self, timeout: float) -> None:
        if self.closed is not None:
            raise self.closed
        try:
            frame = self.conn.recv(timeout=timeout)
        except ConnectionClosed as e:
            code = e.rcvd.code if e.rcvd is not None else None
            reason = e.rcvd.reason if e.rcvd is not None else None
            self.closed = Closed(code, reason, list(self.pending))
            raise self.closed
        self.pending.extend(self._decode(frame))

    # -- messages
    def recv(self, timeout: float = DEFAULT_TIMEOUT):
        """The next message of any kind (reply or push)."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no message")
            self._read_frame(remaining)
        return self.pending.popleft()

    def recv_where(self, pred, timeout: float = DEFAULT_TIMEOUT):
        """The first message matching `pred`; other messages stay queued in order, and those
        that arrived before it are also in `preceding` (one frame may carry messages from
        either side of it, so `pending` alone does not tell which came first)."""
        deadline = time.monotonic() + timeout
        scanned = 0
        while True:
            for i in range(scanned, len(self.pending)):
                if pred(self.pending[i]):
                    msg = self.pending[i]
                    self.preceding = [self.pending[j] for j in range(i)]
                    del self.pending[i]
                    return msg
            scanned = len(self.pending)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no matching message; queued: {list(self.pending)[:5]}")
            self._read_frame(remaining)

    def drain(self, quiet: float = 0.3) -> list:
        """Everything that arrives until the line has been quiet for `quiet` seconds."""
        out = list(self.pending)
        self.pending.clear()
        while True:
            try:
                self._read_frame(quiet)
            except TimeoutError:
                return out
            out.extend(self.pending)
            self.pending.clear()

    def next_id(self) -> int:
        self._id += 1
        return self._id

    def request(self, command: str, body, timeout: float = DEFAULT_TIMEOUT, id: int | None = None):
        """Sends `{"id", command: body}` and returns the whole reply object."""
        cid = self.next_id() if id is None else id
        self.send({"id": cid, command: body})
        return self.recv_where(lambda m: isinstance(m, dict) and m.get("id") == cid
                               and ("ok" in m or "error" in m), timeout)

    def ok(self, command: str, body, timeout: float = DEFAULT_TIMEOUT):
        reply = self.request(command, body, timeout)
        assert "ok" in reply, f"{command} {body!r} failed: {reply!r}"
        return reply["ok"]

    def subscribe(self, channels, **opts):
        return self.ok("subscribe", {"channels": list(channels), **opts})

    def ping(self, data=None, timeout: float = DEFAULT_TIMEOUT):
        return self.ok("ping", {"data": data}, timeout)

    def pubs(self, channel: str, count: int, timeout: float = DEFAULT_TIMEOUT) -> list:
        """The next `count` publications of `channel`, as the push bodies `{ch, off, data}`."""
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            msg = self.recv_where(lambda m: "pub" in m and m["pub"].get("ch") == channel,
                                  max(0.01, deadline - time.monotonic()))
            out.append(msg["pub"])
        return out

    def wait_closed(self, timeout: float = DEFAULT_TIMEOUT) -> Closed:
        """Reads until the server closes; returns the close code and every message seen."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"connection not closed; queued: {list(self.pending)[:5]}")
                self._read_frame(remaining)
        except Closed as c:
            self.pending.clear()
            return c

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --------------------------------------------------------------------------------------------
# Raw-socket WebSocket client: sends whatever bytes a test wants and can stop reading entirely.
# --------------------------------------------------------------------------------------------

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10


class RawWS:
    def __init__(self, host: str, port: int, path: str = "/ws", subprotocol: str | None = None,
                 rcvbuf: int | None = None, timeout: float = DEFAULT_TIMEOUT, tls=None):
        """`tls`: an `ssl.SSLContext` for a TLS node."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname=host)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        if subprotocol:
            lines.append(f"Sec-WebSocket-Protocol: {subprotocol}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError(f"handshake: connection closed; got {self.buf!r}")
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            raise ConnectionError(f"handshake failed: {head!r}")
        self.headers = head.decode("latin-1")
        self.bytes_read = 0

    # -- sending
    def send_frame(self, opcode: int, payload: bytes, fin: bool = True, mask: bool = True,
                   rsv: int = 0) -> None:
        b0 = (0x80 if fin else 0) | (rsv << 4) | opcode
        n = len(payload)
        mbit = 0x80 if mask else 0
        if n < 126:
            head = struct.pack("!BB", b0, mbit | n)
        elif n < 65536:
            head = struct.pack("!BBH", b0, mbit | 126, n)
        else:
            head = struct.pack("!BBQ", b0, mbit | 127, n)
        if mask:
            key = os.urandom(4)
            masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload)) if n < 4096 else _xor(payload, key)
            self.sock.sendall(head + key + masked)
        else:
            self.sock.sendall(head + payload)

    def send_text(self, text) -> None:
        self.send_frame(OP_TEXT, text.encode() if isinstance(text, str) else text)

    def send_json(self, obj) -> None:
        self.send_text(json.dumps(obj, separators=(",", ":")))

    # -- receiving
    def _fill(self, n: int, deadline: float) -> None:
        while len(self.buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("raw recv timeout")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("connection closed by peer (EOF)")
            self.bytes_read += len(chunk)
            self.buf += chunk

    def recv_frame(self, timeout: float = DEFAULT_TIMEOUT):
        """(opcode, fin, payload) of the next frame; answers pings with pongs itself."""
        deadline = time.monotonic() + timeout
        while True:
            self._fill(2, deadline)
            b0, b1 = self.buf[0], self.buf[1]
            n = b1 & 0x7F
            pos = 2
            if n == 126:
                self._fill(4, deadline)
                n = struct.unpack("!H", self.buf[2:4])[0]
                pos = 4
            elif n == 127:
                self._fill(10, deadline)
                n = struct.unpack("!Q", self.buf[2:10])[0]
                pos = 10
            assert not (b1 & 0x80), "server frames must not be masked"
            self._fill(pos + n, deadline)
            payload = self.buf[pos:pos + n]
            self.buf = self.buf[pos + n:]
            opcode = b0 & 0x0F
            if opcode == OP_PING:
                try:
                    self.send_frame(OP_PONG, payload)
                except OSError:
                    pass
                continue
            return opcode, bool(b0 & 0x80), payload

    def recv_message(self, timeout: float = DEFAULT_TIMEOUT):
        """(opcode, payload) of the next whole data message, or (OP_CLOSE, payload)."""
        opcode, fin, payload = self.recv_frame(timeout)
        if opcode in (OP_CLOSE, OP_PONG):
            return opcode, payload
        while not fin:
            op2, fin, more = self.recv_frame(timeout)
            assert op2 == OP_CONT, f"expected a continuation frame, got opcode {op2}"
            payload += more
        return opcode, payload

    def read_until_close(self, on_message, timeout: float = DEFAULT_TIMEOUT):
        """Calls on_message(list_of_json_messages) per text frame; returns (close code, reason)
        or (None, why) when the TCP stream ended without a close frame."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no close frame")
            try:
                op, payload = self.recv_message(remaining)
            except (EOFError, ConnectionResetError) as e:
                return None, f"no close frame: {e!r}"
            if op == OP_CLOSE:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                return code, payload[2:].decode("utf-8", "replace")
            if op == OP_TEXT:
                on_message([json.loads(p) for p in payload.decode().split("\n") if p])
            elif op == OP_BINARY:
                up = msgpack.Unpacker(raw=False, strict_map_key=False)
                up.feed(payload)
                on_message(list(up))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _xor(payload: bytes, key: bytes) -> bytes:
    n = len(payload)
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(k, "big")).to_bytes(n, "big")


# --------------------------------------------------------------------------------------------
# A bystander: a healthy subscriber that must keep receiving every publication, in order,
# whatever other clients do.
# --------------------------------------------------------------------------------------------


class Bystander:
    def __init__(self, server: Server):
        self.server = server
        self.channel = uniq("bystander.")
        self.ws = WS(server.ws_url)
        reply = self.ws.subscribe([self.channel])
        self.offset = reply["channels"][self.channel]["offset"]
        self.seq = 0

    def check(self, n: int = 3) -> None:
        """Publishes `n` values over HTTP and asserts the bystander gets exactly them, in order."""
        expected = []
        for _ in range(n):
            self.seq += 1
            res = api_publish(self.server, self.channel, {"seq": self.seq})
            self.offset += 1
            assert res["offset"] == self.offset
            expected.append({"ch": self.channel, "off": self.offset, "data": {"seq": self.seq}})
        got = self.ws.pubs(self.channel, n)
        assert got == expected
        assert self.server.alive(), "server died"

    def close(self) -> None:
        self.ws.close()
