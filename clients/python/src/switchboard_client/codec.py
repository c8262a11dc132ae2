"""Wire formats: JSON on `switchboard.v1.json` (text frames) and MessagePack on
`switchboard.v1.msgpack` (binary frames, the optional `msgpack` extra).

The server batches under load: one text frame may carry several messages separated by `\\n`,
and one binary frame several concatenated MessagePack maps. `decode` always returns the list of
messages of one frame.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Protocol

JSON_PROTOCOL = "switchboard.v1.json"
MSGPACK_PROTOCOL = "switchboard.v1.msgpack"

Format = Literal["json", "msgpack"]


class Codec(Protocol):
    subprotocol: str

    def encode(self, message: Any) -> str | bytes: ...

    def decode(self, frame: str | bytes) -> list[Any]: ...


class JsonCodec:
    subprotocol = JSON_PROTOCOL

    def __init__(self) -> None:
        self._encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)

    def encode(self, message: Any) -> str:
        return self._encoder.encode(message)

    def decode(self, frame: str | bytes) -> list[Any]:
        if isinstance(frame, bytes):
            raise ValueError("binary frame on the JSON subprotocol")
        if "\n" not in frame:
            return [json.loads(frame)]
        # Raw line breaks occur only between messages (the node stores published data on one
        # line), so a batch parses as one JSON array: one call instead of one per message.
        body = frame.strip()
        if not body:
            return []
        try:
            msgs: list[Any] = json.loads("[" + body.replace("\n", ",") + "]")
            return msgs
        except ValueError:
            return [json.loads(part) for part in frame.split("\n") if part.strip()]


class MsgpackCodec:
    subprotocol = MSGPACK_PROTOCOL

    def __init__(self) -> None:
        try:
            import msgpack  # type: ignore[import-untyped,unused-ignore]
        except ImportError as e:  # the optional extra is not installed
            raise ImportError(
                "format='msgpack' needs the msgpack package: pip install 'switchboard-client[msgpack]'"
            ) from e
        self._msgpack = msgpack
        self._packer = msgpack.Packer(use_bin_type=True)

    def encode(self, message: Any) -> bytes:
        packed: bytes = self._packer.pack(message)
        return packed

    def decode(self, frame: str | bytes) -> list[Any]:
        if isinstance(frame, str):
            raise ValueError("text frame on the MessagePack subprotocol")
        mp = self._msgpack
        # One map per frame is the common case: unpackb is fastest. When the frame carries
        # more, ExtraData hands back the first map and the rest, read with one Unpacker (not
        # unpackb again: each ExtraData copies what follows).
        try:
            return [mp.unpackb(frame, raw=False, strict_map_key=False)]
        except mp.ExtraData as e:
            up = mp.Unpacker(raw=False, strict_map_key=False)
            up.feed(e.extra)
            return [e.unpacked, *up]


def codec_for(fmt: Format) -> Codec:
    if fmt == "json":
        return JsonCodec()
    if fmt == "msgpack":
        return MsgpackCodec()
    raise ValueError(f"format must be 'json' or 'msgpack', not {fmt!r}")
