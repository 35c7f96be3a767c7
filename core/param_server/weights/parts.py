"""A version's parts as they arrive, and the checks and assembly they go through.

A part (one per trainer host) is a header — its tensors or tensor shards and
their byte offsets — and then its bytes, written into one preallocated buffer
in offset order, each segment verified against its xxh3_64 checksum as it
arrives (:class:`Part`). :func:`check_header` decides whether a header may
start a part; :func:`assemble` turns the shards of a multi-host push into
whole tensors in the model's order. Every failure is a :class:`PushRejected`
with the gRPC status the push fails with. The store that stages, commits and
serves the versions is :mod:`rlax.core.param_server.weights.store`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import grpc
import numpy as np

from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.codec import copy_probe
from rlax.core.param_server.transport.transfer import checksum

# Bytes per element of each dtype a part may carry.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4}


class PushRejected(Exception):
    """A push that fails with gRPC status ``code``; the served version is untouched."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


BAD = grpc.StatusCode.INVALID_ARGUMENT  # the status of a malformed push


@dataclasses.dataclass
class Part:
    """One part being received or waiting for the rest of its version."""

    header: pb.PartHeader
    buffer: bytearray  # the part's bytes; a spooled part's: the scratch its chunks land in
    segments: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    received: int = 0
    fd: int | None = None  # spooled: the bytes go to this file (``path``), not to memory
    path: str | None = None

    def landing(self, length: int) -> memoryview:
        """Where the next ``length`` bytes are received (then :meth:`accept` them)."""
        if self.fd is None:
            return memoryview(self.buffer)[self.received : self.received + length]
        if len(self.buffer) < length:
            self.buffer = bytearray(length)
        return memoryview(self.buffer)[:length]

    def write(self, offset: int, data, digest: int) -> None:
        """Copies one chunk in at ``offset`` and verifies it (the gRPC path)."""
        self.check_segment(offset, len(data))
        self.landing(len(data))[:] = data
        self.accept(len(data), digest)

    def accept(self, length: int, digest: int) -> None:
        """Verifies the ``length`` bytes just landed after the received data (and spools them)."""
        offset = self.received
        view = self.landing(length)
        if checksum(view) != digest:
            raise PushRejected(
                grpc.StatusCode.DATA_LOSS, f"checksum mismatch in the chunk at offset {offset}"
            )
        if self.fd is not None:
            written = 0
            while written < length:
                written += os.pwrite(self.fd, view[written:], offset + written)
        self.segments.append((offset, length, digest))
        self.received += length

    def check_segment(self, offset: int, length: int) -> None:
        if offset != self.received:
            raise PushRejected(
                BAD,
                f"out-of-order or duplicate chunk: part {self.header.part} offset {offset}, "
                f"expected offset {self.received}",
            )
        if length <= 0 or offset + length > self.header.nbytes:
            raise PushRejected(
                BAD, f"chunk at offset {offset} overruns the part's {self.header.nbytes} bytes"
            )

    @property
    def complete(self) -> bool:
        return self.received == self.header.nbytes


def layout(header: pb.PartHeader) -> tuple:
    """What fixes a part's layout (tensor names, dtypes, shapes, slices, offsets), comparable."""
    return tuple(
        (
            header.part,
            t.name,
            t.dtype,
            tuple(t.shape),
            tuple(t.slice_start),
            tuple(t.slice_shape),
            t.offset,
            t.nbytes,
            t.index,
        )
        for t in header.tensors
    )


def is_whole(header: pb.PartHeader) -> bool:
    """Whether a header is a whole version already: one part of unsliced tensors."""
    return header.num_parts == 1 and all(
        not t.slice_shape or (tuple(t.slice_shape) == tuple(t.shape) and not any(t.slice_start))
        for t in header.tensors
    )


def check_header(
    h: pb.PartHeader,
    *,
    served_version: int,
    num_parts: int | None,
    max_version_bytes: int,
    known_layout: tuple | None,
) -> None:
    """Raises PushRejected unless ``h`` can start a part of a new version.

    Args:
      h: the part's header.
      served_version: the version pullers get now (the new one must be newer).
      num_parts: the part count of ``h.version`` fixed by an earlier part (None: first).
      max_version_bytes: the largest part the server accepts.
      known_layout: the :func:`layout` this split's part had when last committed (None: new).
    """
    if h.version <= served_version:
        raise PushRejected(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"version {h.version} is not newer than the served version {served_version}",
        )
    if not 0 <= h.part < h.num_parts <= 4096:
        raise PushRejected(BAD, f"part {h.part} of {h.num_parts} is out of range")
    if num_parts is not None and num_parts != h.num_parts:
        raise PushRejected(BAD, f"version {h.version}: num_parts {h.num_parts} != {num_parts}")
    if h.nbytes == 0 and h.num_parts == 1:
        raise PushRejected(BAD, "an empty push: a single-part version needs bytes")
    if not 0 <= h.nbytes <= max_version_bytes:
        raise PushRejected(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"part of {h.nbytes} bytes exceeds the limit of {max_version_bytes}",
        )
    _check_tensors(h)
    if known_layout is not None and known_layout != layout(h):
        ours = {t[1]: t for t in known_layout}
        diff = next((t for t in layout(h) if ours.get(t[1]) != t), None)
        what = f"tensor {diff[1]!r}" if diff else "the tensor list"
        raise PushRejected(
            BAD,
            f"{what} does not match the model's layout (unknown tensor, shape, dtype or position)",
        )


def _check_tensors(h: pb.PartHeader) -> None:
    """Raises PushRejected unless ``h``'s tensors have known dtypes, slices inside their
    shapes, and sizes and offsets that pack them back to back into ``h.nbytes``."""
    offset = 0
    for t in h.tensors:
        itemsize = DTYPE_BYTES.get(t.dtype)
        if itemsize is None:
            raise PushRejected(BAD, f"tensor {t.name!r}: unknown dtype {t.dtype!r}")
        shard = tuple(t.slice_shape) or tuple(t.shape)
        start = tuple(t.slice_start) or (0,) * len(shard)
        if (
            len(shard) != len(t.shape)
            or len(start) != len(shard)
            or any(s < 0 or st < 0 or st + s > d for s, st, d in zip(shard, start, t.shape))
        ):
            raise PushRejected(
                BAD,
                f"tensor {t.name!r}: slice {list(t.slice_start)}+{list(shard)} "
                f"outside shape {list(t.shape)}",
            )
        if t.offset != offset or t.nbytes != int(np.prod(shard, dtype=np.int64)) * itemsize:
            raise PushRejected(
                BAD,
                f"tensor {t.name!r}: offset/size {t.offset}/{t.nbytes} "
                f"do not match its shape and position",
            )
        offset += t.nbytes
    if offset != h.nbytes:
        raise PushRejected(BAD, f"tensors add up to {offset} bytes, header says {h.nbytes}")


def assemble(
    number: int, parts: dict[int, Part], alloc: Callable[[int], bytearray]
) -> tuple[pb.PartHeader, bytearray]:
    """Whole tensors, in the model's order (``index``), from the parts' shards.

    The buffer comes from ``alloc(nbytes)``; a header of parts that disagree
    or shards that do not tile their tensor raise PushRejected.
    """
    tensors: dict[str, list] = {}
    for i in sorted(parts):
        for t in parts[i].header.tensors:
            entry = tensors.setdefault(t.name, [t.index, t.dtype, tuple(t.shape), []])
            if (entry[0], entry[1], entry[2]) != (t.index, t.dtype, tuple(t.shape)):
                raise PushRejected(
                    BAD,
                    f"version {number}: parts disagree on tensor "
                    f"{t.name!r} (index, dtype or shape)",
                )
            entry[3].append((parts[i], t))
    header = pb.PartHeader(version=number, part=0, num_parts=1)
    copy_probe(parts[min(parts)].header, header)  # the first part's (every part sends it)
    offset = 0
    for name in sorted(tensors, key=lambda n: tensors[n][0]):
        index, dtype, shape, shards = tensors[name]
        _check_tiling(
            name,
            shape,
            [
                (tuple(t.slice_start) or (0,) * len(shape), tuple(t.slice_shape) or shape)
                for _, t in shards
            ],
        )
        nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPE_BYTES[dtype]
        header.tensors.add(
            name=name, dtype=dtype, shape=shape, offset=offset, nbytes=nbytes, index=index
        )
        offset += nbytes
    header.nbytes = offset
    buffer = alloc(offset)
    for t_whole in header.tensors:
        unit = np.dtype(f"u{DTYPE_BYTES[t_whole.dtype]}")  # bytes are moved, never interpreted
        shape = tuple(t_whole.shape)
        whole = np.frombuffer(buffer, unit, int(np.prod(shape)), t_whole.offset).reshape(shape)
        for part, t in tensors[t_whole.name][3]:
            sshape = tuple(t.slice_shape) or shape
            start = tuple(t.slice_start) or (0,) * len(shape)
            shard = np.frombuffer(part.buffer, unit, int(np.prod(sshape)), t.offset)
            whole[tuple(slice(a, a + n) for a, n in zip(start, sshape))] = shard.reshape(sshape)
    return header, buffer


def _check_tiling(name: str, shape: tuple, shards: list[tuple[tuple, tuple]]) -> None:
    """Raises unless the shards tile ``shape`` exactly, as a grid (what mesh shardings make)."""
    cuts = []
    for d, size in enumerate(shape):
        spans = sorted({(start[d], sshape[d]) for start, sshape in shards})
        position = 0
        for a, n in spans:
            if a != position or n <= 0:
                raise PushRejected(
                    BAD, f"tensor {name!r}: shards do not tile dimension {d} of shape {list(shape)}"
                )
            position = a + n
        if position != size:
            raise PushRejected(
                BAD, f"tensor {name!r}: shards cover {position} of {size} in dimension {d}"
            )
        cuts.append(len(spans))
    starts = {start for start, _ in shards}
    if len(starts) != len(shards) or len(shards) != int(np.prod(cuts, dtype=np.int64)):
        raise PushRejected(
            BAD,
            f"tensor {name!r}: {len(shards)} shards do not form a grid "
            "(overlapping or missing shards)",
        )
