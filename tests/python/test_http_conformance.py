"""HTTP/1.1 message framing and request handling by RFC 9112, probed with raw sockets on every
path the node serves (SPEC §3, the paragraph on RFC 9112, and §4).

Every request — the API, an event stream, a long poll and its commands, the WebSocket upgrade,
and a poll on a connection a first poll kept alive — must follow the same rules:

- one answer per request, and a request hidden in a body never runs;
- invalid framing (two Content-Lengths, a malformed Content-Length, a Transfer-Encoding whose
  final coding is not `chunked`, whitespace before a colon, a NUL in a field, a missing or
  doubled Host) gets 400 and a closed connection (RFC 9112 §3.2, §5.1, §6.1, §6.3); both
  Content-Length and Transfer-Encoding get 400, or the body is read as chunked, and either
  way the connection closes (§6.1 allows both); an absolute-form target naming another
  authority is not served (§3.2.2);
- `Connection: close` ends the connection after one answer; pipelined requests are answered
  in order; a head that is too large or too slow is refused or cut;
- an answer is never cut, however large (a 2 MB poll answer).

A hidden request is made observable: it is a `POST /api/publish` to a channel nobody else
uses, so it ran exactly if `GET /api/channels/{ch}` on a fresh connection is not 404 (reads
never create a channel, SPEC §4). Answers are counted by parsing what came back — heads, then
bodies by Content-Length or chunked coding — so a body that holds `HTTP/1.1` is not taken for
an answer (`http_raw`). After every probe the node must still answer a plain request and a
WebSocket bystander must still get its publications.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass

import pytest

import sb
from http_raw import Answer, Exchange, connect, exchange, parse_answers, read_answers
from sb import api_publish, uniq

# The node under test: a small head timeout (the slow-head probes wait for it) and a session
# bound that holds a 2 MB poll answer (SPEC: no answer is cut; the default bound is 1 MiB).
HANDSHAKE_TIMEOUT_S = 2
MAX_PENDING_BYTES = 8 * 1024 * 1024

WS_KEY = "dGhlIHNhbXBsZSBub25jZQ=="


# --------------------------------------------------------------------------------------------
# The server, the bystander, and the check after every test
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(switchboard_bin, tmp_path_factory):
    log = tmp_path_factory.mktemp("http_conformance") / "server.stderr.log"
    srv = sb.start_server(
        switchboard_bin,
        ["--max-pending-bytes", str(MAX_PENDING_BYTES)],
        str(log),
        env={"SWITCHBOARD_LIMITS__HANDSHAKE_TIMEOUT_S": str(HANDSHAKE_TIMEOUT_S)},
    )
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def bystander(server):
    b = sb.Bystander(server)
    yield b
    b.close()


# The channels of hidden requests that had not run when their probe ended, checked again at
# the end of the module: a request the node ran late shows there.
NOT_RAN: list[str] = []


@pytest.fixture(autouse=True)
def node_still_serves(server, bystander):
    yield
    assert server.alive(), "the node died"
    r = sb.http("GET", server.http_url + "/api/info", timeout=10)
    assert r.status == 200, f"after the probe, /api/info answered {r.status} {r.body[:300]!r}"
    bystander.check(1)


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


def host(srv) -> str:
    return f"127.0.0.1:{srv.port}"


def message(method: str, target: str, lines: list, body: bytes = b"", eol: bytes = b"\r\n") -> bytes:
    """A request: the request line, the given header lines as they are, an empty line, the
    body. Nothing is added — framing headers are the caller's."""
    out = f"{method} {target} HTTP/1.1".encode() + eol
    for line in lines:
        out += (line.encode("latin-1") if isinstance(line, str) else line) + eol
    return out + eol + body


def hidden_request(srv) -> tuple[bytes, str]:
    """A complete `POST /api/publish` to a fresh channel: bytes that run a visible request
    should a node read them as one."""
    ch = uniq("hidden.")
    body = json.dumps({"channel": ch, "data": "smuggled"}).encode()
    return message("POST", "/api/publish", [f"Host: {host(srv)}", "Content-Type: application/json",
                                           f"Content-Length: {len(body)}"], body), ch


def ran(srv, ch: str) -> bool:
    """Whether a publish to `ch` ever ran (fresh connection; reads create no channel)."""
    r = sb.http("GET", f"{srv.http_url}/api/channels/{urllib.parse.quote(ch, safe='')}", timeout=10)
    assert r.status in (200, 404), f"GET /api/channels/{ch}: {r.status} {r.body[:300]!r}"
    return r.status == 200


def open_session(srv, commands=()) -> str:
    body = "\n".join(json.dumps(c) for c in commands).encode()
    r = sb.http("POST", srv.http_url + "/poll", raw=body, timeout=10)
    assert r.status == 200, f"POST /poll: {r.status} {r.body[:300]!r}"
    return r.json()["session"]


@dataclass
class Path:
    """One kind of request the node serves: how to make it, what a good answer is, and the
    requests (if any) the same connection carries before it."""

    name: str
    method: str
    target: str
    lines: list  # header lines but Host and framing
    body: bytes
    ok: int
    marker: bytes | None  # in the body of a good answer
    preamble: bytes = b""  # sent and answered first, on the same connection


PATH_NAMES = ["api-get", "api-publish", "sse", "poll-get", "poll-post", "ws-upgrade", "poll-kept-alive"]
# Paths whose good answer ends (an event stream and a protocol switch never hand the
# connection back to HTTP).
NON_STREAM_PATHS = [p for p in PATH_NAMES if p not in ("sse", "ws-upgrade")]


def make_path(srv, name: str) -> Path:
    if name == "api-get":
        return Path(name, "GET", "/api/info", [], b"", 200, b'"version"')
    if name == "api-publish":
        body = json.dumps({"channel": uniq("visible."), "data": {"n": 1}}).encode()
        return Path(name, "POST", "/api/publish", ["Content-Type: application/json"], body, 200, b'"offset"')
    if name == "sse":
        return Path(name, "GET", f"/sse?channels={uniq('sse.')}", ["Accept: text/event-stream"], b"", 200, None)
    if name == "poll-get":
        sid = open_session(srv, [{"id": 1, "subscribe": {"channels": [uniq("poll.")]}}])
        return Path(name, "GET", f"/poll/{sid}?ack=0&timeout=0", [], b"", 200, b'"seq"')
    if name == "poll-post":
        sid = open_session(srv)
        body = json.dumps({"id": 1, "subscribe": {"channels": [uniq("poll.")]}}).encode()
        return Path(name, "POST", f"/poll/{sid}", ["Content-Type: application/json"], body, 202, None)
    if name == "ws-upgrade":
        return Path(name, "GET", "/ws", ["Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {WS_KEY}",
                                         "Sec-WebSocket-Version: 13"], b"", 101, None)
    if name == "poll-kept-alive":
        sid = open_session(srv, [{"id": 1, "subscribe": {"channels": [uniq("poll.")]}}])
        first = message("GET", f"/poll/{sid}?ack=0&timeout=0", [f"Host: {host(srv)}"])
        return Path(name, "GET", f"/poll/{sid}?ack=1&timeout=0", [], b"", 200, b'"seq"', preamble=first)
    raise ValueError(name)


def plain(srv, p: Path, extra: list = (), body: bytes | None = None, eol: bytes = b"\r\n") -> bytes:
    """The path's request as a client would send it (Host, Content-Length when there is a
    body), plus `extra` header lines."""
    body = p.body if body is None else body
    lines = [f"Host: {host(srv)}", *p.lines, *extra]
    if body or p.method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return message(p.method, p.target, lines, body, eol)


def framed(srv, p: Path, framing: list, body: bytes, hostlines: list | None = None, target: str | None = None) -> bytes:
    """The path's request with the given framing header lines (as they are) and body."""
    hostlines = [f"Host: {host(srv)}"] if hostlines is None else hostlines
    return message(p.method, target or p.target, [*hostlines, *p.lines, *framing], body)


def opened(srv, p: Path) -> socket.socket:
    """A connection ready for the path's request: its preamble sent and answered whole."""
    s = connect(srv)
    if p.preamble:
        s.sendall(p.preamble)
        answers, got = read_answers(s, 1)
        assert answers[0].status == 200 and len(parse_answers(bytes(got), False).answers) == 1, \
            f"preamble: {bytes(got)[:2000]!r}"
    return s


def probe(srv, p: Path, data: bytes, expect: int = 1) -> Exchange:
    s = opened(srv, p)
    try:
        return exchange(s, data, expect=expect)
    finally:
        s.close()


# --------------------------------------------------------------------------------------------
# Assertions
# --------------------------------------------------------------------------------------------


def assert_not_ran(srv, ex: Exchange, ch: str, what: str = "a request hidden in a body") -> None:
    assert not ran(srv, ch), f"{what} ran (channel {ch} was published){ex.show()}"
    NOT_RAN.append(ch)


def assert_refused_and_closed(ex: Exchange, statuses=(400,)) -> None:
    """Exactly one answer, a refusal, then the connection closed — nothing after it."""
    assert len(ex.answers) == 1, f"expected one answer {statuses}, got {len(ex.answers)}{ex.show()}"
    a = ex.answers[0]
    assert a.status in statuses, f"expected {statuses}, got {a.status}{ex.show()}"
    assert a.whole, f"the refusal was cut{ex.show()}"
    assert ex.closed, f"the connection stayed open after the refusal{ex.show()}"
    assert not ex.parsed.trailing, f"bytes after the refusal{ex.show()}"


def assert_one_answer(ex: Exchange) -> Answer:
    assert len(ex.answers) == 1, f"expected exactly one answer, got {len(ex.answers)}{ex.show()}"
    assert not ex.parsed.trailing, f"bytes that are no answer after it{ex.show()}"
    return ex.answers[0]


def assert_good(p: Path, a: Answer, ex: Exchange) -> None:
    assert a.status == p.ok, f"{p.name}: expected {p.ok}, got {a.status}{ex.show()}"
    if p.marker is not None:
        assert a.whole and p.marker in a.body, f"{p.name}: not the path's answer{ex.show()}"


# --------------------------------------------------------------------------------------------
# The probe detects a request that runs (the test's own control)
# --------------------------------------------------------------------------------------------


def test_http_probe_sees_a_request_that_runs_and_counts_answers_by_framing(server):
    # The hidden request sent openly runs and is seen; with a publish whose data holds a
    # status line and a read of that channel pipelined behind it, three answers are counted,
    # not four.
    req, ch = hidden_request(server)
    s = connect(server)
    trap = json.dumps({"channel": uniq("trap."), "data": "HTTP/1.1 200 OK\r\n\r\n"}).encode()
    trap_req = message("POST", "/api/publish", [f"Host: {host(server)}", "Content-Type: application/json",
                                               f"Content-Length: {len(trap)}"], trap)
    get_trap = message("GET", "/api/channels/" + json.loads(trap)["channel"], [f"Host: {host(server)}"])
    try:
        ex = exchange(s, req + trap_req + get_trap, expect=3)
    finally:
        s.close()
    assert [a.status for a in ex.answers] == [200, 200, 200], ex.show()
    assert b"HTTP/1.1 200 OK" in ex.answers[2].body, ex.show()
    assert ran(server, ch), f"the control request did not show{ex.show()}"


# --------------------------------------------------------------------------------------------
# Invalid framing: 400 and the connection closed, on every path
# --------------------------------------------------------------------------------------------

# Each makes (framing header lines, body) from the hidden request's bytes. The body is the
# hidden request itself, so that a node reading the framing leniently (ignoring a header it
# does not understand, taking the first of two lengths, a sign or an exponent) runs it.
BAD_FRAMING = {
    # RFC 9112 §6.3 (5): differing Content-Length values are unrecoverable.
    "two-content-lengths": lambda h: (["Content-Length: 0", f"Content-Length: {len(h)}"], h),
    # Content-Length = 1*DIGIT (RFC 9110 §8.6).
    "content-length-negative": lambda h: (["Content-Length: -1"], h),
    "content-length-exponent": lambda h: (["Content-Length: 1e3"], h),
    "content-length-plus-sign": lambda h: ([f"Content-Length: +{len(h)}"], h),
    "content-length-hex": lambda h: ([f"Content-Length: 0x{len(h):x}"], h),
    # RFC 9112 §6.3 (4): in a request, a Transfer-Encoding whose final coding is not chunked.
    "te-xchunked": lambda h: (["Transfer-Encoding: xchunked"], h),
    "te-gzip-alone": lambda h: (["Transfer-Encoding: gzip"], h),
    "te-chunked-then-gzip": lambda h: (["Transfer-Encoding: chunked, gzip"], h),
    "te-second-line-x": lambda h: (["Transfer-Encoding: chunked", "Transfer-Encoding: x"], h),
    # RFC 9112 §5.1: whitespace between a field name and the colon MUST get 400.
    "te-space-before-colon": lambda h: (["Transfer-Encoding : chunked"], h),
    # RFC 9112 §5.2: obsolete line folding gets 400, or is unfolded to one SP — and then the
    # coding "x chunked" is no valid list whose final coding is chunked: 400 either way.
    "te-obs-fold": lambda h: (["Transfer-Encoding: x", " chunked"], h),
}


@pytest.mark.parametrize("probe_name", list(BAD_FRAMING))
@pytest.mark.parametrize("path_name", PATH_NAMES)
def test_http_invalid_framing_is_refused_and_closed(server, path_name, probe_name):
    p = make_path(server, path_name)
    hidden, ch = hidden_request(server)
    framing, body = BAD_FRAMING[probe_name](hidden)
    ex = probe(server, p, framed(server, p, framing, body))
    assert_not_ran(server, ex, ch)
    assert_refused_and_closed(ex)


# Both a length and a chunked coding: RFC 9112 §6.1 lets a server refuse (400) or read the
# body by the Transfer-Encoding alone, and either way it MUST close the connection after
# answering. Two layouts, each smuggling for the reading that gets it wrong:
#   cl-covers-all: Content-Length spans `0\r\n\r\n` + hidden; a node reading chunked that
#     keeps the connection runs the hidden request next.
#   cl-covers-size-line: the hidden request is the chunk's data and Content-Length covers only
#     the chunk-size line; a node reading by the length runs the hidden request next.
def _cl_covers_all(h: bytes, order: str):
    body = b"0\r\n\r\n" + h
    lines = [f"Content-Length: {len(body)}", "Transfer-Encoding: chunked"]
    return (lines if order == "cl-first" else lines[::-1]), body


def _cl_covers_size_line(h: bytes, order: str):
    size_line = f"{len(h):x}\r\n".encode()
    body = size_line + h + b"\r\n0\r\n\r\n"
    lines = [f"Content-Length: {len(size_line)}", "Transfer-Encoding: chunked"]
    return (lines if order == "cl-first" else lines[::-1]), body


@pytest.mark.parametrize("layout", ["cl-covers-all", "cl-covers-size-line"])
@pytest.mark.parametrize("order", ["cl-first", "te-first"])
@pytest.mark.parametrize("path_name", PATH_NAMES)
def test_http_cl_te_is_refused_or_read_chunked_and_closed(server, path_name, order, layout):
    p = make_path(server, path_name)
    hidden, ch = hidden_request(server)
    framing, body = (_cl_covers_all if layout == "cl-covers-all" else _cl_covers_size_line)(hidden, order)
    ex = probe(server, p, framed(server, p, framing, body))
    assert_not_ran(server, ex, ch)
    a = assert_one_answer(ex)
    # Refused or read by its Transfer-Encoding, the connection MUST close after the answer
    # (an event stream or a switched protocol closes when it ends).
    if not a.stream:
        assert ex.closed, f"a request with both Content-Length and Transfer-Encoding was answered {a.status} " \
                          f"and the connection kept (RFC 9112 §6.1: close after answering){ex.show()}"


# --------------------------------------------------------------------------------------------
# Field bytes and Host: 400 and closed
# --------------------------------------------------------------------------------------------

# Each makes the Host lines and other extra lines; the hidden request is pipelined behind, so
# a node that answers 400 and keeps reading runs it.
BAD_HEAD = {
    # RFC 9110 §5.5: NUL is never valid in a field value (RFC 9112 §2.2 lets a recipient
    # replace CR/LF/NUL only when it does not act on the message; a server acts on it).
    "nul-in-field": lambda hp: ([f"Host: {hp}"], ["X-Probe: a\x00b"]),
    # RFC 9112 §3.2: an HTTP/1.1 request without Host, or with more than one, gets 400.
    "no-host": lambda hp: ([], []),
    "two-hosts": lambda hp: ([f"Host: {hp}", f"Host: {hp}"], []),
    "host-list": lambda hp: ([f"Host: {hp}, {hp}"], []),
}


@pytest.mark.parametrize("probe_name", list(BAD_HEAD))
@pytest.mark.parametrize("path_name", PATH_NAMES)
def test_http_bad_field_or_host_is_refused_and_closed(server, path_name, probe_name):
    p = make_path(server, path_name)
    hidden, ch = hidden_request(server)
    hostlines, extra = BAD_HEAD[probe_name](host(server))
    framing = [*extra] + ([f"Content-Length: {len(p.body)}"] if p.body or p.method == "POST" else [])
    data = framed(server, p, framing, p.body, hostlines=hostlines) + hidden
    ex = probe(server, p, data)
    assert_refused_and_closed(ex)
    assert_not_ran(server, ex, ch, "the request pipelined behind a refused one")


# --------------------------------------------------------------------------------------------
# Absolute-form targets (RFC 9112 §3.2.2)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path_name", PATH_NAMES)
def test_http_absolute_form_naming_another_authority_is_refused(server, path_name):
    # The target's authority, not Host, names the resource (RFC 9112 §3.2.2); an authority
    # that is not this node is refused: 400 (a Host that disagrees with it), 421 (not this
    # server) or the node's own 403 for a foreign host (DNS rebinding) — never served.
    p = make_path(server, path_name)
    framing = [f"Content-Length: {len(p.body)}"] if p.body or p.method == "POST" else []
    data = framed(server, p, framing, p.body, target="http://other.example" + p.target)
    ex = probe(server, p, data)
    a = assert_one_answer(ex)
    assert a.status in (400, 403, 421), f"a request for another authority was answered {a.status}{ex.show()}"
    if a.status == 400:
        assert ex.closed, f"400 and the connection kept{ex.show()}"


@pytest.mark.parametrize("path_name", PATH_NAMES)
def test_http_absolute_form_naming_this_node_is_served(server, path_name):
    p = make_path(server, path_name)
    framing = [f"Content-Length: {len(p.body)}"] if p.body or p.method == "POST" else []
    data = framed(server, p, framing, p.body, target=f"http://{host(server)}{p.target}")
    ex = probe(server, p, data)
    assert_good(p, assert_one_answer(ex), ex)


# --------------------------------------------------------------------------------------------
# Bodies, Connection: close, bare LF
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path_name", PATH_NAMES)
def test_http_a_request_hidden_in_a_body_never_runs(server, path_name):
    # A body is a body, on a GET too (RFC 9112 §6.3: Content-Length frames it): it is read
    # and discarded, or the connection closes — it is never read as the next request. A GET's
    # own answer (or a 400) comes once; a POST whose body is no JSON command gets its 4xx.
    p = make_path(server, path_name)
    hidden, ch = hidden_request(server)
    ex = probe(server, p, plain(server, p, body=hidden))
    assert_not_ran(server, ex, ch)
    a = assert_one_answer(ex)
    if p.method == "GET":
        assert a.status in (p.ok, 400), f"{ex.show()}"
    else:
        assert 400 <= a.status < 500, f"a body that is no command was accepted{ex.show()}"


@pytest.mark.parametrize("path_name", PATH_NAMES)
def test_http_connection_close_ends_the_connection_after_one_answer(server, path_name):
    p = make_path(server, path_name)
    hidden, ch = hidden_request(server)
    ex = probe(server, p, plain(server, p, extra=["Connection: close"]) + hidden)
    assert_not_ran(server, ex, ch, "the request pipelined behind `Connection: close`")
    a = assert_one_answer(ex)
    if not a.stream:
        assert_good(p, a, ex)
        assert ex.closed, f"Connection: close, and the connection stayed open{ex.show()}"


@pytest.mark.parametrize("path_name", PATH_NAMES)
def test_http_bare_lf_is_one_request_or_refused(server, path_name):
    # RFC 9112 §2.2: a recipient MAY take a bare LF as a line terminator. Either way the
    # message is one request: one answer (or 400 and a close), never the body run as another.
    p = make_path(server, path_name)
    hidden, ch = hidden_request(server)
    ex = probe(server, p, plain(server, p, body=hidden, eol=b"\n"))
    assert_not_ran(server, ex, ch)
    a = assert_one_answer(ex)
    if a.status == 400 and not ex.closed and p.method == "GET":
        pytest.fail(f"400 for a bare-LF request and the connection kept{ex.show()}")


# --------------------------------------------------------------------------------------------
# Size and time of heads
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path_name", PATH_NAMES)
def test_http_a_huge_head_is_refused_and_closed(server, path_name):
    p = make_path(server, path_name)
    pad = "a" * 1000
    lines = [f"X-Pad-{i}: {pad}" for i in range(1000)]  # about 1 MB of fields
    framing = [*lines] + ([f"Content-Length: {len(p.body)}"] if p.body or p.method == "POST" else [])
    ex = probe(server, p, framed(server, p, framing, p.body))
    if ex.reset and not ex.raw:
        pytest.fail(f"the connection was reset with no answer (expected 431 or 400){ex.show()}")
    assert_refused_and_closed(ex, statuses=(400, 431))


SLOW_PATHS: dict = {}


@pytest.fixture(scope="module")
def slow_heads(server):
    """One connection per path, each sending the start of its request and then nothing. They
    are opened together (so the file waits one head timeout, not one per path); a thread per
    connection notes when the node closed it."""
    made = {}
    for name in PATH_NAMES:
        p = make_path(server, name)
        s = opened(server, p)
        full = plain(server, p)
        cut = full[:full.index(b"\r\n") + 4]  # the request line and "Ho"
        s.sendall(cut)
        rec = {"sent": time.monotonic(), "closed": None, "got": b"", "cut": cut}

        def wait(sock=s, rec=rec):
            sock.settimeout(8 * HANDSHAKE_TIMEOUT_S)
            got = b""
            try:
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    got += chunk
            except ConnectionResetError:
                pass
            except socket.timeout:
                rec["got"] = got
                return
            rec["got"] = got
            rec["closed"] = time.monotonic()

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        made[name] = (s, rec, t)
    yield made
    for s, _, _ in made.values():
        s.close()


@pytest.mark.parametrize("path_name", PATH_NAMES)
def test_http_a_slow_head_is_cut_within_the_head_timeout(server, slow_heads, path_name):
    s, rec, t = slow_heads[path_name]
    t.join(timeout=8 * HANDSHAKE_TIMEOUT_S + 2)
    assert rec["closed"] is not None, (f"a head left unfinished was not cut in {8 * HANDSHAKE_TIMEOUT_S} s "
                                       f"(handshake_timeout_s = {HANDSHAKE_TIMEOUT_S}); sent {rec['cut']!r}, "
                                       f"received {rec['got']!r}")
    took = rec["closed"] - rec["sent"]
    assert took < 4 * HANDSHAKE_TIMEOUT_S, f"cut after {took:.1f} s; sent {rec['cut']!r}, received {rec['got']!r}"
    p = parse_answers(rec["got"], True)
    assert len(p.answers) <= 1 and all(a.status in (400, 408) for a in p.answers), \
        f"a cut head got {[a.status for a in p.answers]}: {rec['got']!r}"


# --------------------------------------------------------------------------------------------
# Pipelining
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path_name", NON_STREAM_PATHS)
def test_http_pipelined_requests_are_answered_once_each_in_order(server, path_name):
    p = make_path(server, path_name)
    info = message("GET", "/api/info", [f"Host: {host(server)}"])
    ex = probe(server, p, plain(server, p) + info + plain(server, p), expect=3)
    assert [a.status for a in ex.answers] == [p.ok, 200, p.ok], f"{ex.show()}"
    assert all(a.whole for a in ex.answers) and not ex.parsed.trailing, ex.show()
    assert b'"version"' in ex.answers[1].body, f"the answers came out of order{ex.show()}"
    for a in (ex.answers[0], ex.answers[2]):
        assert_good(p, a, ex)
    assert not ex.closed, f"a kept-alive connection was closed{ex.show()}"
    if path_name == "api-publish":
        first, second = json.loads(ex.answers[0].body), json.loads(ex.answers[2].body)
        assert second["offset"] == first["offset"] + 1, ex.show()


POLL_CONNECTIONS = ["first-request", "kept-alive", "after-another-request"]


def poll_connection(srv, how: str, sid: str) -> socket.socket:
    """A connection on which a poll of `sid` comes as its first request, after a first poll
    of the session was answered on it, or after another kind of request."""
    s = connect(srv)
    if how == "kept-alive":
        s.sendall(message("GET", f"/poll/{sid}?ack=0&timeout=0", [f"Host: {host(srv)}"]))
        answers, _ = read_answers(s, 1)
        assert answers[0].status == 200 and json.loads(answers[0].body)["seq"] == 1
    elif how == "after-another-request":
        s.sendall(message("GET", "/healthz", [f"Host: {host(srv)}"]))
        answers, _ = read_answers(s, 1)
        assert answers[0].status == 200
    return s


def subscribed_poll_connection(server, how: str, ch: str):
    """A session subscribed to `ch` whose subscribe reply is taken (batch 1), so that its next
    poll (`ack=1`) has nothing pending, and a connection of kind `how` to poll it on."""
    sid = open_session(server, [{"id": 1, "subscribe": {"channels": [ch]}}])
    if how != "kept-alive":
        r = sb.http("GET", f"{server.http_url}/poll/{sid}?ack=0&timeout=0", timeout=10)
        assert r.status == 200 and r.json()["seq"] == 1, r.body
    return sid, poll_connection(server, how, sid)


@pytest.mark.parametrize("how", POLL_CONNECTIONS)
def test_http_a_request_behind_a_held_poll_is_answered_right_after_it(server, how):
    ch = uniq("held.")
    sid, s = subscribed_poll_connection(server, how, ch)
    poll_timeout = 5
    try:
        sent = time.monotonic()
        s.sendall(message("GET", f"/poll/{sid}?ack=1&timeout={poll_timeout}", [f"Host: {host(server)}"]))
        s.sendall(message("GET", "/api/info", [f"Host: {host(server)}"]))
        time.sleep(0.5)
        api_publish(server, ch, "wake")
        s.settimeout(poll_timeout + 5)
        got, at = bytearray(), {}
        while len(at) < 2:
            chunk = s.recv(65536)
            assert chunk, f"closed; received {bytes(got)!r}"
            got += chunk
            p = parse_answers(bytes(got), False)
            for i, a in enumerate(p.answers):
                if a.whole and i not in at:
                    at[i] = time.monotonic() - sent
    finally:
        s.close()
    answers = parse_answers(bytes(got), False).answers
    assert [a.status for a in answers] == [200, 200], bytes(got)
    batch = json.loads(answers[0].body)
    assert [m["pub"]["data"] for m in batch["messages"] if "pub" in m] == ["wake"], bytes(got)
    assert b'"version"' in answers[1].body, bytes(got)
    # Answered by the publication, not by its timeout; the request behind it right after.
    assert at[0] < poll_timeout - 1, f"the poll was answered after {at[0]:.2f} s: {bytes(got)!r}"
    assert at[1] - at[0] < 1.5 and at[1] < poll_timeout - 1, \
        f"the request behind the poll was answered {at[1] - at[0]:.2f} s after it ({at[1]:.2f} s after sending)"


# --------------------------------------------------------------------------------------------
# A large answer is never cut
# --------------------------------------------------------------------------------------------

BIG_COUNT = 36
BIG_SIZE = 60_000  # under the default limits.max_publication_bytes (65536)


@pytest.mark.parametrize("how", POLL_CONNECTIONS)
def test_http_a_2mb_poll_answer_comes_whole(server, how):
    ch = uniq("big.")
    sid, s = subscribed_poll_connection(server, how, ch)
    try:
        for i in range(BIG_COUNT):
            api_publish(server, ch, f"{i:06d}" + "x" * (BIG_SIZE - 6))
        s.sendall(message("GET", f"/poll/{sid}?ack=1&timeout=0", [f"Host: {host(server)}"]))
        ex = exchange(s, b"", expect=1, quiet=0.5, limit=30)
        assert ex.answers and ex.answers[0].whole, f"the answer was cut or lost{_short(ex)}"
        a = ex.answers[0]
        assert a.status == 200, _short(ex)
        assert len(a.body) > 2_000_000, f"{len(a.body)} bytes{_short(ex)}"
        batch = json.loads(a.body)
        pubs = [m["pub"] for m in batch["messages"] if "pub" in m]
        offsets = [m["off"] for m in pubs]
        assert offsets == list(range(1, BIG_COUNT + 1)), f"offsets {offsets}"
        assert all(m["data"] == f"{m['off'] - 1:06d}" + "x" * (BIG_SIZE - 6) for m in pubs), "data changed"
        assert len(ex.answers) == 1 and not ex.parsed.trailing, _short(ex)
        # The connection goes on.
        assert not ex.closed, f"the connection closed after the answer{_short(ex)}"
        s.sendall(message("GET", "/api/info", [f"Host: {host(server)}"]))
        answers, got = read_answers(s, 1)
        assert answers[0].status == 200 and b'"version"' in answers[0].body, bytes(got)[:2000]
    finally:
        s.close()


def _short(ex: Exchange) -> str:
    heads = [a.head for a in ex.answers]
    state = "reset" if ex.reset else "closed" if ex.closed else "still open"
    return (f"\n  received {len(ex.raw)} bytes; heads {heads!r}; first bytes {ex.raw[:400]!r}; "
            f"last bytes {ex.raw[-200:]!r}; connection {state}")


# --------------------------------------------------------------------------------------------
# Nothing hidden ran later
# --------------------------------------------------------------------------------------------


def test_http_no_hidden_request_ran_later(server):
    assert NOT_RAN, "no probe ran before this check"
    late = [ch for ch in NOT_RAN if ran(server, ch)]
    assert not late, f"hidden requests ran after their probe was over: {late}"
