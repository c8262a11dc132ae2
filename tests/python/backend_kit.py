"""Stand-ins for an application's own services, started by the tests: an identity provider
serving a JWK set that rotates, and a hook backend answering the gateway's connect / subscribe /
publish hooks as told (allow, refuse, replace, garbage, slow, nothing). Plain `http.server` in
a thread of the test process, on 127.0.0.1 and a free port."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Base:
    """A server in a thread, stopped by `close()`."""

    def __init__(self, handler_cls):
        self.httpd = _Server(("127.0.0.1", 0), handler_cls)
        self.httpd.owner = self
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class SigningKey:
    """An RSA (RS256) or P-256 (ES256) key pair with a key id."""

    def __init__(self, kid: str, alg: str = "RS256"):
        self.kid, self.alg = kid, alg
        if alg == "RS256":
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            self.jwk = json.loads(RSAAlgorithm.to_jwk(self.private.public_key()))
        else:
            self.private = ec.generate_private_key(ec.SECP256R1())
            self.jwk = json.loads(ECAlgorithm.to_jwk(self.private.public_key()))
        self.jwk.update({"kid": kid, "use": "sig", "alg": alg})

    def token(self, sub: str = "alice", ttl: int = 600, **claims) -> str:
        body = {"sub": sub, "exp": int(time.time()) + ttl, **claims}
        return jwt.encode(body, self.private, algorithm=self.alg, headers={"kid": self.kid})


class _IdpHandler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        idp = self.server.owner
        idp.fetches += 1
        if idp.failing:
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"keys": idp.keys}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Idp(_Base):
    """Serves `{"keys": [...]}` at any path; `keys` and `failing` may be changed at any time."""

    def __init__(self, keys: list):
        self.keys = list(keys)
        self.failing = False
        self.fetches = 0
        super().__init__(_IdpHandler)

    @property
    def jwks_url(self) -> str:
        return self.url("/certs")


class _HookHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the gateway's pool expects

    def log_message(self, *a):
        pass

    def do_POST(self):
        backend = self.server.owner
        n = int(self.headers.get("Content-Length", "0"))
        req = json.loads(self.rfile.read(n) or b"null")
        hook = self.path.strip("/")
        with backend.lock:
            backend.calls.append((hook, req))
            backend.connections.add(self.client_address)
            backend.in_flight += 1
            backend.max_in_flight = max(backend.max_in_flight, backend.in_flight)
        try:
            body, status = self._verdict(backend, hook, req)
        finally:
            # Counted out before the answer is written: the gateway cannot have read it (and
            # sent its next call) while this call is still counted.
            with backend.lock:
                backend.in_flight -= 1
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the gateway gave up on a slow answer and closed the connection

    def _verdict(self, backend, hook, req) -> tuple[bytes, int]:
        answer = backend.answers.get(hook, {"result": {}})
        if callable(answer):
            answer = answer(req)
        status = 200
        if answer == "slow":
            time.sleep(backend.slow_s)
            answer = {"result": {}}
        if answer == "garbage":
            body = b"<html>not json</html>"
        elif answer == "5xx":
            status, body = 503, b'{"error": "down"}'
        elif answer == "no-verdict":
            body = b'{"ok": true}'
        else:
            body = json.dumps(answer).encode()
        return body, status


class HookBackend(_Base):
    """Answers POST /connect, /subscribe and /publish with `answers[hook]`: a JSON object, a
    function of the request returning one, or "slow" / "garbage" / "5xx" / "no-verdict".
    Records every call, the client connections it came over, and the most calls it was
    answering at once (`max_in_flight`)."""

    def __init__(self):
        self.answers: dict = {}
        self.calls: list = []
        self.connections: set = set()
        self.lock = threading.Lock()
        self.slow_s = 3.0
        self.in_flight = 0
        self.max_in_flight = 0
        super().__init__(_HookHandler)

    def calls_of(self, hook: str) -> list:
        with self.lock:
            return [r for h, r in self.calls if h == hook]
