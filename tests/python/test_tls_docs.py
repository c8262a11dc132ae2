"""docs/security.md, "A test CA and a node certificate", followed literally: its `openssl`
block runs as written in a fresh directory, the node serves https and wss with the certificate
it made, and clients that trust only the CA reach it — Python's `websockets` (asyncio), the
Python client package, and `switchboard publish` (rustls) — by IP address and by name. The
one-line self-signed certificate the section warns about is refused by `switchboard publish`
with the error the section names."""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
import ssl
import subprocess

from websockets.asyncio.client import connect as ws_connect

import sb
from sb import uniq
from switchboard_client import Client

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "security.md"
WAIT = 20.0


def documented_commands() -> str:
    """The first sh block of the section."""
    section = DOC.read_text().split("### A test CA and a node certificate", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def cli(binary: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, env=sb.server_env())


def start_tls_node(binary: str, tmp_path: pathlib.Path, cert: str, key: str, name: str) -> sb.Server:
    port = sb.free_port()
    return sb.start_on_port(binary, port, ["--tls-cert", str(tmp_path / cert), "--tls-key", str(tmp_path / key),
                                           "--data-dir", str(tmp_path / f"{name}.data")],
                            str(tmp_path / f"{name}.log"))


def test_tls_docs_test_ca_serves_wss_to_clients_that_trust_the_ca(switchboard_bin, tmp_path):
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", documented_commands()], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    node = start_tls_node(switchboard_bin, tmp_path, "node.pem", "node.key", "node")
    try:
        assert "listening on https://127.0.0.1:" in pathlib.Path(node.stderr_path + ".out").read_text()
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        ch = uniq("room:tls-")

        async def websockets_subscriber(host: str, n: int) -> None:
            async with ws_connect(f"wss://{host}:{node.port}/ws", ssl=ctx, open_timeout=WAIT,
                                  ping_interval=None) as ws:
                await ws.send(json.dumps({"id": 1, "subscribe": {"channels": [ch]}}))
                msgs: list = []
                while not any(m.get("pub", {}).get("off") == n for m in msgs):
                    if any(m.get("id") == 1 for m in msgs):
                        # Subscribed: the documented command line publishes over https.
                        msgs = [m for m in msgs if m.get("id") != 1]
                        p = cli(switchboard_bin, "publish", ch, json.dumps({"n": n}),
                                "--url", f"https://{host}:{node.port}", "--ca", str(tmp_path / "ca.pem"))
                        assert p.returncode == 0, p.stderr
                        assert json.loads(p.stdout)["offset"] == n
                    frame = await asyncio.wait_for(ws.recv(), WAIT)
                    msgs.extend(json.loads(line) for line in frame.split("\n") if line)
                got = [m["pub"] for m in msgs if "pub" in m]
                assert got == [{"ch": ch, "off": n, "data": {"n": n}}]

        async def package_client() -> None:
            async with Client(f"wss://localhost:{node.port}/ws", ssl=ctx) as c:
                sub = await c.subscribe(ch, initial=True)
                assert (await sub.get(WAIT)).data == {"n": 2}
                assert (await c.history(ch)).offset == 2

        asyncio.run(websockets_subscriber("127.0.0.1", 1))
        asyncio.run(websockets_subscriber("localhost", 2))
        asyncio.run(package_client())
    finally:
        node.kill()


def test_tls_docs_one_line_self_signed_certificate_is_refused_as_a_ca(switchboard_bin, tmp_path):
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem",
                        "-out", "cert.pem", "-subj", "/CN=localhost"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    node = start_tls_node(switchboard_bin, tmp_path, "cert.pem", "key.pem", "one-line")
    try:
        p = cli(switchboard_bin, "publish", "room:x", "1", "--url", f"https://localhost:{node.port}",
                "--ca", str(tmp_path / "cert.pem"))
        assert p.returncode != 0 and "CaUsedAsEndEntity" in p.stderr, (p.returncode, p.stderr)
    finally:
        node.kill()
