"""`switchboard publish` and `switchboard sub` as a newcomer uses them (SPEC §5, docs/cli.md):
one `--url` form for both commands, TLS nodes with a test CA, Basic users and tokens, the
server's reason for a refusal, and errors that say what to do. Every run is the real binary
against a real node."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import termios
import time

import jwt
import pytest

import sb
from mqtt_kit import mosquitto  # noqa: F401 (the fixture)
from sb import uniq
from test_fault_mqtt import mqtt_source, wait_connected, write_config

SECRET = "cli-client-test-secret-of-32-bytes-or-more"
PASSWORD = "cli-basic-pw-4f7a2b"


def run(binary, *args, env=None, stdin_text=None, timeout=30) -> subprocess.CompletedProcess:
    full = sb.server_env()
    full.update(env or {})
    return subprocess.run([binary, *[str(a) for a in args]], capture_output=True, text=True, timeout=timeout,
                          env=full, input=stdin_text, stdin=None if stdin_text is not None else subprocess.DEVNULL)


def first_line_of_sub(binary, *args, env=None, timeout=15) -> tuple[str, str]:
    """Runs `switchboard sub ARGS --initial`, returns (its first stdout line, its stderr) and
    stops it."""
    full = sb.server_env()
    full.update(env or {})
    proc = subprocess.Popen([binary, "sub", "--initial", *[str(a) for a in args]], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=full)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline() if ready else ""
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=10)
    return line, err


def publish_ok(binary, url, ch, data, *extra, env=None) -> dict:
    r = run(binary, "publish", ch, json.dumps(data), "--url", url, *extra, env=env)
    assert r.returncode == 0, (url, r.stderr)
    return json.loads(r.stdout)


@pytest.mark.parametrize("form", ["http://127.0.0.1:{p}", "http://127.0.0.1:{p}/", "ws://127.0.0.1:{p}",
                                  "ws://127.0.0.1:{p}/ws", "ws://localhost:{p}/ws/", "http://localhost:{p}/ws"])
def test_cli_one_url_form_for_publish_and_sub(server, switchboard_bin, form):
    url = form.format(p=server.port)
    ch = uniq("room:url")
    reply = publish_ok(switchboard_bin, url, ch, {"n": 1})
    assert reply["offset"] == 1 and reply["epoch"], reply
    line, err = first_line_of_sub(switchboard_bin, ch, "--url", url)
    assert json.loads(line) == {"ch": ch, "epoch": reply["epoch"], "off": 1, "data": {"n": 1}}, err


def test_cli_publish_to_a_device_exits_0_and_prints_its_answer(start_server, switchboard_bin, tmp_path, mosquitto):
    """A write-back namespace answers {"written", "source"}: the device took the value, and
    the tool says so (exit 0) instead of inviting a retry that would write twice."""
    cfg = write_config(tmp_path, '[namespaces.pt]\nclient_publish = true\nwrite_source = "plant"\n',
                       mqtt_source(mosquitto, "plant", ["plant/#"], uniq("sb-"), 'write_topics = ["plant/+/sp"]'))
    srv = start_server("--config", cfg)
    wait_connected(srv)
    u = uniq("u")
    for url in (srv.http_url, srv.ws_url):
        r = run(switchboard_bin, "publish", f"pt:plant.{u}.sp", '{"v": 5}', "--url", url)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"written": True, "source": "plant"}, r.stdout


def test_cli_tls_node_with_a_test_ca(switchboard_bin, tmp_path):
    ca, cert, key = sb.make_test_ca(tmp_path)
    port = sb.free_port()
    srv = sb.start_on_port(switchboard_bin, port, ["--tls-cert", str(cert), "--tls-key", str(key)],
                           str(tmp_path / "tls-node.log"))
    try:
        ch = uniq("room:tls")
        assert publish_ok(switchboard_bin, f"https://127.0.0.1:{port}", ch, "over tls", "--ca", ca)["offset"] == 1
        second = publish_ok(switchboard_bin, f"wss://localhost:{port}/ws", ch, 2, "--ca", ca)
        assert second["offset"] == 2
        line, err = first_line_of_sub(switchboard_bin, ch, "--url", f"https://127.0.0.1:{port}", "--ca", ca)
        assert json.loads(line or "null") == {"ch": ch, "epoch": second["epoch"], "off": 2, "data": 2}, err

        # The system's roots do not know the test CA: refused, saying how to trust it.
        r = run(switchboard_bin, "publish", ch, "3", "--url", f"https://127.0.0.1:{port}")
        assert r.returncode == 1, r.stderr
        assert "not trusted" in r.stderr and "--ca FILE" in r.stderr, r.stderr
        line, err = first_line_of_sub(switchboard_bin, ch, "--url", f"wss://127.0.0.1:{port}/ws")
        assert line == "" and "not trusted" in err and "--ca FILE" in err, err

        # A CA file that is not one, and --ca on a plain URL, are usage errors.
        r = run(switchboard_bin, "publish", ch, "3", "--url", f"https://127.0.0.1:{port}", "--ca", tmp_path / "nope")
        assert r.returncode == 2 and "--ca" in r.stderr and "nope" in r.stderr, r.stderr
        r = run(switchboard_bin, "publish", ch, "3", "--url", f"http://127.0.0.1:{port}", "--ca", ca)
        assert r.returncode == 2 and "--ca is for TLS nodes" in r.stderr, r.stderr
        # The node still serves TLS after its subscribers went away (killed, or refused the
        # certificate).
        assert publish_ok(switchboard_bin, f"https://127.0.0.1:{port}", ch, 3, "--ca", ca)["offset"] == 3
        line, err = first_line_of_sub(switchboard_bin, ch, "--url", f"wss://127.0.0.1:{port}", "--ca", ca)
        assert json.loads(line or "null") == {"ch": ch, "epoch": second["epoch"], "off": 3, "data": 3}, err

    finally:
        srv.kill()


@pytest.fixture
def basic_node(start_server, switchboard_bin, tmp_path):
    users = tmp_path / "users"
    sb.add_user(switchboard_bin, users, "alice", PASSWORD)
    return start_server("--users", str(users))


def test_cli_basic_user_from_flags_environment_stdin_and_url(basic_node, switchboard_bin):
    srv = basic_node
    ch = uniq("room:basic")
    pw = {"SWITCHBOARD_PASSWORD": PASSWORD}
    assert publish_ok(switchboard_bin, srv.http_url, ch, 1, "--user", "alice", env=pw)["offset"] == 1
    # The user from the environment too.
    assert publish_ok(switchboard_bin, srv.ws_url, ch, 2, env={**pw, "SWITCHBOARD_USER": "alice"})["offset"] == 2
    # The password on stdin when it is not a terminal.
    r = run(switchboard_bin, "publish", ch, "3", "--url", srv.http_url, "--user", "alice", stdin_text=PASSWORD + "\n")
    assert r.returncode == 0 and json.loads(r.stdout)["offset"] == 3, r.stderr
    # In the URL.
    url = f"http://alice:{PASSWORD}@127.0.0.1:{srv.port}"
    assert publish_ok(switchboard_bin, url, ch, 4)["offset"] == 4
    line, err = first_line_of_sub(switchboard_bin, ch, "--url", url)
    assert json.loads(line)["off"] == 4, err
    line, err = first_line_of_sub(switchboard_bin, ch, "--url", srv.http_url, "--user", "alice", env=pw)
    assert json.loads(line)["off"] == 4, err


def test_cli_basic_password_is_prompted_for_on_a_terminal(basic_node, switchboard_bin):
    ch = uniq("room:prompt")
    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal is its controlling terminal
        os.execve(switchboard_bin, [switchboard_bin, "publish", ch, "5", "--url", basic_node.http_url, "--user",
                                    "alice"], sb.server_env())
    out = b""
    deadline = time.monotonic() + 30
    sent = False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        # Typed once the prompt has turned echo off (what a person sees before typing).
        if not sent and b"password for alice" in out and not termios.tcgetattr(fd)[3] & termios.ECHO:
            os.write(fd, PASSWORD.encode() + b"\n")
            sent = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    text = out.decode(errors="replace")
    assert sent, text
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert PASSWORD not in text, "the prompt does not echo"
    assert '"offset":1' in text, text


def test_cli_credentials_refused_say_why_and_never_show_the_password(basic_node, switchboard_bin):
    srv = basic_node
    ch = uniq("room:refused")
    wrong = "wrong-pw-9c1d"
    for url in [f"http://alice:{wrong}@127.0.0.1:{srv.port}", f"ws://alice:{wrong}@127.0.0.1:{srv.port}/ws"]:
        r = run(switchboard_bin, "publish", ch, "1", "--url", url)
        assert r.returncode == 1 and "401" in r.stderr, r.stderr
        assert wrong not in r.stderr + r.stdout
        line, err = first_line_of_sub(switchboard_bin, ch, "--url", url)
        assert line == "" and "4001" in err and wrong not in err, err
        assert "--token" in err and "--user" in err, err
    # A URL that does not parse is echoed without its password too.
    r = run(switchboard_bin, "publish", ch, "1", "--url", f"http://alice:{wrong}@127.0.0.1:notaport")
    assert r.returncode == 2 and "alice:***@" in r.stderr and wrong not in r.stderr, r.stderr
    # No credentials at all: the hint names both ways.
    r = run(switchboard_bin, "publish", ch, "1", "--url", srv.http_url)
    assert r.returncode == 1 and "401" in r.stderr and "--user NAME" in r.stderr, r.stderr
    # A user but no password anywhere (stdin is empty, no terminal).
    r = run(switchboard_bin, "publish", ch, "1", "--url", srv.http_url, "--user", "alice")
    assert r.returncode == 2 and "SWITCHBOARD_PASSWORD" in r.stderr, r.stderr
    # A token and a user together.
    r = run(switchboard_bin, "publish", ch, "1", "--url", srv.http_url, "--user", "alice", "--token", "t",
            env={"SWITCHBOARD_PASSWORD": PASSWORD})
    assert r.returncode == 2 and "not both" in r.stderr, r.stderr


def test_cli_refused_token_prints_the_servers_reason(start_server, switchboard_bin):
    srv = start_server("--jwt-secret", SECRET)
    ch = uniq("room:tok")
    good = jwt.encode({"sub": "alice", "exp": int(time.time()) + 600}, SECRET, algorithm="HS256")
    expired = jwt.encode({"sub": "alice", "exp": int(time.time()) - 600}, SECRET, algorithm="HS256")
    assert publish_ok(switchboard_bin, srv.http_url, ch, 1, "--token", good)["offset"] == 1
    line, err = first_line_of_sub(switchboard_bin, ch, "--url", srv.ws_url, env={"SWITCHBOARD_TOKEN": good})
    assert json.loads(line)["off"] == 1, err

    line, err = first_line_of_sub(switchboard_bin, ch, "--url", srv.ws_url, "--token", expired)
    assert line == "", line
    assert "token expired" in err and "4001" in err, err
    assert "--token" in err, err
    r = run(switchboard_bin, "publish", ch, "2", "--url", srv.http_url, "--token", expired)
    assert r.returncode == 1 and "401" in r.stderr and "expired" in r.stderr, r.stderr
    assert expired not in r.stderr + err


def test_cli_errors_say_what_to_do(server, switchboard_bin):
    ch = uniq("room:err")
    port = sb.free_port()
    r = run(switchboard_bin, "publish", ch, "1", "--url", f"http://127.0.0.1:{port}")
    assert r.returncode == 1
    assert f"cannot connect to 127.0.0.1:{port}" in r.stderr and "switchboard serve" in r.stderr, r.stderr
    assert r.stderr.lower().count("refused") == 1, r.stderr
    line, err = first_line_of_sub(switchboard_bin, ch, "--url", f"ws://127.0.0.1:{port}")
    assert line == "" and err.lower().count("refused") == 1 and "switchboard serve" in err, err

    # A bare word is not JSON: the message shows it quoted.
    r = run(switchboard_bin, "publish", "pt:x", "hello", "--url", server.http_url)
    assert r.returncode == 2 and """'"hello"'""" in r.stderr, r.stderr
    assert publish_ok(switchboard_bin, server.http_url, ch, "hello")["offset"] == 1

    for url, says in [(f"127.0.0.1:{server.port}", f"http://127.0.0.1:{server.port}"),
                      ("ftp://127.0.0.1", "http, https, ws, wss")]:
        for cmd in (["publish", ch, "1"], ["sub", ch]):
            r = run(switchboard_bin, *cmd, "--url", url)
            assert r.returncode == 2 and says in r.stderr, (cmd, url, r.stderr)

    # A URL that reaches something other than the WebSocket endpoint says where that is, once.
    line, err = first_line_of_sub(switchboard_bin, ch, "--url", f"http://127.0.0.1:{server.port}/api/info")
    assert line == "" and "handshake" in err, err
    assert f"ws://127.0.0.1:{server.port}/api/info/ws" in err, err
    assert err.count("HTTP 4") + err.count("HTTP 2") == 1, err


def test_cli_self_signed_ca_certificate_as_the_nodes_own_says_what_is_wrong(switchboard_bin, tmp_path):
    """The usual one-line `openssl req -x509` certificate is a CA certificate: given with --ca,
    rustls still refuses it as the server's own (CaUsedAsEndEntity). The hint says that, not
    to pass the CA that was passed."""
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out",
                        "cert.pem", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    port = sb.free_port()
    srv = sb.start_on_port(switchboard_bin, port, ["--tls-cert", cert, "--tls-key", key],
                           str(tmp_path / "node.log"))
    try:
        url = f"https://127.0.0.1:{port}"
        r = run(switchboard_bin, "publish", uniq("room:ss"), "1", "--url", url, "--ca", cert)
        line, err = first_line_of_sub(switchboard_bin, uniq("room:ss"), "--url", url, "--ca", cert)
        assert line == ""
        for text in (r.stderr, err):
            assert "CaUsedAsEndEntity" in text and "is a CA certificate" in text, text
            assert "openssl req -x509" in text and "docs/security.md" in text, text
            assert "if a private CA signed it" not in text, text
        assert r.returncode == 1
    finally:
        srv.kill()


def test_cli_publish_to_a_url_with_a_path_says_it_is_only_a_proxy_prefix(server, switchboard_bin):
    r = run(switchboard_bin, "publish", uniq("room:path"), "1", "--url", f"http://127.0.0.1:{server.port}/api")
    assert r.returncode == 1 and "HTTP 404" in r.stderr, r.stderr
    assert "a path in it is only a proxy's prefix" in r.stderr, r.stderr
    # `sub` to the same URL gives the same hint.
    line, err = first_line_of_sub(switchboard_bin, uniq("room:path"), "--url", f"http://127.0.0.1:{server.port}/api")
    assert line == "" and "a path in it is only a proxy's prefix" in err, err


def test_cli_sub_refused_for_lack_of_credentials_says_how_to_give_them(start_server, switchboard_bin):
    srv = start_server("--jwt-secret", SECRET)
    channels = [uniq("room:lobby"), uniq("room:lobby")]
    r = run(switchboard_bin, "sub", *channels, "--url", srv.http_url)
    assert r.returncode == 1, r
    assert r.stderr.count("error 401") == 2, r.stderr
    # The hint `publish` gives, once for both channels.
    assert r.stderr.count("--token TOKEN (a token or API key) or --user NAME") == 1, r.stderr
    p = run(switchboard_bin, "publish", channels[0], "1", "--url", srv.http_url)
    assert p.returncode == 1 and "--token TOKEN (a token or API key) or --user NAME" in p.stderr, p.stderr
