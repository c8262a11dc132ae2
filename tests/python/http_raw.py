"""Reading HTTP/1.1 answers off a raw socket, for tests that send raw bytes: answers counted by
parsing what came back — heads, then bodies by Content-Length or chunked coding — so a body that
holds `HTTP/1.1` is not taken for an answer; an exchange ends when the connection closes or the
wire stays quiet."""

from __future__ import annotations

import re
import select
import socket
import time
from dataclasses import dataclass, field


# How long the wire must stay silent before an exchange counts as over (loopback: a request
# that runs is answered in milliseconds), and the longest any exchange is read.
QUIET_S = 0.3
EXCHANGE_LIMIT_S = 8.0

STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})(?: [^\r\n]*)?")


@dataclass
class Answer:
    status: int
    head: bytes
    headers: dict  # lower-case name -> list of values
    body: bytes
    whole: bool  # the body is complete by its framing (a stream's never is)

    def header(self, name: str) -> str | None:
        v = self.headers.get(name.lower())
        return v[-1] if v else None

    @property
    def stream(self) -> bool:
        """An answer open-ended by design: an event stream or a protocol switch."""
        ct = (self.header("content-type") or "").lower()
        return self.status == 101 or ct.startswith("text/event-stream")


@dataclass
class Parsed:
    answers: list = field(default_factory=list)
    # Bytes that follow the answers and are no (complete) answer head: a cut head, or garbage.
    trailing: bytes = b""
    # What came after a 101: the switched protocol's bytes.
    upgraded: bytes = b""


def parse_answers(raw: bytes, closed: bool) -> Parsed:
    """Splits `raw` into responses by RFC 9112 §6.3: interim 1xx heads (but 101) are skipped,
    204/304 have no body, then chunked, then Content-Length, else the body runs to the close."""
    out = Parsed()
    i = 0
    while i < len(raw):
        end = raw.find(b"\r\n\r\n", i)
        if end < 0:
            out.trailing = raw[i:]
            return out
        head = raw[i:end]
        lines = head.split(b"\r\n")
        m = STATUS_LINE.fullmatch(lines[0])
        if not m:
            out.trailing = raw[i:]
            return out
        status = int(m.group(1))
        headers: dict = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers.setdefault(name.strip().lower().decode("latin-1"), []).append(value.strip().decode("latin-1"))
        j = end + 4
        if 100 <= status < 200 and status != 101:
            i = j
            continue
        if status == 101:
            out.answers.append(Answer(status, head, headers, b"", True))
            out.upgraded = raw[j:]
            return out
        te = ",".join(headers.get("transfer-encoding", [])).lower()
        if status in (204, 304):
            out.answers.append(Answer(status, head, headers, b"", True))
            i = j
        elif te:
            body, used, whole = _dechunk(raw, j)
            out.answers.append(Answer(status, head, headers, body, whole))
            if not whole:
                return out
            i = used
        elif "content-length" in headers:
            n = int(headers["content-length"][0])
            whole = len(raw) - j >= n
            out.answers.append(Answer(status, head, headers, raw[j:j + n], whole))
            if not whole:
                return out
            i = j + n
        else:
            out.answers.append(Answer(status, head, headers, raw[j:], closed))
            return out
    return out


def _dechunk(raw: bytes, at: int) -> tuple[bytes, int, bool]:
    """A chunked body starting at `at`: (data, the index after it, whether it is complete)."""
    body = bytearray()
    while True:
        eol = raw.find(b"\r\n", at)
        if eol < 0:
            return bytes(body), len(raw), False
        size = int(raw[at:eol].split(b";")[0].strip() or b"0", 16)
        at = eol + 2
        if size == 0:
            # Trailer fields, then the empty line.
            while True:
                eol = raw.find(b"\r\n", at)
                if eol < 0:
                    return bytes(body), len(raw), False
                if eol == at:
                    return bytes(body), eol + 2, True
                at = eol + 2
        if len(raw) < at + size + 2:
            body += raw[at:at + size]
            return bytes(body), len(raw), False
        body += raw[at:at + size]
        at += size + 2


@dataclass
class Exchange:
    sent: bytes
    raw: bytes
    closed: bool  # the node closed (or reset) the connection
    reset: bool
    unsent: int  # bytes the node never took (it closed first)
    parsed: Parsed

    @property
    def answers(self) -> list:
        return self.parsed.answers

    def show(self) -> str:
        sent = self.sent if len(self.sent) <= 600 else self.sent[:600] + b"...(%d bytes)" % len(self.sent)
        raw = self.raw if len(self.raw) <= 3000 else self.raw[:3000] + b"...(%d bytes)" % len(self.raw)
        state = "reset" if self.reset else "closed" if self.closed else "still open"
        return (f"\n  sent:     {sent!r}\n  received: {raw!r}\n  connection: {state}"
                f"{f', {self.unsent} bytes unsent' if self.unsent else ''}"
                f"\n  answers: {[a.status for a in self.answers]}")


def exchange(sock: socket.socket, data: bytes, expect: int = 1, quiet: float = QUIET_S,
             limit: float = EXCHANGE_LIMIT_S) -> Exchange:
    """Writes `data` (reading meanwhile, so a node that answers and closes early is heard) and
    reads everything until the node closes the connection, or, once `expect` answers came
    (whole, or the head of a stream), stays silent for `quiet`: a busy machine's slow answer is
    waited for, and an answer the node sends beyond them is heard."""
    sock.setblocking(False)
    out = memoryview(data)
    got = bytearray()
    closed = reset = False
    start = time.monotonic()
    last = start
    answered = expect <= 0
    while True:
        now = time.monotonic()
        if not out and answered and now - last >= quiet:
            break
        if now - start >= limit:
            break
        r, w, _ = select.select([sock], [sock] if out else [], [], 0.02)
        if r:
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                closed = reset = True
                break
            except BlockingIOError:
                chunk = None
            if chunk == b"":
                closed = True
                break
            if chunk:
                got += chunk
                last = time.monotonic()
                # Begun: as many answers as expected, none of them half read (but a stream).
                now_in = parse_answers(bytes(got), False).answers
                answered = len(now_in) >= expect and all(a.whole or a.stream for a in now_in)
        if w and out:
            try:
                n = sock.send(out[:1 << 16])
                out = out[n:]
                if not out:
                    last = time.monotonic()
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                # The node closed while we wrote: read what it answered before that.
                rest, _, reset = _drain(sock)
                got += rest
                return _made(data, got, True, reset, len(out))
    return _made(data, got, closed, reset, len(out))


def _drain(sock: socket.socket) -> tuple[bytes, bool, bool]:
    got = bytearray()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        r, _, _ = select.select([sock], [], [], 0.05)
        if not r:
            continue
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            return bytes(got), True, True
        except BlockingIOError:
            continue
        if not chunk:
            return bytes(got), True, False
        got += chunk
    return bytes(got), False, False


def _made(sent, got, closed, reset, unsent) -> Exchange:
    raw = bytes(got)
    return Exchange(sent, raw, closed, reset, unsent, parse_answers(raw, closed))


def read_answers(sock: socket.socket, n: int, limit: float = 30.0) -> tuple[list, bytearray]:
    """Reads until `n` whole answers came (for exchanges whose answer count is known)."""
    sock.setblocking(True)
    sock.settimeout(limit)
    got = bytearray()
    while True:
        p = parse_answers(bytes(got), False)
        if len(p.answers) >= n and all(a.whole for a in p.answers[:n]):
            return p.answers, got
        chunk = sock.recv(1 << 16)
        assert chunk, f"the connection closed after {len(p.answers)} of {n} answers; received {bytes(got)[:2000]!r}"
        got += chunk


def connect(srv) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s
