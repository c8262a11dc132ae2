"""Applying Fossil deltas: the format of the Fossil SCM's `delta.c`, which the node uses for the
publications of `delta="fossil"` subscriptions.

A delta is the output size as a base-64 integer and `\\n`, then commands: `N@O,` copies N bytes
of the previous text from offset O, `N:` inserts the N bytes that follow, and `N;` ends the
delta with the checksum of the output (the sum of its big-endian 32-bit words, the last padded
with zeros, modulo 2^32). Base-64 digits are `0-9 A-Z _ a-z ~`, most significant first.

Written here because PyPI has no maintained package for it (the two there are C extensions
last released in 2017 and 2018, without wheels); the tests check it against deltas made by the
Rust crate and the npm package the other clients use (tests/fixtures/fossil-deltas.json).
Nothing is trusted: the declared size is checked against a bound before any work, every copy
and insert against the texts' ends, the output against the declared size, and the checksum.
"""

from __future__ import annotations

import struct

DIGITS = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~"
_VALUE = {d: i for i, d in enumerate(DIGITS)}
# A longer integer is no size or offset a delta of a publication can hold (10 digits are 2^60);
# refusing it keeps a hostile delta from making this parse big numbers.
_MAX_DIGITS = 10

NEWLINE, COPY, COMMA, INSERT, END = b"\n@,:;"


class DeltaError(ValueError):
    """A delta that cannot be applied: malformed, larger than allowed, or a checksum mismatch."""


def _int(delta: bytes, at: int) -> tuple[int, int]:
    """The base-64 integer starting at `at` (0 when no digit is there) and where it ends."""
    v = 0
    end = min(len(delta), at + _MAX_DIGITS + 1)
    start = at
    while at < end:
        d = _VALUE.get(delta[at])
        if d is None:
            return v, at
        v = (v << 6) + d
        at += 1
    if at - start > _MAX_DIGITS:
        raise DeltaError("malformed delta: a number too long")
    return v, at


def output_size(delta: bytes) -> int:
    """The size of the text `delta` makes, as it declares it."""
    size, at = _int(delta, 0)
    if at >= len(delta) or delta[at] != NEWLINE:
        raise DeltaError("malformed delta: the output size is not followed by a newline")
    return size


def checksum(data: bytes | bytearray) -> int:
    """The format's checksum of `data`."""
    padded = bytes(data) + b"\0" * (-len(data) % 4)
    return sum(struct.unpack(f">{len(padded) // 4}I", padded)) & 0xFFFF_FFFF


def apply(base: bytes, delta: bytes, max_bytes: int) -> bytes:
    """The text `delta` turns `base` into. A delta declaring more than `max_bytes` is refused
    before anything is built."""
    size = output_size(delta)
    if size > max_bytes:
        raise DeltaError(f"the publication declares {size} bytes, more than the {max_bytes} allowed")
    out = bytearray()
    at = delta.index(NEWLINE) + 1
    n = len(delta)
    while at < n:
        count, at = _int(delta, at)
        if at >= n:
            break
        op = delta[at]
        at += 1
        if op == COPY:
            offset, at = _int(delta, at)
            if at >= n or delta[at] != COMMA:
                raise DeltaError("malformed delta: a copy command without its ','")
            at += 1
            if offset + count > len(base):
                raise DeltaError("malformed delta: a copy past the end of the previous publication")
            if len(out) + count > size:
                raise DeltaError("malformed delta: an output larger than declared")
            out += base[offset:offset + count]
        elif op == INSERT:
            if at + count > n:
                raise DeltaError("malformed delta: an insert past the end of the delta")
            if len(out) + count > size:
                raise DeltaError("malformed delta: an output larger than declared")
            out += delta[at:at + count]
            at += count
        elif op == END:
            if len(out) != size:
                raise DeltaError("malformed delta: an output of another size than declared")
            if count != checksum(out):
                raise DeltaError("the delta's checksum does not match its result")
            return bytes(out)
        else:
            raise DeltaError("malformed delta: an unknown command")
    raise DeltaError("malformed delta: no checksum at its end")
