"""Limits and bad input (SPEC §2 codes, docs/protocol.md "Codes"). After every bad client a
bystander subscribed to its own channel must still receive every publication, in order."""

from __future__ import annotations

import json
import time

import pytest

import sb
from sb import OP_BINARY, OP_CONT, OP_TEXT, WS, RawWS, api_publish, uniq


def _ping_frame_of_size(size: int, id: int = 1) -> str:
    head = '{"id":%d,"ping":{"data":"' % id
    tail = '"}}'
    text = head + "x" * (size - len(head) - len(tail)) + tail
    assert len(text.encode()) == size
    return text


def _assert_disconnect_messages(messages, code):
    """Any `disconnect` message the server sent before closing must carry the close code."""
    for m in messages:
        if isinstance(m, dict) and "disconnect" in m:
            assert m["disconnect"]["code"] == code, m


def _assert_no_disconnect(messages):
    """A connection failed by RFC 6455 (1002, 1007, 1009) gets the close frame alone."""
    assert not [m for m in messages if isinstance(m, dict) and "disconnect" in m], messages


# -------------------------------------------------------------------------------- frame size


@pytest.mark.parametrize("server,limit", [([], 65536), (["--max-frame-bytes", "1024"], 1024)],
                         indirect=["server"], ids=["default-64KiB", "flag-1KiB"])
def test_limits_frame_larger_than_max_frame_bytes_is_failed_1009(server, limit, bystander):
    with WS(server.ws_url) as ok_client:
        # Exactly at the limit is accepted and answered.
        frame = _ping_frame_of_size(limit, id=1)
        ok_client.send_raw(frame)
        reply = ok_client.recv_where(lambda m: m.get("id") == 1)
        assert reply == {"id": 1, "ok": {"data": json.loads(frame)["ping"]["data"]}}
    bystander.check()

    with WS(server.ws_url) as big:
        big.send_raw(_ping_frame_of_size(limit + 1, id=2))
        closed = big.wait_closed()
        assert closed.code == 1009
        _assert_no_disconnect(closed.messages)
    bystander.check()


def test_limits_fragmented_message_over_max_frame_bytes_is_failed_1009(server, bystander):
    text = _ping_frame_of_size(100_000).encode()
    with RawWS("127.0.0.1", server.port) as raw:
        raw.send_frame(OP_TEXT, text[:40_000], fin=False)
        raw.send_frame(OP_CONT, text[40_000:80_000], fin=False)
        try:
            raw.send_frame(OP_CONT, text[80_000:], fin=True)
        except OSError:
            pass
        seen = []
        code, _ = raw.read_until_close(seen.extend)
        assert code == 1009
        _assert_no_disconnect(seen)
    bystander.check()


def test_limits_fragmented_message_within_limit_is_accepted(server, bystander):
    text = b'{"id":3,"ping":{"data":"fragmented"}}'
    with RawWS("127.0.0.1", server.port) as raw:
        raw.send_frame(OP_TEXT, text[:10], fin=False)
        raw.send_frame(OP_CONT, text[10:20], fin=False)
        raw.send_frame(OP_CONT, text[20:], fin=True)
        op, payload = raw.recv_message()
        assert op == OP_TEXT
        assert json.loads(payload) == {"id": 3, "ok": {"data": "fragmented"}}
    bystander.check()


# -------------------------------------------------------------------------------- bad frames

BAD_TEXT = {
    "not-json": "hello",
    "json-array": "[1,2]",
    "json-string": '"ping"',
    "json-number": "42",
    "empty-object": "{}",
    "no-command-key": '{"id":1}',
    "truncated-json": '{"id":1,"ping":{"data":',
}


@pytest.mark.parametrize("name", list(BAD_TEXT))
def test_limits_garbage_text_frame_is_closed_4010(server, bystander, name):
    with WS(server.ws_url) as bad:
        bad.send_raw(BAD_TEXT[name])
        closed = bad.wait_closed()
        assert closed.code == 4010, (name, closed.code, closed.reason)
        _assert_disconnect_messages(closed.messages, 4010)
    bystander.check()


def test_limits_binary_frame_on_json_subprotocol_is_closed_4010(server, bystander):
    with WS(server.ws_url, subprotocol=sb.JSON_PROTOCOL) as bad:
        bad.send_raw(b'{"id":1,"ping":{"data":1}}')  # bytes → binary frame
        closed = bad.wait_closed()
        assert closed.code == 4010
        _assert_disconnect_messages(closed.messages, 4010)
    bystander.check()


def test_limits_invalid_utf8_text_frame_is_failed_1007(server, bystander):
    with RawWS("127.0.0.1", server.port) as raw:
        raw.send_frame(OP_TEXT, b'{"id":1,"ping":{"data":"\xff\xfe"}}')
        seen = []
        code, _ = raw.read_until_close(seen.extend)
        assert code == 1007
        _assert_no_disconnect(seen)
    bystander.check()


def test_limits_garbage_binary_frame_on_msgpack_subprotocol_is_closed_4010(server, bystander):
    with WS(server.ws_url, subprotocol=sb.MSGPACK_PROTOCOL) as bad:
        bad.send_raw(b"\xc1\xc1\xc1")  # 0xc1 is never valid MessagePack
        closed = bad.wait_closed()
        assert closed.code == 4010
    bystander.check()


@pytest.mark.parametrize("kind", ["unmasked", "reserved-bits", "unknown-opcode", "fragmented-ping"])
def test_limits_bad_framing_is_failed_1002(server, bystander, kind):
    payload = b'{"id":1,"ping":{"data":1}}'
    with RawWS("127.0.0.1", server.port) as raw:
        if kind == "unmasked":
            raw.send_frame(OP_TEXT, payload, mask=False)
        elif kind == "reserved-bits":
            raw.send_frame(OP_TEXT, payload, rsv=0b100)
        elif kind == "unknown-opcode":
            raw.send_frame(3, payload)
        elif kind == "fragmented-ping":
            raw.send_frame(sb.OP_PING, b"x", fin=False)
        seen = []
        code, why = raw.read_until_close(seen.extend)
        assert code == 1002, (kind, code, why)
        _assert_no_disconnect(seen)
    bystander.check()


def test_limits_bystander_survives_every_bad_client_in_sequence(server, bystander):
    for name, text in BAD_TEXT.items():
        with WS(server.ws_url) as bad:
            bad.send_raw(text)
            assert bad.wait_closed().code == 4010, name
        bystander.check(2)
    with WS(server.ws_url) as big:
        big.send_raw(_ping_frame_of_size(65537))
        assert big.wait_closed().code == 1009
    bystander.check(2)
    with RawWS("127.0.0.1", server.port) as raw:
        raw.send_frame(OP_TEXT, b"\xc3\x28")
        assert raw.read_until_close(lambda m: None)[0] == 1007
    bystander.check(2)
    # Clients that vanish abruptly mid-frame or mid-handshake.
    with RawWS("127.0.0.1", server.port) as raw:
        raw.sock.sendall(b"\x81\xfe\x10\x00abcd" + b"x" * 100)
    import socket as _s
    s = _s.create_connection(("127.0.0.1", server.port))
    s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n")
    s.close()
    bystander.check(2)


# -------------------------------------------------------------------------------- unknown / bad commands keep the connection


def test_limits_unknown_command_and_bad_body_do_not_close(server, bystander):
    with WS(server.ws_url) as ws:
        assert ws.request("nope", {}, id=1)["error"]["code"] == 404
        assert ws.request("subscribe", {"channels": [1, 2]}, id=2)["error"]["code"] == 400
        assert ws.request("publish", {"channel": "room:x"}, id=3)["error"]["code"] == 400
        assert ws.ping("alive") == {"data": "alive"}
    bystander.check()


# -------------------------------------------------------------------------------- subscriptions


@pytest.mark.parametrize("server", [["--max-subscriptions", "5"]], indirect=True)
def test_limits_max_subscriptions_is_429_per_channel(server):
    chans = [uniq(f"s{i}.") for i in range(7)]
    with WS(server.ws_url) as ws:
        ok = ws.subscribe(chans)["channels"]
        good = [c for c in chans if "error" not in ok[c]]
        refused = [c for c in chans if "error" in ok[c]]
        assert len(good) == 5, ok
        assert len(refused) == 2
        for c in refused:
            assert ok[c]["error"]["code"] == 429
        assert good == chans[:5], "the channels past the limit (in request order) are refused"

        # Still refused one at a time; the connection stays open.
        extra = uniq("extra.")
        assert ws.subscribe([extra])["channels"][extra]["error"]["code"] == 429
        assert ws.ping(1) == {"data": 1}

        # The accepted ones work; the refused ones deliver nothing.
        for c in chans:
            api_publish(server, c, c)
        got = {}
        for _ in range(5):
            m = ws.recv_where(lambda m: "pub" in m)
            got[m["pub"]["ch"]] = m["pub"]["data"]
        assert got == {c: c for c in good}
        ws.ping("barrier")
        assert [m for m in ws.drain(0.3) if "pub" in m] == []

        # Unsubscribing frees a slot.
        assert ws.ok("unsubscribe", {"channels": [good[0]]}) == {}
        r = ws.subscribe([extra])["channels"][extra]
        assert "error" not in r, r


# -------------------------------------------------------------------------------- connections


@pytest.mark.parametrize("server", [["--max-connections", "3"]], indirect=True)
def test_limits_max_connections_disconnects_4029(server):
    ch = uniq("conn.")
    clients = [WS(server.ws_url) for _ in range(3)]
    try:
        for c in clients:
            c.subscribe([ch])
        over = WS(server.ws_url)
        closed = over.wait_closed()
        assert closed.code == 4029
        discs = [m for m in closed.messages if "disconnect" in m]
        assert len(discs) == 1, closed.messages
        d = discs[0]["disconnect"]
        assert d["code"] == 4029
        assert isinstance(d["reason"], str)
        assert d["reconnect"] is True

        # The HTTP API is not counted against the limit, and the three are unaffected.
        api_publish(server, ch, "still here")
        for c in clients:
            assert c.pubs(ch, 1) == [{"ch": ch, "off": 1, "data": "still here"}]

        # A slot frees up when a client leaves.
        clients.pop().close()
        deadline = time.monotonic() + 5
        while True:
            again = WS(server.ws_url)
            try:
                assert again.ping("in") == {"data": "in"}
                clients.append(again)
                break
            except (sb.Closed, TimeoutError):
                again.close()
                if time.monotonic() > deadline:
                    raise AssertionError("no connection slot freed 5 s after a client left")
                time.sleep(0.1)
    finally:
        for c in clients:
            c.close()
