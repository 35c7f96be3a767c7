"""The WeightStore service: versioned weights, committed only when whole and verified.

A version is made of ``num_parts`` parts (one per trainer host), received
from a gRPC ``Push`` stream (:mod:`rlax.core.param_server.weights.streams`)
or over the bulk lane (core/param_server/transport/transfer.py) and verified
as they arrive (:mod:`rlax.core.param_server.weights.parts`). When every part
of a version is complete, the version is committed atomically as the newest
one. Parts that carry shards (a multi-host push) are assembled into whole
tensors at commit, so a puller always receives one buffer of whole tensors,
in the model's order. Anything wrong — a cut-off stream, a gap, a duplicate
chunk, an unknown tensor, a wrong size or checksum, shards that do not tile
their tensor, a version that is not newer — fails the push with a gRPC status
and leaves the served version untouched.

Buffers are recycled: a superseded version's buffer goes back to a small
pool once no pull is reading it, so steady-state pushes write into memory
that is already mapped.

A version can also be served from a file holding its bytes (the weight
persister's save, :mod:`rlax.core.param_server.weights.persist`):
:meth:`WeightStore.serve_from_file` swaps the served version for the same
version read from the file, and the memory buffer goes back to the pool once
no pull reads it; :meth:`WeightStore.restore_file` serves a saved version
without reading it into memory. With :meth:`WeightStore.spool_to` (the
parameter-server role's setting, beside the persister's saves) a whole
single-part version is received into a file of its own from the start,
frame by frame through a chunk-sized scratch buffer, and served from it. The
bytes then live in the kernel's page cache, not in the process: the server
holds no version's buffer with a spool, one (the next push's) with only the
swap, instead of two (see docs/param_server.md § Memory and disk).
"""

from __future__ import annotations

import collections
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator

import grpc

from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.transport.transfer import checksum
from rlax.core.param_server.weights import streams
from rlax.core.param_server.weights.parts import (
    BAD,
    Part,
    PushRejected,
    assemble,
    check_header,
    is_whole,
    layout,
)
from rlax.core.param_server.weights.served import Pool, Served

__all__ = ["Served", "WeightStore"]


class WeightStore:
    """State and logic of the WeightStore service (the gRPC glue is in server.py)."""

    def __init__(
        self,
        *,
        max_version_bytes: int,
        chunk_bytes: int = 4 << 20,
        max_staged_bytes: int | None = None,
    ):
        self.max_version_bytes = max_version_bytes
        self.max_staged_bytes = max_staged_bytes or 2 * max_version_bytes
        self.chunk_bytes = chunk_bytes
        self._lock = threading.Condition()
        self._served: Served | None = None
        self._readable: list[Served] = []  # superseded, still read: not recycled yet
        self._pending: dict[int, dict[int, Part]] = {}  # complete parts of uncommitted versions
        self._num_parts: dict[int, int] = {}
        self._staged_bytes = 0  # buffers held by parts not yet committed
        self._staged_spool = 0  # of which in files of the spool (see spool_to)
        self.spool: str | None = None
        # (num_parts, part) -> layout, fixed by the first commit of that split: a
        # restarted server re-serves its saved weights as one part, and a
        # trainer on several hosts then pushes its own split of the same model.
        self._layouts: dict[tuple[int, int], tuple] = {}
        self._push_ids: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._pool = Pool()
        self.rejected = 0
        self.committed_at = 0.0

    # -- reading ------------------------------------------------------------

    @property
    def version(self) -> int:
        with self._lock:
            return self._served.number if self._served else -1

    @property
    def version_bytes(self) -> int:
        with self._lock:
            return self._served.header.nbytes if self._served else 0

    @property
    def memory_bytes(self) -> int:
        """Bytes of weight buffers this store holds: versions served from memory, the
        parts being received, and the pool's spares (what it adds to the process)."""
        with self._lock:
            held = {id(b): len(b) for b in self._pool.buffers()}
            for s in [self._served, *self._readable]:
                if s is not None:
                    held.update((id(b), len(b)) for b in s.owned)
            return sum(held.values()) + self._staged_bytes - self._staged_spool

    def open_pull(self, have_version: int) -> Served | None:
        """The newest version, held for reading until :meth:`close_pull`; None if current."""
        with self._lock:
            s = self._served
            if s is None or s.number == have_version:
                return None
            s.readers += 1
            return s

    def close_pull(self, served: Served) -> None:
        with self._lock:
            served.readers -= 1
            self._recycle(served)

    def messages_for(self, have_version: int) -> Iterator[bytes]:
        """The wire messages of the newest version (none if the caller has it), for gRPC Pull."""
        return streams.pull_messages(self, have_version)

    def wait_for(self, after_version: int, timeout_s: float) -> int:
        deadline = time.monotonic() + max(0.0, min(timeout_s, 3600.0))
        with self._lock:
            while self.version <= after_version:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._lock.wait(remaining):
                    break
            return self.version

    # -- writing: validation and staging ------------------------------------

    def _check_header(self, h: pb.PartHeader) -> None:
        check_header(
            h,
            served_version=self.version,
            num_parts=self._num_parts.get(h.version),
            max_version_bytes=self.max_version_bytes,
            known_layout=self._layouts.get((h.num_parts, h.part)),
        )

    def begin(self, header: pb.PartHeader) -> Part | pb.PushReply:
        """Validates a part's header and gives it a buffer; a PushReply if it is a duplicate."""
        with self._lock:
            if header.push_id and header.push_id in self._push_ids:
                return pb.PushReply(version=self._push_ids[header.push_id], duplicate=True)
            self._check_header(header)
            if self._staged_bytes + header.nbytes > self.max_staged_bytes:
                raise PushRejected(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{self._staged_bytes} bytes already staged; no room for {header.nbytes}",
                )
            self._staged_bytes += header.nbytes
            if self.spool is not None and is_whole(header):
                return self._spooled(header)
            return Part(header, self._pool.get(header.nbytes))

    def _spooled(self, header: pb.PartHeader) -> Part:
        """A part received into a new file in :attr:`spool` (through a chunk-sized scratch)."""
        assert self.spool is not None
        path = os.path.join(self.spool, f"v{header.version}-{uuid.uuid4().hex[:12]}.bin")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._staged_spool += header.nbytes
        return Part(header, bytearray(), fd=fd, path=path)

    def spool_to(self, directory: str | os.PathLike) -> None:
        """Receives whole single-part versions into files in ``directory`` from now on.

        Such a version is served from its file from the start: the process
        never holds its bytes (the weight persister links the file into its
        save). Files left there by an earlier process are deleted.
        """
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(directory):
            if name.endswith(".bin"):
                os.unlink(os.path.join(directory, name))
        with self._lock:
            self.spool = os.fspath(directory)

    def note_rejected(self) -> None:
        with self._lock:
            self.rejected += 1

    def abandon(self, part: Part, *, rejected: bool = True) -> None:
        """Releases a part that will never be committed (a failed or cut-off push)."""
        with self._lock:
            self._staged_bytes -= part.header.nbytes
            self._release(part)
            if rejected:
                self.rejected += 1

    def push(self, messages: Iterable[bytes]) -> pb.PushReply:
        """Consumes one gRPC Push stream of raw WeightChunk messages; commits or raises."""
        return streams.receive_push(self, messages)

    # -- writing: commit ----------------------------------------------------

    def commit(self, parts: list[Part]) -> pb.PushReply:
        """Adds complete parts to their version; commits it when every part is there.

        The caller still owns ``parts`` if this raises (and must :meth:`abandon` them).
        """
        with self._lock:
            number = parts[0].header.version
            for p in parts:
                if p.header.version != number:
                    raise PushRejected(BAD, "one push, one version")
                self._check_header(p.header)  # still newer than what was committed meanwhile
            pending = self._pending.setdefault(number, {})
            self._num_parts.setdefault(number, parts[0].header.num_parts)
            for p in parts:
                if p.header.part in pending:
                    raise PushRejected(BAD, f"version {number}: part {p.header.part} pushed twice")
            num_parts = self._num_parts[number]
            if len(pending) + len(parts) < num_parts:
                for p in parts:
                    pending[p.header.part] = p
                    self._remember(p)
                return pb.PushReply(version=number, committed=False)
            every = {**pending, **{p.header.part: p for p in parts}}
            served = self._serve(number, every)  # raises before any state changes
            for p in parts:
                self._remember(p)
            self._install(served, every)
            return pb.PushReply(version=number, committed=True)

    def _remember(self, p: Part) -> None:
        if p.header.push_id:
            self._push_ids[p.header.push_id] = p.header.version
            while len(self._push_ids) > 4096:
                self._push_ids.popitem(last=False)

    def _serve(self, number: int, parts: dict[int, Part]) -> Served:
        if len(parts) == 1 and is_whole(parts[0].header):
            p = parts[0]
            if p.fd is not None:  # spooled: served from its file
                return Served(number, p.header, None, list(p.segments), [], fd=p.fd, path=p.path)
            return Served(number, p.header, p.buffer, list(p.segments), [p.buffer])
        header, buffer = assemble(number, parts, self._pool.get)
        view = memoryview(buffer)
        segments = [
            (o, min(self.chunk_bytes, len(buffer) - o), checksum(view[o : o + self.chunk_bytes]))
            for o in range(0, len(buffer), self.chunk_bytes)
        ]
        for p in parts.values():  # assembled: the parts' own buffers are free now
            self._pool.put(p.buffer)
        return Served(number, header, buffer, segments, [buffer])

    def _install(self, served: Served, parts: dict[int, Part]) -> None:
        number = served.number
        for i, p in parts.items():
            self._layouts.setdefault((p.header.num_parts, i), layout(p.header))
        self._staged_bytes -= sum(p.header.nbytes for p in parts.values())
        self._staged_spool -= sum(p.header.nbytes for p in parts.values() if p.fd is not None)
        # Older pending versions can never commit now: release their parts.
        for v in [v for v in self._pending if v <= number]:
            for i, p in self._pending.pop(v).items():
                if v != number:
                    self._staged_bytes -= p.header.nbytes
                    self._release(p)
            self._num_parts.pop(v, None)
        self._num_parts.pop(number, None)
        self._replace(served)
        self.committed_at = time.time()
        self._lock.notify_all()

    def _release(self, part: Part) -> None:
        """A part that will not be served: its buffer to the pool, or its file deleted."""
        if part.fd is None:
            self._pool.put(part.buffer)
            return
        self._staged_spool -= part.header.nbytes
        os.close(part.fd)
        if part.path is not None:
            os.unlink(part.path)
        part.fd = None

    def _replace(self, served: Served) -> None:
        previous, self._served = self._served, served
        if previous is not None:
            previous.superseded = True
            self._readable.append(previous)
            self._recycle(previous)

    def _recycle(self, served: Served) -> None:
        if not served.superseded or served.readers:
            return
        for buf in served.owned:
            self._pool.put(buf)
        served.owned = []
        if served.fd is not None:
            os.close(served.fd)
            served.fd = None
            if served.path is not None:  # a spooled version's file (a save links it elsewhere)
                os.unlink(served.path)
        if served in self._readable:
            self._readable.remove(served)

    # -- serving from a file ------------------------------------------------

    def serve_from_file(self, number: int, path: str | os.PathLike) -> bool:
        """Serves version ``number`` from ``path`` (its exact bytes) instead of from memory.

        The memory buffer goes back to the pool once no pull reads it; pulls
        opened from now on read the file. False (nothing changes) unless
        ``number`` is the served version and is served from memory.
        """
        fd = os.open(path, os.O_RDONLY)
        with self._lock:
            s = self._served
            if s is None or s.number != number or s.buffer is None:
                os.close(fd)
                return False
            if os.fstat(fd).st_size != s.header.nbytes:
                os.close(fd)
                raise ValueError(f"{path}: not the {s.header.nbytes} bytes of v{number}")
            self._replace(Served(number, s.header, None, list(s.segments), [], fd=fd))
            return True

    def restore_file(
        self, header: pb.PartHeader, path: str | os.PathLike, segments: list[tuple[int, int, int]]
    ) -> pb.PushReply:
        """Serves a saved version from its file, checked like a push's header (no bytes read).

        ``segments`` are the file's (offset, length, xxh3_64) as pullers verify
        them. Raises PushRejected where a push of ``header`` would be refused
        (a newer version is already served, say).
        """
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size != header.nbytes:
                raise ValueError(f"{path}: not the {header.nbytes} bytes of its header")
            with self._lock:
                self._check_header(header)
                self._layouts.setdefault((1, 0), layout(header))
                self._replace(Served(header.version, header, None, list(segments), [], fd=fd))
                self.committed_at = time.time()
                self._lock.notify_all()
        except BaseException:
            os.close(fd)
            raise
        return pb.PushReply(version=header.version, committed=True)
