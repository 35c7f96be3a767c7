"""The gRPC chunk codec: ``WeightChunk`` messages encoded and decoded by hand.

``WeightStore.Push`` / ``Pull`` stream weight bytes as ``WeightChunk``
messages (rlax.proto), encoded and decoded here by hand around the payload
in protobuf's wire format, so a chunk's bytes are copied once on the way out
and once on the way in. A data chunk carries the xxh3_64 checksum of its bytes
(:func:`rlax.core.param_server.transport.transfer.checksum`, the one the bulk
lane checks too); a message holding a ``header`` instead starts a part.
"""

from __future__ import annotations

from rlax.core.param_server.transport.transfer import checksum


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(buf: memoryview, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("weight chunk: truncated or overlong varint")
        b = buf[i]
        result |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return result, i
        shift += 7


def encode_chunk(part: int, offset: int, data, digest: int | None = None) -> bytes:
    """WeightChunk{part, offset, data, checksum} in protobuf wire format, built around ``data``."""
    head = b"\x10" + _varint(part) + b"\x18" + _varint(offset) + b"\x22" + _varint(len(data))
    tail = b"\x28" + _varint(checksum(data) if digest is None else digest)
    return b"".join((head, data, tail))


def decode_chunk(raw) -> tuple[int, int, memoryview, int] | None:
    """(part, offset, data view, checksum) of a data chunk, or None for a header message.

    Raises ValueError on bytes that are not a WeightChunk.
    """
    buf = memoryview(raw)
    i, part, offset, data, digest = 0, 0, 0, buf[0:0], 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        field, kind = key >> 3, key & 7
        if field == 1:
            return None
        if kind == 0:
            value, i = _read_varint(buf, i)
            if field == 2:
                part = value
            elif field == 3:
                offset = value
            elif field == 5:
                digest = value
        elif kind == 2:
            n, i = _read_varint(buf, i)
            if i + n > len(buf):
                raise ValueError("weight chunk: field overruns the message")
            if field == 4:
                data = buf[i : i + n]
            i += n
        else:
            raise ValueError(f"weight chunk: unexpected wire type {kind}")
    return part, offset, data, digest
