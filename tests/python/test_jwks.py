"""Keys from an identity provider (`auth.jwks_url`, SPEC §6a) against the real binary and a
Python IdP stand-in (backend_kit.Idp) that rotates its keys: fetched at start (exit 2 when it
cannot be), again on an unknown `kid`, a failed refresh keeping the last good set, sets with
unsupported keys."""

from __future__ import annotations

import subprocess

import pytest

import sb
from backend_kit import Idp, SigningKey
from sb import http
from test_auth import AuthWS, assert_closed_4001, bearer


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
