"""A small Server-Sent Events reader on top of the third-party `httpx` client, and a raw-socket
one for a reader that stops reading. Parsing follows the HTML living standard's event-stream
rules (fields, comments, blank-line dispatch), written from the standard, not from the
project's code."""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class Event:
    event: str = "message"
    data: str = ""
    id: str | None = None

    def json(self):
        return json.loads(self.data)


@dataclass
class _Parser:
    """Incremental event-stream parser: feed lines, collect events and comments."""

    events: list = field(default_factory=list)
    comments: list = field(default_factory=list)
    retry: int | None = None
    last_id: str | None = None
    _event: str = ""
    _data: list = field(default_factory=list)
    _id: str | None = None

    def line(self, line: str) -> None:
        if line == "":
            if self._data:
                if self._id is not None:
                    self.last_id = self._id
                self.events.append(Event(self._event or "message", "\n".join(self._data), self._id))
            self._event, self._data, self._id = "", [], None
            return
        if line.startswith(":"):
            self.comments.append(line[1:].lstrip(" "))
            return
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        elif name == "retry" and value.isdigit():
            self.retry = int(value)


class SSE:
    """One event stream read by a background thread; events land in a queue."""

    def __init__(self, url: str, headers: dict | None = None, timeout: float = 10.0):
        self.client = httpx.Client(timeout=httpx.Timeout(timeout, read=None), trust_env=False)
        self._cm = self.client.stream("GET", url, headers=headers or {})
        self.response = self._cm.__enter__()
        self.status = self.response.status_code
        self.headers = self.response.headers
        self.parser = _Parser()
        self.q: queue.Queue = queue.Queue()
        self.done = threading.Event()
        if self.status == 200:
            threading.Thread(target=self._read, daemon=True).start()
        else:
            self.body = self.response.read()
            self.done.set()

    def _read(self) -> None:
        try:
            for line in self.response.iter_lines():
                n = len(self.parser.events)
                c = len(self.parser.comments)
                self.parser.line(line)
                for e in self.parser.events[n:]:
                    self.q.put(e)
                for cm in self.parser.comments[c:]:
                    self.q.put(("comment", cm))
        except (httpx.HTTPError, ValueError):
            pass
        finally:
            self.done.set()
            self.q.put(None)

    def error(self) -> dict:
        return json.loads(self.body)

    def next(self, timeout: float = 5.0, comments: bool = False):
        """The next event (or comment when `comments`), or None at the end of the stream."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no event in time")
            try:
                item = self.q.get(timeout=left)
            except queue.Empty:
                raise TimeoutError("no event in time") from None
            if item is None:
                self.q.put(None)
                return None
            if isinstance(item, tuple):
                if comments:
                    return item
                continue
            return item

    def next_event(self, name: str, timeout: float = 5.0) -> Event:
        deadline = time.monotonic() + timeout
        while True:
            e = self.next(max(0.01, deadline - time.monotonic()))
            assert e is not None, f"stream ended before a {name!r} event"
            if e.event == name:
                return e

    def pubs(self, count: int, timeout: float = 5.0) -> list:
        """The next `count` publication events, as (event, pub) pairs."""
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            e = self.next(max(0.01, deadline - time.monotonic()))
            assert e is not None, f"stream ended after {len(out)} of {count} publications"
            if e.event == "message":
                out.append((e, e.json()["pub"]))
        return out

    def close(self) -> None:
        try:
            self._cm.__exit__(None, None, None)
        except Exception:
            pass
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RawSSE:
    """An SSE request on a plain socket with a small receive buffer, so the test decides when
    (and whether) the client reads."""

    def __init__(self, host: str, port: int, path: str, rcvbuf: int = 4096):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect((host, port))
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n".encode())
        self.buf = b""
        self.parser = _Parser()
        self.headers_done = False
        self.chunked = False
        self.ended = False
        self._raw = b""

    def _fill(self, timeout: float) -> bool:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return False
        if not data:
            self.ended = True
            return False
        self._raw += data
        return True

    def _dechunk(self) -> None:
        if not self.headers_done:
            head, sep, rest = self._raw.partition(b"\r\n\r\n")
            if not sep:
                return
            self.status = int(head.split(b" ", 2)[1])
            self.chunked = b"transfer-encoding: chunked" in head.lower()
            self.headers_done = True
            self._raw = rest
        if not self.chunked:
            self.buf += self._raw
            self._raw = b""
            return
        while True:
            line, sep, rest = self._raw.partition(b"\r\n")
            if not sep:
                return
            size = int(line.split(b";")[0], 16)
            if size == 0:
                self.ended = True
                self._raw = b""
                return
            if len(rest) < size + 2:
                return
            self.buf += rest[:size]
            self._raw = rest[size + 2:]

    def events(self, timeout: float = 5.0, until=None) -> list:
        """Reads until `until(events)` is true, the stream ends or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.ended:
            if until is not None and until(self.parser.events):
                break
            self._fill(min(0.5, max(0.01, deadline - time.monotonic())))
            self._dechunk()
            *lines, self.buf = self.buf.split(b"\n")
            for line in lines:
                self.parser.line(line.decode().rstrip("\r"))
        return self.parser.events

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
