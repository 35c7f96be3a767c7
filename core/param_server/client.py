"""Client of the parameter server: weights in and out, leases, submits, takes, acks.

Unary calls retry with bounded exponential backoff while the server is
unreachable (a restarting server is normal), and say so in the log; every
mutating call is idempotent on the server, so a retry after a lost reply is
safe. Weight chunks are encoded and decoded by hand around the payload so a
chunk's bytes are copied once on the way out and once on the way in.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
import uuid
import zlib
from collections.abc import Iterator

import grpc
import numpy as np

from rlax.core.param_server import codec
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.settings import MB, ServerSettings, tune_malloc
from rlax.core.types import Group, Prompt
from rlax.core.weight_sync import WirePlan, chunks, stream

log = logging.getLogger("rlax.client")

_CRC_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="rlax-crc")
_RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


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
        b = buf[i]
        result |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return result, i
        shift += 7


def encode_chunk(part: int, offset: int, data: memoryview, crc: int | None = None) -> bytes:
    """WeightChunk{part, offset, data, crc32} in protobuf wire format, built around ``data``."""
    head = b"\x10" + _varint(part) + b"\x18" + _varint(offset) + b"\x22" + _varint(len(data))
    crc = zlib.crc32(data) if crc is None else crc
    tail = b"\x28" + _varint(crc & 0xFFFFFFFF)
    return b"".join((head, data, tail))


def decode_chunk(raw: bytes) -> tuple[int, int, memoryview, int] | None:
    """(part, offset, data view, crc32) of a data chunk, or None for a header message."""
    buf = memoryview(raw)
    i, part, offset, data, crc = 0, 0, 0, buf[0:0], 0
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
                crc = value
        elif kind == 2:
            n, i = _read_varint(buf, i)
            if field == 4:
                data = buf[i : i + n]
            i += n
        else:
            raise ValueError(f"weight chunk: unexpected wire type {kind}")
    return part, offset, data, crc


class ParamServerClient:
    """One connection to the parameter server (thread-safe, like its gRPC channel)."""

    def __init__(self, settings: ServerSettings, *, retry_s: float = 60.0):
        self.settings = settings.resolved()
        self.retry_s = retry_s
        tune_malloc()
        self._channel = self.settings.channel()
        self._auth = (("authorization", f"Bearer {self.settings.token}"),)
        ch = self._channel
        self._push = ch.stream_unary(
            "/rlax.v1.WeightStore/Push",
            request_serializer=None,
            response_deserializer=pb.PushReply.FromString,
        )
        self._pull = ch.unary_stream(
            "/rlax.v1.WeightStore/Pull", request_serializer=pb.PullRequest.SerializeToString,
            response_deserializer=None,
        )  # fmt: skip
        self._calls = {
            name: ch.unary_unary(
                f"/rlax.v1.{service}/{name}",
                request_serializer=req.SerializeToString,
                response_deserializer=rep.FromString,
            )
            for service, name, req, rep in (
                ("WeightStore", "WaitForVersion", pb.WaitRequest, pb.VersionInfo),
                ("WeightStore", "Stat", pb.StatRequest, pb.StatReply),
                ("RolloutQueue", "Lease", pb.LeaseRequest, pb.LeaseReply),
                ("RolloutQueue", "Submit", pb.SubmitRequest, pb.SubmitReply),
                ("RolloutQueue", "Take", pb.TakeRequest, pb.TakeReply),
                ("RolloutQueue", "Ack", pb.AckRequest, pb.AckReply),
            )
        }
        self._buffers: dict[int, bytearray] = {}

    def close(self) -> None:
        self._channel.close()

    def _call(self, name: str, request, timeout: float | None = None):
        delay, deadline = 0.1, time.monotonic() + self.retry_s
        while True:
            try:
                return self._calls[name](request, metadata=self._auth, timeout=timeout)
            except grpc.RpcError as err:
                if err.code() not in _RETRY or time.monotonic() + delay > deadline:
                    raise
                log.warning("%s: %s; retrying in %.1fs", name, err.code().name, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    # -- weights ------------------------------------------------------------

    def push_messages(self, plan: WirePlan, tree_or_buffer, version: int) -> Iterator[bytes]:
        """The wire messages of one whole-model push (part 0 of 1)."""
        header = pb.PartHeader(
            version=version, part=0, num_parts=1, nbytes=plan.nbytes, push_id=uuid.uuid4().hex
        )
        for t in plan.tensors:
            header.tensors.add(
                name=t.name,
                dtype=plan.wire_dtype.name,
                shape=t.shape,
                offset=t.offset,
                nbytes=t.nbytes,
            )
        yield pb.WeightChunk(header=header, part=0).SerializeToString()
        chunk = self.settings.chunk_mb * MB
        if isinstance(tree_or_buffer, np.ndarray) and tree_or_buffer.dtype == np.uint8:
            pieces = chunks(tree_or_buffer, chunk)  # already packed
        else:
            pieces = stream(plan, tree_or_buffer, chunk)
        pieces = list(pieces)
        # Checksums run ahead on other threads (zlib releases the GIL) while chunks are sent.
        crcs = [_CRC_POOL.submit(zlib.crc32, view) for _, view in pieces]
        for (offset, view), crc in zip(pieces, crcs):
            yield encode_chunk(0, offset, view, crc.result())

    def push(self, plan: WirePlan, tree_or_buffer, version: int) -> pb.PushReply:
        """Publishes a parameter tree (or its packed uint8 buffer) as ``version``."""
        return self._push(self.push_messages(plan, tree_or_buffer, version), metadata=self._auth)

    def pull(self, have_version: int = -1) -> tuple[int, list[dict], bytearray] | None:
        """(version, tensor list, buffer) of the newest version, or None if we have it.

        Single-part versions only (multi-host pushes are reassembled by the mesh trainer's
        pull, later); the buffer is reused between pulls of the same size.
        """
        header, buf, received, checks = None, None, 0, []
        for raw in self._pull(pb.PullRequest(have_version=have_version)):
            decoded = decode_chunk(raw)
            if decoded is None:
                header = pb.WeightChunk.FromString(raw).header
                if header.num_parts != 1:
                    raise NotImplementedError("pull of a multi-part version")
                buf = self._buffers.get(header.nbytes) or bytearray(header.nbytes)
                self._buffers = {header.nbytes: buf}
                continue
            _, offset, data, crc = decoded
            if header is None or offset != received:
                raise ValueError(f"pull: chunk at {offset}, expected {received}")
            buf[offset : offset + len(data)] = data
            checks.append((offset, crc, _CRC_POOL.submit(zlib.crc32, data)))
            received += len(data)
        if header is None:
            return None
        if received != header.nbytes:
            raise ValueError(
                f"pull of version {header.version}: {received} of {header.nbytes} bytes"
            )
        for offset, expected, got in checks:
            if got.result() & 0xFFFFFFFF != expected:
                raise ValueError(
                    f"pull of version {header.version}: CRC32 mismatch at offset {offset}"
                )
        tensors = [
            {
                "name": t.name,
                "shape": list(t.shape),
                "offset": t.offset,
                "nbytes": t.nbytes,
                "dtype": t.dtype,
            }
            for t in header.tensors
        ]
        return header.version, tensors, buf

    def wait_for_version(self, after_version: int, timeout_s: float) -> int:
        req = pb.WaitRequest(after_version=after_version, timeout_s=timeout_s)
        return self._call("WaitForVersion", req, timeout=timeout_s + 30).version

    def stat(self) -> pb.StatReply:
        return self._call("Stat", pb.StatRequest(), timeout=30)

    # -- rollouts -----------------------------------------------------------

    def lease(self, worker: str, max_prompts: int, *, wait_s: float = 5.0, idle_s: float = 0.0,
              busy_s: float = 0.0, reward_errors: int = 0, reward_timeouts: int = 0,
              ) -> list[tuple[str, Prompt]]:  # fmt: skip
        """Up to ``max_prompts`` (lease id, prompt) pairs; [] if no room came within ``wait_s``.

        The worker's cumulative idle/busy seconds and verifier failures ride along for Stat.
        """
        req = pb.LeaseRequest(
            worker=worker, max_prompts=max_prompts, wait_s=wait_s, idle_s=idle_s, busy_s=busy_s,
            reward_errors=reward_errors, reward_timeouts=reward_timeouts,
        )  # fmt: skip
        reply = self._call("Lease", req, timeout=wait_s + 30)
        return [(x.lease_id, codec.msg_to_prompt(x.prompt)) for x in reply.leases]

    def submit(self, group: Group, lease_id: str, *, filtered: bool = False) -> bool:
        """Submits a scored group for its lease; returns True if it was a duplicate."""
        req = pb.SubmitRequest(group=codec.group_to_msg(group, lease_id, filtered))
        return self._call("Submit", req, timeout=60).duplicate

    def take(self, max_groups: int, *, current_version: int, max_staleness: int,
             wait_s: float = 5.0) -> tuple[str, list[Group | np.ndarray], int]:  # fmt: skip
        """(take id, groups — just the rewards for a filtered one — and how many were stale)."""
        req = pb.TakeRequest(
            max_groups=max_groups,
            current_version=current_version,
            max_staleness=max_staleness,
            wait_s=wait_s,
        )
        reply = self._call("Take", req, timeout=wait_s + 60)
        groups = [
            np.asarray(m.rewards, np.float32) if m.filtered else codec.msg_to_group(m)
            for m in reply.groups
        ]
        return reply.take_id, groups, reply.dropped_stale

    def ack(self, take_id: str) -> int:
        return self._call("Ack", pb.AckRequest(take_id=take_id), timeout=60).consumed
