"""The WeightStore service: versioned weights, committed only when whole and verified.

A version is made of ``num_parts`` parts (one per trainer host); each part is a
header then data chunks in offset order. The server keeps the received
messages as they came off the wire and, once a version's every part is
complete, its sizes add up and every chunk's CRC32 matches, commits it atomically as
the newest version; Pull then streams those same messages out again without
re-encoding them. Anything wrong — a cut-off stream, a gap, a duplicate chunk,
an unknown tensor, a wrong size or checksum, a version that is not newer —
fails the push with a gRPC status and leaves the served version untouched.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
import zlib

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from rlax.core.param_server import rlax_pb2 as pb

_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4}


_CRC_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="rlax-crc")


def _verify(checks) -> None:
    for offset, expected, future in checks:
        if future.result() & 0xFFFFFFFF != expected:
            raise PushRejected(
                grpc.StatusCode.DATA_LOSS, f"CRC32 mismatch in the chunk at offset {offset}"
            )


class PushRejected(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass
class _Part:
    header: pb.PartHeader
    messages: list[bytes]


@dataclasses.dataclass
class _Version:
    number: int
    num_parts: int
    parts: dict[int, _Part]

    @property
    def nbytes(self) -> int:
        return sum(p.header.nbytes for p in self.parts.values())


def _layout(header: pb.PartHeader) -> tuple:
    return tuple(
        (header.part, t.name, t.dtype, tuple(t.shape), tuple(t.slice_start), tuple(t.slice_shape),
         t.offset, t.nbytes)
        for t in header.tensors
    )  # fmt: skip


class WeightStore:
    """State and logic of the WeightStore service (the gRPC glue is in server.py)."""

    def __init__(self, *, max_version_bytes: int):
        self.max_version_bytes = max_version_bytes
        self._lock = threading.Condition()
        self._committed: _Version | None = None
        self._pending: dict[int, _Version] = {}
        self._layouts: dict[int, tuple] = {}  # part -> layout, fixed by the first commit
        self._push_ids: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.rejected = 0
        self.committed_at = 0.0

    # -- reading ------------------------------------------------------------

    @property
    def version(self) -> int:
        with self._lock:
            return self._committed.number if self._committed else -1

    @property
    def version_bytes(self) -> int:
        with self._lock:
            return self._committed.nbytes if self._committed else 0

    def messages_for(self, have_version: int) -> list[bytes]:
        """Every wire message of the newest version, or [] if the caller has it."""
        with self._lock:
            v = self._committed
            if v is None or v.number == have_version:
                return []
            return [m for i in sorted(v.parts) for m in v.parts[i].messages]

    def wait_for(self, after_version: int, timeout_s: float) -> int:
        deadline = time.monotonic() + max(0.0, min(timeout_s, 3600.0))
        with self._lock:
            while self.version <= after_version:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._lock.wait(remaining):
                    break
            return self.version

    # -- writing ------------------------------------------------------------

    def _check_header(self, h: pb.PartHeader) -> None:
        bad = grpc.StatusCode.INVALID_ARGUMENT
        if h.version <= self.version:
            raise PushRejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"version {h.version} is not newer than the served version {self.version}",
            )
        if not 0 <= h.part < h.num_parts <= 4096:
            raise PushRejected(bad, f"part {h.part} of {h.num_parts} is out of range")
        pending = self._pending.get(h.version)
        if pending and pending.num_parts != h.num_parts:
            raise PushRejected(
                bad, f"version {h.version}: num_parts {h.num_parts} != {pending.num_parts}"
            )
        if not 0 < h.nbytes <= self.max_version_bytes:
            raise PushRejected(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"part of {h.nbytes} bytes exceeds the limit of {self.max_version_bytes}",
            )
        offset = 0
        for t in h.tensors:
            itemsize = _DTYPES.get(t.dtype)
            if itemsize is None:
                raise PushRejected(bad, f"tensor {t.name!r}: unknown dtype {t.dtype!r}")
            shard = tuple(t.slice_shape) or tuple(t.shape)
            if len(shard) != len(t.shape) or any(
                s < 0 or st < 0 or st + s > d
                for s, st, d in zip(shard, tuple(t.slice_start) or (0,) * len(shard), t.shape)
            ):
                raise PushRejected(bad, f"tensor {t.name!r}: slice {list(t.slice_start)}+{list(shard)} "
                                        f"outside shape {list(t.shape)}")  # fmt: skip
            if t.offset != offset or t.nbytes != int(np.prod(shard, dtype=np.int64)) * itemsize:
                raise PushRejected(bad, f"tensor {t.name!r}: offset/size {t.offset}/{t.nbytes} "
                                        f"do not match its shape and position")  # fmt: skip
            offset += t.nbytes
        if offset != h.nbytes:
            raise PushRejected(bad, f"tensors add up to {offset} bytes, header says {h.nbytes}")
        known = self._layouts.get(h.part)
        if known is not None and known != _layout(h):
            ours = {t[1]: t for t in known}
            diff = next((t for t in _layout(h) if ours.get(t[1]) != t), None)
            what = f"tensor {diff[1]!r}" if diff else "the tensor list"
            raise PushRejected(bad, f"{what} does not match the model's layout (unknown tensor, "
                                    "shape, dtype or position)")  # fmt: skip

    def push(self, messages) -> pb.PushReply:
        """Consumes one Push stream of raw WeightChunk messages; commits or raises PushRejected."""
        try:
            return self._push(messages)
        except PushRejected:
            with self._lock:
                self.rejected += 1
            raise

    def _push(self, messages) -> pb.PushReply:
        bad = grpc.StatusCode.INVALID_ARGUMENT
        part: _Part | None = None
        received = 0
        done: list[_Part] = []
        checks: list = []
        for raw in messages:
            try:
                chunk = pb.WeightChunk.FromString(raw)
            except DecodeError:
                raise PushRejected(bad, "undecodable weight chunk") from None
            if chunk.HasField("header"):
                if part is not None:
                    raise PushRejected(bad, f"part {part.header.part} ended after {received} of "
                                            f"{part.header.nbytes} bytes")  # fmt: skip
                with self._lock:
                    if chunk.header.push_id and chunk.header.push_id in self._push_ids:
                        return pb.PushReply(
                            version=self._push_ids[chunk.header.push_id], duplicate=True
                        )
                    self._check_header(chunk.header)
                part, received = _Part(chunk.header, []), 0
                if chunk.data:
                    raise PushRejected(bad, "a header message carries no data")
                part.messages.append(raw)
                continue
            if part is None:
                raise PushRejected(bad, "data chunk before any header")
            if chunk.part != part.header.part or chunk.offset != received:
                raise PushRejected(
                    bad,
                    f"out-of-order or duplicate chunk: part {chunk.part} offset {chunk.offset}, "
                    f"expected part {part.header.part} offset {received}",
                )
            if not chunk.data or received + len(chunk.data) > part.header.nbytes:
                raise PushRejected(bad, f"chunk at offset {chunk.offset} overruns the part's "
                                        f"{part.header.nbytes} bytes")  # fmt: skip
            # Checked on another thread (zlib releases the GIL) while the next chunk arrives.
            checks.append((chunk.offset, chunk.crc32, _CRC_POOL.submit(zlib.crc32, chunk.data)))
            received += len(chunk.data)
            part.messages.append(raw)
            if received == part.header.nbytes:
                _verify(checks)
                checks = []
                done.append(part)
                part = None
        if part is not None or not done:
            raise PushRejected(bad, "push ended before its part was complete")
        return self._store(done)

    def _store(self, parts: list[_Part]) -> pb.PushReply:
        with self._lock:
            number = parts[0].header.version
            for p in parts:
                if p.header.version != number:
                    raise PushRejected(grpc.StatusCode.INVALID_ARGUMENT, "one push, one version")
                self._check_header(p.header)  # still newer than what was committed meanwhile
            v = self._pending.setdefault(number, _Version(number, parts[0].header.num_parts, {}))
            for p in parts:
                v.parts[p.header.part] = p
                if p.header.push_id:
                    self._push_ids[p.header.push_id] = number
                    while len(self._push_ids) > 4096:
                        self._push_ids.popitem(last=False)
            committed = len(v.parts) == v.num_parts
            if committed:
                self._committed = v
                self._pending = {k: pv for k, pv in self._pending.items() if k > number}
                for i, p in v.parts.items():
                    self._layouts.setdefault(i, _layout(p.header))
                self.committed_at = time.time()
                self._lock.notify_all()
            return pb.PushReply(version=number, committed=committed)
