"""`switchboard token` (docs/security.md, "Making tokens"): the tokens it signs are accepted by a
real node and carry the claims asked for; bad flags exit 2 with a message naming them. Checked
with PyJWT (an independent JWT implementation) and the third-party `websockets` client."""

from __future__ import annotations

import subprocess
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from sb import WS, Closed, server_env, uniq

SECRET = "a-token-test-secret-of-32-bytes-or-more!"


def _token(switchboard_bin, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([switchboard_bin, "token", *args], capture_output=True, text=True, timeout=30,
                          env=server_env() if env is None else env)


def test_token_signed_with_the_secret_is_accepted_and_limited_to_its_channels(start_server, switchboard_bin,
                                                                           tmp_path):
    srv = start_server("--jwt-secret", SECRET)
    r = _token(switchboard_bin, "--sub", "alice", "--ttl", "10m", "--channels", "room:*",
               "--publish", "room:ops", "--jwt-secret", SECRET)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert claims["sub"] == "alice" and claims["channels"] == ["room:*"] and claims["publish"] == ["room:ops"]
    assert 590 <= claims["exp"] - claims["iat"] <= 600
    with WS(srv.ws_url + "?token=" + token) as ws:
        ok = ws.subscribe([f"room:{uniq()}", f"chat:{uniq()}"])["channels"]
        codes = sorted(v.get("error", {}).get("code", 200) for v in ok.values())
        assert codes == [200, 403], ok
        assert "offset" in ws.ok("publish", {"channel": "room:ops", "data": {"t": 1}})
        refused = ws.request("publish", {"channel": "room:other", "data": 1})
        assert refused["error"]["code"] == 403, refused

    # The secret from the node's configuration file.
    config = tmp_path / "node.toml"
    config.write_text(f'[auth]\njwt_secret = "{SECRET}"\n')
    r = _token(switchboard_bin, "--sub", "bob", "--config", str(config))
    assert r.returncode == 0, r.stderr
    assert jwt.decode(r.stdout.strip(), SECRET, algorithms=["HS256"])["sub"] == "bob"


@pytest.mark.parametrize("kind", ["rsa", "ec"])
def test_token_signed_with_a_private_key_is_accepted_by_its_public_key(start_server, switchboard_bin, tmp_path,
                                                                       kind):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048) if kind == "rsa" \
        else ec.generate_private_key(ec.SECP256R1())
    private = tmp_path / "key.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public = tmp_path / "pub.pem"
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    srv = start_server("--jwt-public-key", str(public))
    r = _token(switchboard_bin, "--sub", "carol", "--private-key", str(private), "--kid", "k1")
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    header = jwt.get_unverified_header(token)
    assert header == {"alg": "RS256" if kind == "rsa" else "ES256", "typ": "JWT", "kid": "k1"}, header
    assert jwt.decode(token, key.public_key(), algorithms=[header["alg"]])["sub"] == "carol"
    with WS(srv.ws_url + "?token=" + token) as ws:
        assert "offset" in ws.subscribe([f"room:{uniq()}"])["channels"].popitem()[1]


def test_token_expires_and_bad_flags_exit_2_naming_them(start_server, switchboard_bin, tmp_path):
    srv = start_server("--jwt-secret", SECRET)
    r = _token(switchboard_bin, "--sub", "dave", "--ttl", "1", "--jwt-secret", SECRET)
    assert r.returncode == 0, r.stderr
    time.sleep(2.1)  # the token's own lifetime, not a timing assertion
    try:
        with WS(srv.ws_url + "?token=" + r.stdout.strip()) as ws:
            ws.subscribe(["room:x"])
        pytest.fail("an expired token was accepted")
    except (Closed, Exception) as e:  # refused at the handshake (401) or closed 4001
        assert "401" in str(e) or "4001" in str(e), e
    for args, names in [
        (["--sub", "x", "--ttl", "1w", "--jwt-secret", SECRET], "--ttl"),
        (["--sub", "x", "--ttl", "0", "--jwt-secret", SECRET], "--ttl"),
        (["--sub", "x", "--channels", "room x", "--jwt-secret", SECRET], "--channels"),
        (["--sub", "x"], "--jwt-secret"),
        (["--sub", "x", "--private-key", str(tmp_path / "missing.pem")], "--private-key"),
    ]:
        r = _token(switchboard_bin, *args, env={"PATH": "/usr/bin:/bin"})
        assert r.returncode == 2, (args, r)
        assert names in r.stderr, (args, r.stderr)
        assert SECRET not in r.stderr


def test_token_refuses_a_secret_the_node_refuses_exit_2(switchboard_bin):
    """A secret too short for HS256 signs nothing: `serve` would refuse it, so a token made with
    it could never be verified. Both say the same rule."""
    short = "short"
    env = {"PATH": "/usr/bin:/bin", "SWITCHBOARD_JWT_SECRET": short}
    for args, given in [(["--sub", "bob"], env), (["--sub", "bob", "--jwt-secret", short], None)]:
        r = _token(switchboard_bin, *args, env=given)
        assert r.returncode == 2, (args, r)
        assert r.stdout == "", "no token printed"
        assert "at least 32 bytes for HS256" in r.stderr and "SWITCHBOARD_JWT_SECRET" in r.stderr, r.stderr
    serve = subprocess.run([switchboard_bin, "serve", "--listen", "127.0.0.1:0"], capture_output=True, text=True,
                           timeout=30, env=env)
    assert serve.returncode == 2 and "at least 32 bytes for HS256" in serve.stderr, serve.stderr
    # 32 bytes is enough for both.
    r = _token(switchboard_bin, "--sub", "bob", env={**env, "SWITCHBOARD_JWT_SECRET": "x" * 32})
    assert r.returncode == 0 and r.stdout.count(".") == 2, r
