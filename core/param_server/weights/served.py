"""A committed version as pullers see it, and the pool of spare buffers versions land in.

Used by the weight store (:mod:`rlax.core.param_server.weights.store`).
"""

from __future__ import annotations

import collections
import dataclasses
import os

from rlax.core.param_server import rlax_pb2 as pb


@dataclasses.dataclass(eq=False)  # compared by identity: the store tracks which it holds
class Served:
    """A committed version as pullers see it: one buffer of whole tensors, or a file of them."""

    number: int
    header: pb.PartHeader  # part 0 of 1
    buffer: bytearray | None  # None: the bytes are read from ``fd``
    segments: list[tuple[int, int, int]]
    owned: list[bytearray]  # buffers to recycle once superseded and unread
    readers: int = 0
    superseded: bool = False
    fd: int | None = None  # an open file of the bytes, closed once superseded and unread
    path: str | None = None  # a spooled version's file, deleted when ``fd`` is closed

    def read(self, offset: int, length: int) -> memoryview:
        """``length`` bytes at ``offset``: a view of the buffer, or read from the file."""
        if self.buffer is not None:
            return memoryview(self.buffer)[offset : offset + length]
        assert self.fd is not None
        out = bytearray(length)
        view, got = memoryview(out), 0
        while got < length:
            n = os.preadv(self.fd, [view[got:]], offset + got)
            if not n:
                raise OSError(f"weights v{self.number}: file ended at {offset + got}")
            got += n
        return view


class Pool:
    """Spare buffers, so a new version lands in warm memory.

    Holds at most twice the largest buffer ever asked for: enough for the next
    version of a single-part model, or the parts plus the assembled buffer of a
    multi-host one.
    """

    def __init__(self):
        self._free: collections.deque[bytearray] = collections.deque()
        self._largest = 0

    def get(self, nbytes: int) -> bytearray:
        self._largest = max(self._largest, nbytes)
        for buf in self._free:
            if len(buf) == nbytes:
                self._free.remove(buf)
                return buf
        return bytearray(nbytes)

    def buffers(self) -> list[bytearray]:
        return list(self._free)

    def put(self, buf: bytearray) -> None:
        self._free.append(buf)
        while sum(len(b) for b in self._free) > 2 * self._largest:
            self._free.popleft()
