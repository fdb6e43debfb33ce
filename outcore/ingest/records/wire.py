"""The protocol buffers wire format, read without generated code: enough for ``tf.train.Example`` and
Caffe's ``Datum``. A field's bytes are returned as their offset and length in the message, so a picture
inside a record is located without being copied.

>>> list(fields(b"\\x08\\x96\\x01\\x12\\x02hi"))
[(1, 0, 150), (2, 2, (5, 2))]
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


class WireError(ValueError):
    """The bytes are not a protocol buffers message of the expected kind."""


def varint(data: bytes | memoryview, position: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it.

    >>> varint(b"\\x96\\x01", 0)
    (150, 2)
    """
    value = shift = 0
    while True:
        if position >= len(data):
            raise WireError("a number runs past the end of the message")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise WireError("a number is longer than 10 bytes")


def fields(data: bytes | memoryview, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, int, object]]:
    """``(field number, wire type, value)`` of each field of the message in ``data[start:stop]``: a number
    for varints and fixed-size fields (their raw unsigned value), ``(offset, length)`` for length-delimited
    ones (offsets into ``data``)."""
    position, stop = start, len(data) if stop is None else stop
    while position < stop:
        key = data[position]  # one byte for fields 1 to 15, the common case (varint() for the others)
        key, position = (key, position + 1) if key < 0x80 else varint(data, position)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise WireError("a field is numbered 0")
        if kind == VARINT:
            value, position = varint(data, position)
            yield number, kind, value
        elif kind == LENGTH:
            length = data[position] if position < stop else 0x80
            length, position = (length, position + 1) if length < 0x80 else varint(data, position)
            if position + length > stop:
                raise WireError(f"field {number} runs past the end of the message")
            yield number, kind, (position, length)
            position += length
        elif kind in (FIXED32, FIXED64):
            size = 4 if kind == FIXED32 else 8
            if position + size > stop:
                raise WireError(f"field {number} runs past the end of the message")
            yield number, kind, int.from_bytes(data[position : position + size], "little")
            position += size
        else:
            raise WireError(f"field {number} has wire type {kind}, which no message here uses")
    if position != stop:
        raise WireError("the last field runs past the end of the message")


def signed64(value: int) -> int:
    """A varint read as protocol buffers' ``int64``/``int32`` (two's complement in 64 bits)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def packed_varints(data: bytes | memoryview, offset: int, length: int) -> list[int]:
    """The numbers of a packed repeated varint field (as ``int64``)."""
    values, position, stop = [], offset, offset + length
    while position < stop:
        value, position = varint(data, position)
        values.append(signed64(value))
    return values


def packed_floats(data: bytes | memoryview, offset: int, length: int) -> list[float]:
    """The numbers of a packed repeated ``float`` field."""
    if length % 4:
        raise WireError("a packed float field is not a whole number of floats")
    return list(struct.unpack_from(f"<{length // 4}f", data, offset))


def as_float(raw: int) -> float:
    """A fixed32 field's raw value as a ``float``."""
    return struct.unpack("<f", raw.to_bytes(4, "little"))[0]
