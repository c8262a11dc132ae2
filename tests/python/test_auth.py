"""Authentication and permissions (SPEC §6, docs/security.md) against the real binary, with
clients nobody on the project wrote: Python `websockets`, tokens minted by PyJWT.

Most tests share one server (module scope) that logs at trace level; the last test greps that
log, and /metrics, for every secret the module used: none may appear."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import pathlib
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import jwt
import pytest
from websockets.asyncio.client import connect as async_ws_connect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

import sb
from sb import WS, http, uniq

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "auth"
SECRET = "python-test-secret-5f1d0c9e8b7a6f5e4d3c-2b1a0f9e8d7c6b5a4f3e2d1c"
API_KEY = "python-api-key-7c6b5a4f3e2d1c0b"
PASSWORD = "py-basic-password-0a9b8c"

# Every secret this module hands out; none may reach the server's log or metrics.
SEEN_SECRETS: set[str] = {SECRET, API_KEY, PASSWORD}


def now() -> int:
    return int(time.time())


def token(claims: dict | None = None, *, key: str | bytes = SECRET, alg: str = "HS256",
          headers: dict | None = None, **extra) -> str:
    body = {"sub": "alice", "exp": now() + 600}
    body.update(claims or {})
    body.update(extra)
    t = jwt.encode(body, key, algorithm=alg, headers=headers)
    SEEN_SECRETS.add(t)
    return t


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class AuthWS(WS):
    """`sb.WS` with handshake extras: headers, offered subprotocols, origin, source address."""

    def __init__(self, url: str, *, headers: dict | None = None, offer: list | None = None,
                 origin: str | None = None, open_timeout: float = 5.0,
                 source_ip: str | None = None):
        sock = None
        if source_ip is not None:  # connect from a chosen 127.0.0.x address
            host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(open_timeout)
            sock.bind((source_ip, 0))
            sock.connect((host, int(port)))
        self.conn = ws_connect(
            url,
            sock=sock,
            additional_headers=headers,
            subprotocols=offer,
            origin=origin,
            compression=None,
            proxy=None,
            open_timeout=open_timeout,
            close_timeout=2,
            ping_interval=None,
            max_size=None,
        ).__enter__()
        self.binary = self.conn.subprotocol == sb.MSGPACK_PROTOCOL
        self.pending = __import__("collections").deque()
        self._id = 0
        self.frames = 0
        self.multi_message_frames = 0
        self.closed = None


def bearer(t: str) -> dict:
    return {"Authorization": f"Bearer {t}"}


def basic(user: str, password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def assert_closed_4001(ws: WS, why: str = "") -> str:
    closed = ws.wait_closed(timeout=10)
    assert closed.code == 4001, (closed.code, closed.reason)
    discs = [m["disconnect"] for m in closed.messages if "disconnect" in m]
    assert len(discs) == 1, closed.messages
    assert discs[0]["code"] == 4001 and discs[0]["reconnect"] is False, discs
    assert why in discs[0]["reason"], (why, discs[0]["reason"])
    return discs[0]["reason"]


def api_publish_key(server, channel, data, key=API_KEY):
    r = http("POST", server.http_url + "/api/publish", {"channel": channel, "data": data},
             headers={"Authorization": f"Bearer {key}"})
    assert r.status == 200, (r.status, r.body)
    return r.json()


def proves_access(server, ws: WS, channel: str) -> None:
    reply = ws.subscribe([channel])["channels"][channel]
    assert "error" not in reply, reply
    api_publish_key(server, channel, {"to": channel})
    assert ws.pubs(channel, 1) == [{"ch": channel, "off": reply["offset"] + 1, "data": {"to": channel}}]


@pytest.fixture(scope="module")
def users_file(switchboard_bin, tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("users") / "users"
    sb.add_user(switchboard_bin, path, "grace", PASSWORD)
    assert PASSWORD not in path.read_text()
    return path


@pytest.fixture(scope="module")
def auth_server(switchboard_bin, users_file, tmp_path_factory):
    """One node with every authentication method, logging everything."""
    config = tmp_path_factory.mktemp("cfg") / "switchboard.toml"
    config.write_text(f"""
[auth]
jwks = "{FIXTURES / 'jwks.json'}"
users = "{users_file}"
allowed_origins = ["https://app.example.com"]

[auth.grants.grace]
channels = ["basic.*", "room:**"]
publish = ["room:grace"]

# Token users (by `sub`) with dashboard rights other than the default "own".
[auth.grants.erin]
dashboards = "edit"

[auth.grants.rita]
dashboards = "read"

[namespaces.public]
allow = {{ subscribe = "anonymous" }}

[namespaces.vip]
allow = {{ subscribe = "claims", history = "claims" }}
""")
    log = tmp_path_factory.mktemp("log") / "server.stderr.log"
    srv = sb.start_server(
        switchboard_bin,
        ["--config", str(config), "--jwt-secret", SECRET, "--api-key", API_KEY],
        str(log),
        env={"SWITCHBOARD_LOG": "trace"},
    )
    yield srv
    srv.kill()


# ------------------------------------------------------------------------------ token sources


def test_auth_token_in_authorization_header(auth_server):
    with AuthWS(auth_server.ws_url, headers=bearer(token())) as ws:
        proves_access(auth_server, ws, uniq("hdr."))


def test_auth_token_in_query_parameter(auth_server):
    with AuthWS(auth_server.ws_url + "?token=" + token()) as ws:
        proves_access(auth_server, ws, uniq("qry."))


@pytest.mark.parametrize("protocol", [sb.JSON_PROTOCOL, sb.MSGPACK_PROTOCOL])
def test_auth_token_in_subprotocol_is_never_echoed(auth_server, protocol):
    t = token()
    with AuthWS(auth_server.ws_url, offer=[protocol, "switchboard.token." + t]) as ws:
        assert ws.subprotocol == protocol
        proves_access(auth_server, ws, uniq("sub."))


def test_auth_token_only_subprotocol_gets_no_protocol_echo(auth_server):
    """A client that offers only the token entry gets no subprotocol back (never the token)."""
    t = token()
    s = socket.create_connection(("127.0.0.1", auth_server.port), timeout=5)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall((f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                   f"Sec-WebSocket-Protocol: switchboard.token.{t}\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            assert chunk, head
            head += chunk
        text = head.split(b"\r\n\r\n")[0].decode("latin-1").lower()
        assert text.startswith("http/1.1 101")
        assert "sec-websocket-protocol" not in text
        assert t.lower() not in text
    finally:
        s.close()


def test_auth_token_in_connect_command(auth_server):
    with AuthWS(auth_server.ws_url) as ws:
        ch = uniq("cmd.")
        assert ws.subscribe([ch])["channels"][ch]["error"]["code"] == 401
        ok = ws.ok("connect", {"token": token({"sub": "zoe"}), "name": "pytest"})
        assert ok["user"] == "zoe" and ok["ping_s"] > 0 and ok["expires"] > now()
        proves_access(auth_server, ws, uniq("cmd."))


# ------------------------------------------------------------------------------ refusals


def _none_token() -> str:
    t = b64url(b'{"alg":"none","typ":"JWT"}') + "." + b64url(json.dumps(
        {"sub": "alice", "exp": now() + 600}).encode()) + "."
    SEEN_SECRETS.add(t)
    return t


def _tampered() -> str:
    head, _, sig = token().split(".")
    t = ".".join([head, b64url(json.dumps({"sub": "root", "exp": now() + 600}).encode()), sig])
    SEEN_SECRETS.add(t)
    return t


BAD_TOKENS = {
    "wrong-key": (lambda: token(key="some-other-secret-of-sufficient-length"), "signature"),
    "wrong-alg-hs384": (lambda: token(alg="HS384"), "algorithm"),
    "rs256-unknown-kid": (
        lambda: token(key=(FIXTURES / "rsa-other.key.pem").read_bytes(), alg="RS256",
                      headers={"kid": "rsa-9"}), "algorithm"),
    "alg-none": (_none_token, ""),
    "alg-none-jwt-lib": (lambda: token(key=None, alg="none"), ""),
    "expired": (lambda: token({"exp": now() - 60}), "expired"),
    "not-yet-valid": (lambda: token({"nbf": now() + 3600}), "not valid yet"),
    "tampered": (_tampered, "signature"),
    "no-sub": (lambda: token({"sub": None}), "sub"),
    "bad-channel-claim": (lambda: token({"channels": ["a b"]}), "channels"),
    "garbage": (lambda: "x.y.z", ""),
}


@pytest.mark.parametrize("name", list(BAD_TOKENS))
@pytest.mark.parametrize("how", ["header", "query", "subprotocol", "connect"])
def test_auth_bad_tokens_close_4001(auth_server, name, how):
    make, why = BAD_TOKENS[name]
    t = make()
    if how == "header":
        ws = AuthWS(auth_server.ws_url, headers=bearer(t))
    elif how == "query":
        ws = AuthWS(auth_server.ws_url + "?token=" + t)
    elif how == "subprotocol":
        ws = AuthWS(auth_server.ws_url, offer=[sb.JSON_PROTOCOL, "switchboard.token." + t])
    else:
        ws = AuthWS(auth_server.ws_url)
        ws.send({"id": 1, "connect": {"token": t}})
    with ws:
        reason = assert_closed_4001(ws, why)
        assert t not in reason


def test_auth_rs256_and_es256_from_the_jwks(auth_server):
    for alg, kid, key in [("RS256", "rsa-1", "rsa.key.pem"), ("ES256", "ec-1", "ec.key.pem")]:
        t = token(key=(FIXTURES / key).read_bytes(), alg=alg, headers={"kid": kid})
        with AuthWS(auth_server.ws_url, headers=bearer(t)) as ws:
            assert ws.ping(kid) == {"data": kid}
        forged = token(key=(FIXTURES / "rsa-other.key.pem").read_bytes(), alg="RS256", headers={"kid": "rsa-1"})
        with AuthWS(auth_server.ws_url, headers=bearer(forged)) as ws:
            assert_closed_4001(ws, "signature")


def test_auth_rs256_from_a_pem_public_key(start_server):
    srv = start_server("--jwt-public-key", str(FIXTURES / "rsa.pub.pem"))
    good = token(key=(FIXTURES / "rsa.key.pem").read_bytes(), alg="RS256")
    with AuthWS(srv.ws_url, headers=bearer(good)) as ws:
        assert ws.ping(1) == {"data": 1}
    # Algorithm confusion: HS256 keyed with the public key's PEM text (made by hand: PyJWT
    # itself refuses to use a PEM key as an HMAC secret).
    msg = b64url(b'{"alg":"HS256","typ":"JWT"}') + "." + b64url(json.dumps({"sub": "x", "exp": now() + 60}).encode())
    sig = hmac.new((FIXTURES / "rsa.pub.pem").read_bytes(), msg.encode(), hashlib.sha256).digest()
    t = msg + "." + b64url(sig)
    SEEN_SECRETS.add(t)
    with AuthWS(srv.ws_url, headers=bearer(t)) as ws:
        assert_closed_4001(ws, "algorithm")


# ------------------------------------------------------------------------------ permissions


def test_auth_forbidden_channels_and_publishes_get_403(auth_server):
    t = token({"sub": "bob", "channels": ["room:team.*", "pt:plant1.**"], "publish": ["room:team.chat"]})
    with AuthWS(auth_server.ws_url, headers=bearer(t)) as ws:
        chans = ["room:team.chat", "pt:plant1.a.b", "room:other", "pt:plant2.a", "room:team.a.b"]
        got = ws.subscribe(chans)["channels"]
        assert {c: ("error" in got[c]) and got[c]["error"]["code"] for c in chans} == {
            "room:team.chat": False, "pt:plant1.a.b": False,
            "room:other": 403, "pt:plant2.a": 403, "room:team.a.b": 403}
        assert "offset" in ws.ok("publish", {"channel": "room:team.chat", "data": "hi"})
        assert ws.request("publish", {"channel": "room:team.x", "data": 1})["error"]["code"] == 403
        assert ws.request("history", {"channel": "room:other"})["error"]["code"] == 403
        assert ws.request("presence", {"channel": "room:other"})["error"]["code"] == 403
        assert ws.ping("still open") == {"data": "still open"}


def test_auth_namespace_levels_anonymous_and_claims(auth_server):
    pub = uniq("public:")
    vip = uniq("vip:")
    with AuthWS(auth_server.ws_url) as anon:
        assert "error" not in anon.subscribe([pub])["channels"][pub], "public: is open to anonymous clients"
        assert anon.subscribe([vip])["channels"][vip]["error"]["code"] == 401
    with AuthWS(auth_server.ws_url, headers=bearer(token())) as plain_user:
        assert plain_user.subscribe([vip])["channels"][vip]["error"]["code"] == 403, "claims level needs a pattern"
    with AuthWS(auth_server.ws_url, headers=bearer(token({"channels": ["vip:**"]}))) as vip_user:
        assert "error" not in vip_user.subscribe([vip])["channels"][vip]
        assert "publications" in vip_user.ok("history", {"channel": vip})


# ------------------------------------------------------------------------------ refresh and expiry


def test_auth_refresh_extends_and_expiry_disconnects_4001(auth_server):
    first_exp = now() + 2
    short = token({"sub": "dave", "exp": first_exp})
    ch = uniq("refresh.")
    with AuthWS(auth_server.ws_url, headers=bearer(short)) as kept, \
            AuthWS(auth_server.ws_url, headers=bearer(short)) as lapsed:
        kept.subscribe([ch])
        later = now() + 600
        assert kept.ok("refresh", {"token": token({"sub": "dave", "exp": later})}) == {"expires": later}
        assert kept.request("refresh", {"token": token({"sub": "eve"})})["error"]["code"] == 403
        assert kept.request("refresh", {"token": token({"sub": "dave", "exp": now() - 9})})["error"]["code"] == 401
        assert assert_closed_4001(lapsed) == "token expired"
        while now() <= first_exp:
            time.sleep(0.1)
        api_publish_key(auth_server, ch, "after expiry")
        assert kept.pubs(ch, 1)[0]["data"] == "after expiry"


# ------------------------------------------------------------------------------ Basic, API keys, origins


def test_auth_basic_user_in_connect_command(auth_server):
    # Browsers cannot set Authorization on a WebSocket handshake: the sign-in form of the
    # dashboard sends the user and password in `connect`, with the same grants as a header.
    with AuthWS(auth_server.ws_url) as ws:
        assert ws.ok("connect", {"user": "grace", "password": PASSWORD})["user"] == "grace"
        proves_access(auth_server, ws, uniq("basic."))
        other = uniq("other.")
        assert ws.subscribe([other])["channels"][other]["error"]["code"] == 403, "grants apply"
    with AuthWS(auth_server.ws_url) as ws:
        ws.send({"id": 1, "connect": {"user": "grace", "password": "wrong"}})
        assert "password" in assert_closed_4001(ws)
    with AuthWS(auth_server.ws_url) as ws:
        ws.send({"id": 1, "connect": {"user": "grace", "password": PASSWORD, "token": token()}})
        assert "either a token or a user" in assert_closed_4001(ws)


def test_auth_basic_users_with_grants(auth_server):
    with AuthWS(auth_server.ws_url, headers=basic("grace", PASSWORD)) as ws:
        proves_access(auth_server, ws, uniq("basic."))
        other = uniq("other.")
        assert ws.subscribe([other])["channels"][other]["error"]["code"] == 403, "grants restrict Basic users"
        assert "offset" in ws.ok("publish", {"channel": "room:grace", "data": 1})
        assert ws.request("publish", {"channel": "room:x", "data": 1})["error"]["code"] == 403
        assert ws.request("refresh", {"token": token()})["error"]["code"] == 400
    for user, pw in [("grace", "wrong"), ("mallory", PASSWORD), ("grace", "")]:
        with AuthWS(auth_server.ws_url, headers=basic(user, pw)) as ws:
            assert_closed_4001(ws, "password")


def test_auth_password_checks_are_limited_per_address_and_cached(start_server, users_file):
    srv = start_server("--users", str(users_file), "--api-key", API_KEY, env={
        "SWITCHBOARD_EXEMPT_LOOPBACK": "false", "SWITCHBOARD_PASSWORD_CHECKS_PER_IP_PER_S": "1"})
    ip = "127.0.0.7"
    with AuthWS(srv.ws_url, headers=basic("grace", PASSWORD), source_ip=ip) as ws:
        assert ws.ping(1) == {"data": 1}  # one check spent, the password is now remembered
    codes = []
    for i in range(20):
        with AuthWS(srv.ws_url, headers=basic("grace", f"guess-{i}"), source_ip=ip) as ws:
            codes.append(ws.wait_closed().code)
    # A burst of two checks, then about one per second: most guesses are refused unchecked.
    assert set(codes) == {4001, 4029} and codes.count(4029) >= 10, codes
    # The remembered password still gets in without a check; another address is unaffected.
    with AuthWS(srv.ws_url, headers=basic("grace", PASSWORD), source_ip=ip) as ws:
        assert ws.ping(2) == {"data": 2}
    with AuthWS(srv.ws_url, headers=basic("grace", "wrong"), source_ip="127.0.0.8") as ws:
        assert ws.wait_closed().code == 4001


def test_auth_http_api_keys_tokens_and_basic(auth_server):
    url = auth_server.http_url
    ch = uniq("api.")
    body = {"channel": ch, "data": 1}
    r = http("POST", url + "/api/publish", body)
    assert r.status == 401 and r.json()["error"]["code"] == 401
    assert r.headers.get("www-authenticate", "").startswith("Bearer")
    assert http("POST", url + "/api/publish", body, headers=bearer("not-the-key-0000000000")).status == 401
    assert http("POST", url + "/api/publish", body, headers=bearer(API_KEY)).status == 200
    assert http("GET", url + "/api/channels/" + ch, headers=bearer(API_KEY)).json()["offset"] == 1
    assert http("GET", url + "/api/info").status == 401
    # Tokens and users publish only where clients may, within their patterns.
    room = "room:grace"
    assert http("POST", url + "/api/publish", {"channel": room, "data": 1},
                headers=basic("grace", PASSWORD)).status == 200
    assert http("POST", url + "/api/publish", body, headers=basic("grace", PASSWORD)).status == 403
    assert http("POST", url + "/api/publish", body, headers=basic("grace", "nope")).status == 401
    res = http("POST", url + "/api/publish", {"batch": [{"channel": room, "data": 2}, {"channel": ch, "data": 2}]},
               headers=basic("grace", PASSWORD)).json()["results"]
    assert "offset" in res[0] and res[1]["error"]["code"] == 403
    assert http("GET", url + f"/api/channels/{sb.ch_path(ch)}/history", headers=bearer(token())).status == 200
    assert http("GET", url + "/api/channels/" + ch, headers=bearer(token({"channels": ["x"]}))).status == 403
    # Health, readiness and metrics stay open.
    for path in ["/healthz", "/readyz", "/metrics"]:
        assert http("GET", url + path).status == 200, path


def test_auth_http_writes_from_other_origins_are_refused(auth_server):
    url = auth_server.http_url + "/api/publish"
    body = {"channel": uniq("o."), "data": 1}
    r = http("POST", url, body, headers={**bearer(API_KEY), "Origin": "https://evil.example.net"})
    assert r.status == 403
    r = http("POST", url, body, headers={**bearer(API_KEY), "Origin": "https://app.example.com"})
    assert r.status == 200


def test_auth_websocket_from_another_origin_is_refused_403(auth_server):
    with pytest.raises(InvalidStatus) as e:
        AuthWS(auth_server.ws_url, origin="https://evil.example.net", headers=bearer(token()))
    assert e.value.response.status_code == 403
    with AuthWS(auth_server.ws_url, origin="https://app.example.com", headers=bearer(token())) as ws:
        assert ws.ping(1) == {"data": 1}


def test_auth_same_origin_only_without_an_allow_list(server):
    own = f"http://127.0.0.1:{server.port}"
    with AuthWS(server.ws_url, origin=own) as ws:
        assert ws.ping(1) == {"data": 1}
    with pytest.raises(InvalidStatus) as e:
        AuthWS(server.ws_url, origin="http://localhost.evil.example:1")
    assert e.value.response.status_code == 403


def test_auth_api_key_publish_rate_is_limited_429(start_server):
    srv = start_server("--api-key", API_KEY, env={"SWITCHBOARD_PUBLISHES_PER_API_KEY_PER_S": "5"})
    ch = uniq("rate.")
    statuses = [http("POST", srv.http_url + "/api/publish", {"channel": ch, "data": i},
                     headers=bearer(API_KEY)).status for i in range(100)]
    assert statuses.count(200) >= 10 and 429 in statuses, statuses
    assert set(statuses) == {200, 429}
    batch = [{"channel": ch, "data": i} for i in range(60)]
    time.sleep(2.1)  # the bucket refills (it holds 2 s worth)
    res = http("POST", srv.http_url + "/api/publish", {"batch": batch}, headers=bearer(API_KEY)).json()["results"]
    codes = [r.get("error", {}).get("code", 200) for r in res]
    assert codes.count(200) >= 10 and codes.count(429) >= 20 and set(codes) == {200, 429}
    assert codes == sorted(codes), "the first items of a batch go through, the rest get 429"


# ------------------------------------------------------------------------------ startup rules and TLS


def test_auth_settings_from_the_environment(start_server, users_file):
    """The flags' settings also come as SWITCHBOARD_* variables (lists comma-separated)."""
    srv = start_server(env={
        "SWITCHBOARD_JWT_SECRET": SECRET,
        "SWITCHBOARD_API_KEY": f"{API_KEY},another-key-0123456789",
        "SWITCHBOARD_USERS": str(users_file),
        "SWITCHBOARD_ALLOWED_ORIGIN": "https://a.example.com, https://b.example.com",
        "SWITCHBOARD_JWKS": str(FIXTURES / "jwks.json"),
    })
    with AuthWS(srv.ws_url, headers=bearer(token()), origin="https://b.example.com") as ws:
        assert ws.ping(1) == {"data": 1}
    es = token(key=(FIXTURES / "ec.key.pem").read_bytes(), alg="ES256", headers={"kid": "ec-1"})
    with AuthWS(srv.ws_url, headers=bearer(es)) as ws:
        assert ws.ping(2) == {"data": 2}
    with AuthWS(srv.ws_url, headers=basic("grace", PASSWORD)) as ws:
        assert ws.ping(3) == {"data": 3}
    with pytest.raises(InvalidStatus):
        AuthWS(srv.ws_url, headers=bearer(token()), origin="https://c.example.com")
    for key in [API_KEY, "another-key-0123456789"]:
        r = http("POST", srv.http_url + "/api/publish", {"channel": "env", "data": 1}, headers=bearer(key))
        assert r.status == 200, key
    with AuthWS(srv.ws_url) as ws:
        assert ws.subscribe(["env"])["channels"]["env"]["error"]["code"] == 401


def test_auth_beyond_loopback_needs_auth_or_allow_anonymous(switchboard_bin):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    r = subprocess.run([switchboard_bin, "serve", "--listen", "0.0.0.0:0"], capture_output=True, text=True,
                       timeout=30, env=env)
    assert r.returncode == 2
    assert "--allow-anonymous" in r.stderr and "listen" in r.stderr
    r = subprocess.run([switchboard_bin, "serve", "--listen", "127.0.0.1:0", "--jwt-secret", "short"],
                       capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 2 and "jwt_secret" in r.stderr
    assert "short" not in r.stderr
    r = subprocess.run([switchboard_bin, "serve", "--listen", "127.0.0.1:0", "--tls-cert",
                        str(FIXTURES / "tls.cert.pem")], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 2 and "tls" in r.stderr


def _start_tls(switchboard_bin, tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    with open(tmp_path / "tls.stderr.log", "wb") as log:
        proc = subprocess.Popen([switchboard_bin, "serve", "--listen", "127.0.0.1:0",
                                 "--tls-cert", str(FIXTURES / "tls.cert.pem"), "--tls-key",
                                 str(FIXTURES / "tls.key.pem"), *args],
                                stdout=subprocess.PIPE, stderr=log, env=env)
    line = proc.stdout.readline().decode()
    assert line.startswith("switchboard listening on https://127.0.0.1:"), line
    return proc, int(line.rsplit(":", 1)[1])


def test_auth_tls_serves_wss_and_https(switchboard_bin, tmp_path):
    # The WebSocket client here is websockets' asyncio one: its sync client reads and writes one
    # `ssl.SSLSocket` from two threads, which CPython's ssl module does not make safe, and a
    # TLS 1.3 session ticket arriving while it sends its upgrade request sometimes loses it.
    proc, port = _start_tls(switchboard_bin, tmp_path, "--jwt-secret", SECRET, "--api-key", API_KEY)
    ctx = ssl.create_default_context(cafile=str(FIXTURES / "tls.cert.pem"))
    ch = uniq("tls.")
    # Larger than one TLS record (16 KiB), within the publication limit.
    data = {"n": list(range(6000))}

    def publish() -> int:
        req = urllib.request.Request(f"https://127.0.0.1:{port}/api/publish", method="POST",
                                     data=json.dumps({"channel": ch, "data": data}).encode(),
                                     headers={"Authorization": f"Bearer {API_KEY}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status

    async def session() -> None:
        # A handshake's time is not what this checks: a loaded machine may take seconds.
        async with async_ws_connect(f"wss://127.0.0.1:{port}/ws", ssl=ctx, additional_headers=bearer(token()),
                                    compression=None, max_size=None, ping_interval=None,
                                    open_timeout=20) as ws:

            pending: list = []

            async def reply(pred):
                # A text frame carries one or more messages, one per line.
                while True:
                    for i, msg in enumerate(pending):
                        if pred(msg):
                            return pending.pop(i)
                    frame = await asyncio.wait_for(ws.recv(), 10)
                    pending.extend(json.loads(line) for line in frame.split("\n") if line)

            await ws.send(json.dumps({"id": 1, "subscribe": {"channels": [ch]}}))
            assert "ok" in await reply(lambda m: m.get("id") == 1)
            assert await asyncio.to_thread(publish) == 200
            assert (await reply(lambda m: m.get("pub", {}).get("ch") == ch))["pub"]["data"] == data
            for i in range(200):
                await ws.send(json.dumps({"id": 1000 + i, "ping": {"data": i}}))
            got = [(await reply(lambda m, i=i: m.get("id") == 1000 + i))["ok"]["data"] for i in range(200)]
            assert got == list(range(200))

    try:
        asyncio.run(session())
        # A request without the key is refused over TLS as over plain HTTP.
        req = urllib.request.Request(f"https://127.0.0.1:{port}/api/info")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, context=ctx, timeout=10)
        assert e.value.code == 401
        e.value.close()
        # Plain HTTP on the TLS port does not get through.
        with pytest.raises(Exception):
            AuthWS(f"ws://127.0.0.1:{port}/ws", open_timeout=3)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


# ------------------------------------------------------------------------------ saved dashboards


def test_auth_dashboards_belong_to_their_creator(auth_server):
    # Any credential could overwrite or delete any dashboard: now only its creator, or an API
    # key (operators' tooling), may; a bystander's own dashboard is untouched throughout.
    url = auth_server.http_url + "/api/dashboards/"
    body = {"title": "Grace's", "widgets": []}
    mine, theirs = uniq("own-"), uniq("bystander-")
    assert http("PUT", url + theirs, {"title": "Alice's", "widgets": []}, headers=bearer(token())).status == 201
    assert http("PUT", url + mine, body, headers=basic("grace", PASSWORD)).status == 201
    for who in (bearer(token()), bearer(token(sub="mallory"))):
        r = http("PUT", url + mine, {"title": "taken", "widgets": []}, headers=who)
        assert r.status == 403 and 'belongs to \\"grace\\"' in r.body.decode(), r.body
        assert http("DELETE", url + mine, headers=who).status == 403
    assert http("PUT", url + mine, {"title": "Grace's, again", "widgets": []}, headers=basic("grace", PASSWORD)).status == 200
    assert http("PUT", url + mine, body, headers=bearer(API_KEY)).status == 200
    got = json.loads(http("GET", url + mine, headers=basic("grace", PASSWORD)).body)
    assert got["owner"] == "grace" and got["title"] == "Grace's", got
    assert http("DELETE", url + mine, headers=basic("grace", PASSWORD)).status == 204
    assert json.loads(http("GET", url + theirs, headers=bearer(token())).body)["title"] == "Alice's"


def test_auth_dashboards_edit_and_read_grants(auth_server):
    # `[auth.grants.<user>] dashboards`: "edit" may replace and delete anybody's dashboard
    # (the owner stays), "read" may neither create nor change; both apply to tokens by `sub`.
    url = auth_server.http_url + "/api/dashboards/"
    grace, erin, rita = basic("grace", PASSWORD), bearer(token(sub="erin")), bearer(token(sub="rita"))
    graces, bystander, editable = uniq("grace-"), uniq("bystander-"), uniq("edit-")
    assert http("PUT", url + bystander, {"title": "Alice's", "widgets": []}, headers=bearer(token())).status == 201
    assert http("PUT", url + graces, {"title": "Grace's", "widgets": []}, headers=grace).status == 201
    assert http("PUT", url + editable, {"title": "Grace's too", "widgets": []}, headers=grace).status == 201

    # A "read" user: 403 on create, replace and delete, saying why; nothing changes.
    created = uniq("by-rita-")
    for method, target, body in [("PUT", created, {"title": "Rita's", "widgets": []}),
                                 ("PUT", graces, {"title": "Rita was here", "widgets": []}),
                                 ("DELETE", graces, None)]:
        r = http(method, url + target, body, headers=rita)
        assert r.status == 403, (method, target, r.status, r.body)
        assert "may only read dashboards" in r.json()["error"]["message"], r.body
    assert http("GET", url + created, headers=rita).status == 404, "the read-only user created nothing"
    got = json.loads(http("GET", url + graces, headers=rita).body)
    assert got["title"] == "Grace's" and got["owner"] == "grace", "a read-only user may still read"

    # An "edit" user replaces and deletes another's dashboard; the replaced one keeps its owner.
    assert http("PUT", url + graces, {"title": "Edited by Erin", "widgets": []}, headers=erin).status == 200
    got = json.loads(http("GET", url + graces, headers=grace).body)
    assert got["title"] == "Edited by Erin" and got["owner"] == "grace", got
    assert http("DELETE", url + editable, headers=erin).status == 204
    assert http("GET", url + editable, headers=grace).status == 404
    # ... which the owner can still change (it stays grace's), unlike a user without the grant.
    assert http("PUT", url + graces, {"title": "Grace's again", "widgets": []}, headers=grace).status == 200
    r = http("PUT", url + graces, {"title": "taken", "widgets": []}, headers=bearer(token(sub="mallory")))
    assert r.status == 403 and 'belongs to \\"grace\\"' in r.body.decode(), r.body

    # The bystander's dashboard is intact throughout.
    got = json.loads(http("GET", url + bystander, headers=bearer(token())).body)
    assert got["title"] == "Alice's" and got["owner"] == "alice", got
    assert http("DELETE", url + graces, headers=grace).status == 204


# ------------------------------------------------------------------------------ secrets stay secret


def test_auth_secrets_never_reach_the_log_or_metrics(auth_server):
    """Runs last in this module: exercises every credential path once more, then greps the
    trace-level log of the whole module's server and its /metrics for every secret used."""
    with AuthWS(auth_server.ws_url, headers=bearer(token())) as ws:
        ws.ping(1)
    with AuthWS(auth_server.ws_url, headers=bearer(token(key="some-other-secret-of-sufficient-length"))) as ws:
        ws.wait_closed()
    with AuthWS(auth_server.ws_url, headers=basic("grace", PASSWORD)) as ws:
        ws.ping(1)
    with AuthWS(auth_server.ws_url, headers=basic("grace", PASSWORD + "x")) as ws:
        ws.wait_closed()
    SEEN_SECRETS.add(PASSWORD + "x")
    http("POST", auth_server.http_url + "/api/publish", {"channel": "x", "data": 1}, headers=bearer(API_KEY + "x"))
    SEEN_SECRETS.add(API_KEY + "x")
    metrics = http("GET", auth_server.http_url + "/metrics").text
    time.sleep(0.3)
    log = pathlib.Path(auth_server.stderr_path).read_text(errors="replace")
    assert "credentials refused" in log, "the refusals above were logged (at debug level)"
    leaked = []
    for s in SEEN_SECRETS:
        for piece in {s, *s.split(".")}:  # a token's signature or payload alone is a leak too
            if len(piece) >= 12 and (piece in log or piece in metrics):
                leaked.append(piece[:16] + "…")
    assert not leaked, f"secrets in the log or metrics: {leaked}"
