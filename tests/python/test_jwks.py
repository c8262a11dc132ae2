"""Keys from an identity provider (`auth.jwks_url`, SPEC §6a) against the real binary and a
Python IdP stand-in (backend_kit.Idp) that rotates its keys: fetched at start (exit 2 when it
cannot be), again on an unknown `kid`, a failed refresh keeping the last good set, sets with
unsupported, broken and weak keys (skipped, never fatal beside a usable key), and the bound on
the keys a token without `kid` is checked against."""

from __future__ import annotations

import base64
import json
import random
import re
import subprocess
import time
import warnings

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

import sb
from backend_kit import Idp, SigningKey
from sb import http
from test_auth import AuthWS, assert_closed_4001, bearer

MAX_KEYS_PER_TOKEN = 8  # the node's bound on the keys a token without kid is checked against


@pytest.fixture
def idp():
    a = SigningKey("key-a")
    server = Idp([a.jwk])
    server.signing = a
    yield server
    server.close()


def config(tmp_path, url: str) -> str:
    path = tmp_path / "jwks.toml"
    path.write_text(f'[auth]\njwks_url = "{url}"\njwks_refresh_s = 300\n')
    return str(path)


def connects(node, token: str) -> bool:
    ws = AuthWS(node.ws_url, headers=bearer(token))
    try:
        reply = ws.request("ping", {}, timeout=10)
        return "ok" in reply
    except sb.Closed:
        return False
    finally:
        ws.close()


def test_jwks_keys_rotate_without_a_restart(start_server, idp, tmp_path):
    node = start_server("--config", config(tmp_path, idp.jwks_url))
    assert connects(node, idp.signing.token("alice"))
    b = SigningKey("key-b", alg="ES256")
    idp.keys = [b.jwk]  # the IdP rotates: a's key is gone, b's is new
    # b's unknown kid makes the node fetch the set again before it answers.
    assert connects(node, b.token("bob"))
    ws = AuthWS(node.ws_url, headers=bearer(idp.signing.token("alice")))
    assert_closed_4001(ws)
    text = http("GET", node.http_url + "/metrics").body.decode()
    assert 'switchboard_jwks_refreshes_total{outcome="ok"} 2' in text, text[-600:]


def test_jwks_failed_refresh_keeps_the_last_good_set(start_server, idp, tmp_path):
    node = start_server("--config", config(tmp_path, idp.jwks_url))
    idp.failing = True
    stranger = SigningKey("key-unknown")
    ws = AuthWS(node.ws_url, headers=bearer(stranger.token()))
    assert_closed_4001(ws)  # the unknown kid's refresh failed ...
    assert connects(node, idp.signing.token("alice"))  # ... and the good set stays
    text = http("GET", node.http_url + "/metrics").body.decode()
    assert 'switchboard_jwks_refreshes_total{outcome="failed"} 1' in text, text[-600:]
    # Made-up kids do not make the node fetch again within 10 s.
    before = idp.fetches
    for i in range(5):
        assert_closed_4001(AuthWS(node.ws_url, headers=bearer(SigningKey(f"k{i}").token())))
    assert idp.fetches == before


def test_jwks_unsupported_keys_are_skipped(start_server, idp, tmp_path):
    okp = {"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "kid": "ed"}
    enc = dict(SigningKey("enc").jwk, use="enc")
    idp.keys = [okp, enc, idp.signing.jwk]
    node = start_server("--config", config(tmp_path, idp.jwks_url))
    assert connects(node, idp.signing.token())


def start_failing(switchboard_bin, tmp_path, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([switchboard_bin, "serve", "--listen", "127.0.0.1:0", "--config", config(tmp_path, url)],
                          capture_output=True, text=True, timeout=60, env=sb.server_env())


def test_jwks_unreachable_or_unusable_at_start_exits_2(switchboard_bin, idp, tmp_path):
    idp.keys = [{"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]
    r = start_failing(switchboard_bin, tmp_path, idp.jwks_url)
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
    assert "auth.jwks_url" in r.stderr and "no RS256" in r.stderr, r.stderr[-500:]
    idp.close()
    r = start_failing(switchboard_bin, tmp_path, idp.jwks_url)
    assert r.returncode == 2 and "auth.jwks_url" in r.stderr, (r.returncode, r.stderr[-500:])
    r = start_failing(switchboard_bin, tmp_path, "ftp://idp/certs")
    assert r.returncode == 2 and "auth.jwks_url" in r.stderr, (r.returncode, r.stderr[-500:])


def _probable_prime(bits: int, rng: random.Random) -> int:
    """A random prime of exactly `bits` bits (Miller-Rabin, 24 rounds), coprime with e - 1."""
    def is_prime(n: int) -> bool:
        if n % 2 == 0:
            return n == 2
        d, s = n - 1, 0
        while d % 2 == 0:
            d, s = d // 2, s + 1
        for _ in range(24):
            x = pow(rng.randrange(2, n - 1), d, n)
            if x in (1, n - 1):
                continue
            for _ in range(s - 1):
                x = x * x % n
                if x == n - 1:
                    break
            else:
                return False
        return True

    while True:
        c = rng.getrandbits(bits) | (3 << (bits - 2)) | 1
        if (c - 1) % 65537 and is_prime(c):
            return c


def rsa_private_key(bits: int):
    """An RSA private key of `bits` bits; under 1024 (which `cryptography` no longer generates)
    made from two primes found here."""
    if bits >= 1024:
        return rsa.generate_private_key(public_exponent=65537, key_size=bits)
    rng = random.Random()
    while True:
        p, q = _probable_prime(bits // 2, rng), _probable_prime(bits // 2, rng)
        if p != q and (p * q).bit_length() == bits:
            break
    e = 65537
    d = pow(e, -1, (p - 1) * (q - 1))
    nums = rsa.RSAPrivateNumbers(p, q, d, d % (p - 1), d % (q - 1), pow(q, -1, p), rsa.RSAPublicNumbers(e, p * q))
    return nums.private_key()


class RawKey:
    """A key of any strength for the set: RS256 (`bits`) or HS256 (`secret`), with or
    without a kid in its tokens."""

    def __init__(self, kid: str, bits: int | None = None, secret: bytes | None = None):
        self.kid = kid
        if secret is not None:
            self.alg, self.signer = "HS256", secret
            self.jwk = {"kty": "oct", "k": base64.urlsafe_b64encode(secret).rstrip(b"=").decode()}
        else:
            self.alg, self.signer = "RS256", rsa_private_key(bits)
            self.jwk = json.loads(RSAAlgorithm.to_jwk(self.signer.public_key()))
        self.jwk.update({"kid": kid, "use": "sig", "alg": self.alg})

    def token(self, sub: str = "alice", with_kid: bool = True) -> str:
        body = {"sub": sub, "exp": int(time.time()) + 600}
        headers = {"kid": self.kid} if with_kid else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PyJWT warns about signing with a weak key
            return jwt.encode(body, self.signer, algorithm=self.alg, headers=headers)


# A key of a type the node does not know (a post-quantum ML-DSA key) and RSA keys that are broken.
AKP = {"kty": "AKP", "alg": "ML-DSA-44", "pub": base64.urlsafe_b64encode(b"\x01" * 32).decode(), "kid": "pq"}


def broken_rsa(kid: str) -> list[dict]:
    good = SigningKey("x").jwk
    return [dict(good, n="!!not base64url!!", kid=kid + "-n"),
            {k: v for k, v in good.items() if k != "e"} | {"kid": kid + "-no-e"}]


def jwks_keys(node) -> dict:
    text = http("GET", node.http_url + "/metrics").body.decode()
    return {m[0]: int(m[1]) for m in re.findall(r'^switchboard_jwks_keys\{state="(\w+)"\} (\d+)$', text, re.M)}


def test_jwks_unknown_and_broken_keys_beside_a_good_one_are_skipped(start_server, idp, tmp_path):
    idp.keys = [AKP, *broken_rsa("broken"), idp.signing.jwk]
    node = start_server("--config", config(tmp_path, idp.jwks_url))
    assert connects(node, idp.signing.token("alice"))
    assert jwks_keys(node) == {"usable": 1, "skipped": 3}
    # Each skipped key is warned about once for this load, named by its kid (quoted).
    log = node.stderr_tail(100_000)
    for kid in ("pq", "broken-n", "broken-no-e"):
        lines = [ln for ln in log.splitlines() if "JWK set key skipped" in ln and f'kid=Some("{kid}")' in ln]
        assert len(lines) == 1 and "WARN" in lines[0], (kid, log[-2000:])


def test_jwks_weak_keys_sign_no_accepted_token(start_server, idp, tmp_path):
    weak = [RawKey("rsa512", bits=512), RawKey("rsa1024", bits=1024),
            RawKey("oct1", secret=b"k"), RawKey("oct31", secret=b"s" * 31)]
    good = [RawKey("rsa2048", bits=2048), RawKey("oct32", secret=b"t" * 32)]
    idp.keys = [k.jwk for k in weak + good]
    node = start_server("--config", config(tmp_path, idp.jwks_url))
    assert jwks_keys(node) == {"usable": 2, "skipped": 4}
    for k in good:
        assert connects(node, k.token("good")), k.kid
        assert connects(node, k.token("good", with_kid=False)), k.kid
    for k in weak:
        for with_kid in (True, False):
            ws = AuthWS(node.ws_url, headers=bearer(k.token("mallory", with_kid=with_kid)))
            assert_closed_4001(ws)
    # The HTTP API refuses them as well (401, SPEC §2).
    r = http("POST", node.http_url + "/api/publish", {"channel": "room:1", "data": 1},
             headers=bearer(weak[0].token()))
    assert r.status == 401, (r.status, r.body)


def test_jwks_a_refresh_that_adds_an_unusable_key_keeps_rotation_working(start_server, idp, tmp_path):
    node = start_server("--config", config(tmp_path, idp.jwks_url))
    assert connects(node, idp.signing.token("alice"))
    b = SigningKey("key-b", alg="ES256")
    idp.keys = [AKP, RawKey("rsa1024", bits=1024).jwk, *broken_rsa("broken"), b.jwk]  # a rotated out, b in
    assert connects(node, b.token("bob"))  # b's unknown kid makes the node fetch the new set
    assert_closed_4001(AuthWS(node.ws_url, headers=bearer(idp.signing.token("alice"))))
    text = http("GET", node.http_url + "/metrics").body.decode()
    assert 'switchboard_jwks_refreshes_total{outcome="ok"} 2' in text, text[-800:]
    assert 'switchboard_jwks_refreshes_total{outcome="failed"} 0' in text, text[-800:]
    assert jwks_keys(node) == {"usable": 1, "skipped": 4}


def test_jwks_a_set_of_only_unusable_keys_is_refused_at_start(switchboard_bin, idp, tmp_path):
    idp.keys = [AKP, RawKey("rsa1024", bits=1024).jwk, RawKey("oct31", secret=b"s" * 31).jwk, *broken_rsa("b")]
    r = start_failing(switchboard_bin, tmp_path, idp.jwks_url)
    assert r.returncode == 2, (r.returncode, r.stderr[-800:])
    assert "auth.jwks_url" in r.stderr and "no RS256, ES256 (P-256) or HS256 signing key" in r.stderr, r.stderr[-800:]
    assert 'key 1 ("rsa1024"): RSA modulus of 1024 bits, under 2048' in r.stderr, r.stderr[-800:]
    assert 'key 2 ("oct31"): oct key must be at least 32 bytes' in r.stderr, r.stderr[-800:]


def test_jwks_tokens_without_kid_are_checked_against_the_first_keys_only(start_server, idp, tmp_path):
    keys = [RawKey(f"k{i}", secret=bytes([65 + i]) * 32) for i in range(MAX_KEYS_PER_TOKEN + 2)]
    idp.keys = [k.jwk for k in keys]
    node = start_server("--config", config(tmp_path, idp.jwks_url))
    assert connects(node, keys[0].token(with_kid=False))
    assert connects(node, keys[MAX_KEYS_PER_TOKEN - 1].token(with_kid=False))  # the last within the bound
    for k in keys[MAX_KEYS_PER_TOKEN:]:  # past the bound: refused, though the key is in the set
        reason = assert_closed_4001(AuthWS(node.ws_url, headers=bearer(k.token(with_kid=False))))
        assert "no key id" in reason, reason
        assert connects(node, k.token(with_kid=True)), k.kid  # named by its kid, it is found
