"""A weight store split by tensor over several servers (``rlax.ps_settings.weight_shards``).

The server at ``address`` holds the rollout queue and the first weight shard;
each address in ``weight_shards`` is a weight-only server holding one more.
A version's tensors, in the model's order (``index``), are cut into as many
contiguous runs as there are servers, balanced by bytes (:func:`split_points`),
and shard s stores run s as an ordinary version of its own. So:

* a push sends each server its run (a part of a multi-host push: the shards
  of that run's tensors in that part), and each server checks, commits and
  serves it exactly as a one-server store would;
* a pull asks every server, checks they serve the *same* version (a server
  that has not committed it yet is waited for; one that has moved on is
  pulled again), and receives each run straight into its place in one
  buffer, in parallel; the result is the one-server pull bit for bit, since
  the runs are contiguous in the model's order.

Every server's egress then carries 1/S of each version. A version is
complete for pullers only when every server has committed it, so a trainer
that dies between servers leaves the fleet on the previous version (the
next push repairs it).
"""

from __future__ import annotations

import concurrent.futures
import logging
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
import numpy as np

from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.transport import transfer

log = logging.getLogger("rlax.client")

_ATTEMPTS = 30  # rounds of "wait for the laggards" before a pull gives up (UNAVAILABLE)


def split_points(sizes: list[int], shards: int) -> list[int]:
    """Tensor indices where shards start: ``[0, b1, ..., b_{S-1}, len(sizes)]``.

    Cuts the running byte total as near as possible to ``k/S`` of the whole;
    every shard gets at least one tensor.
    """
    if not 1 <= shards <= len(sizes):
        raise ValueError(f"weight_shards: {shards} servers for a model of {len(sizes)} tensors")
    ends = np.cumsum(sizes)
    points = [0]
    for k in range(1, shards):
        cut = int(np.searchsorted(ends, ends[-1] * k / shards)) + 1
        points.append(min(max(cut, points[-1] + 1), len(sizes) - (shards - k)))
    return [*points, len(sizes)]


def whole_sizes(header: pb.PartHeader) -> list[int]:
    """Each whole tensor's bytes, by ``index``, from a part that names every tensor."""
    from rlax.core.param_server.weights.parts import DTYPE_BYTES

    sizes: dict[int, int] = {}
    for t in header.tensors:
        sizes[t.index] = int(np.prod(tuple(t.shape), dtype=np.int64)) * DTYPE_BYTES[t.dtype]
    if sorted(sizes) != list(range(len(sizes))):
        raise ValueError(
            "weight_shards: this part does not name every tensor of the model (a host with "
            "no block of some tensor), so it cannot be split by tensor; push_part(sizes=...)"
        )
    return [sizes[i] for i in range(len(sizes))]


def split_header(header: pb.PartHeader, points: list[int]) -> list[tuple[pb.PartHeader, int]]:
    """Per shard: the part's header for the tensors of its run, and the run's first byte."""
    indices = [t.index for t in header.tensors]
    if indices != sorted(indices):
        raise ValueError("weight_shards: a part's tensors must be in the model's order")
    out = []
    for s in range(len(points) - 1):
        sub = pb.PartHeader(version=header.version, part=header.part, num_parts=header.num_parts,
                            push_id=f"{header.push_id}/{s}" if header.push_id else "")  # fmt: skip
        mine = [t for t in header.tensors if points[s] <= t.index < points[s + 1]]
        base = mine[0].offset if mine else 0
        for t in mine:
            sub.tensors.add().CopyFrom(t)
            sub.tensors[-1].offset = t.offset - base
        sub.nbytes = sum(t.nbytes for t in mine)
        out.append((sub, base))
    return out


def _ranged(pieces: Iterator[tuple[int, memoryview]], lo: int, hi: int, carry: list):
    """The (offset, view) pieces covering bytes [lo, hi) of a part, re-based to ``lo``.

    ``carry`` holds the unused tail of a piece that crossed ``hi``, for the next run.
    """
    while True:
        if carry:
            offset, view = carry.pop()
        else:
            nxt = next(pieces, None)
            if nxt is None:
                return
            offset, view = nxt[0], memoryview(nxt[1]).cast("B")
        if offset >= hi:
            carry.append((offset, view))
            return
        take = view[: hi - offset]
        if len(take) < len(view):
            carry.append((hi, view[len(take) :]))
        yield offset - lo, take


class ShardedWeights:
    """The weight calls of a client whose settings name ``weight_shards``.

    ``clients[0]`` is the client of the main server (its queue calls are
    unchanged); the others are plain clients of the weight-only servers.
    """

    def __init__(self, primary: Any, addresses: Iterable[str], connect: Callable[[str], Any]):
        """``connect(address)``: a plain client of the weight-only server there."""
        self.clients = [primary] + [connect(a) for a in addresses]

    def close(self) -> None:
        for c in self.clients[1:]:
            c.close()

    def push_part(self, header: pb.PartHeader, pieces: Iterable,
                  sizes: list[int] | None = None) -> pb.PushReply:  # fmt: skip
        """Each server's run of the part, one server after the other (the pieces are read once)."""
        points = split_points(sizes or whole_sizes(header), len(self.clients))
        it = iter(pieces)
        carry: list[tuple[int, memoryview]] = []
        replies = []
        for client, (sub, base) in zip(self.clients, split_header(header, points)):
            run = _ranged(it, base, base + sub.nbytes, carry)
            replies.append(_push_run(client, sub, run))
            for _ in run:  # a server that refused early: the next run starts after this one
                pass
        return pb.PushReply(
            version=header.version,
            committed=all(r.committed or r.duplicate for r in replies) and not all(
                r.duplicate for r in replies),
            duplicate=all(r.duplicate for r in replies),
        )  # fmt: skip

    def pull(self, have_version: int) -> tuple[int, pb.PartHeader, memoryview] | None:
        """(version, header of the whole buffer, buffer), once every server serves one version."""
        for _ in range(_ATTEMPTS):
            versions = [c.stat().version for c in self.clients]
            target = max(versions)
            if target < 0 or target == have_version and min(versions) == target:
                return None
            if min(versions) != target:  # some server has not committed it yet
                for c, v in zip(self.clients, versions):
                    if v < target:
                        c.wait_for_version(v, 2.0)
                continue
            tickets = [c._call("OpenPull", pb.PullRequest(have_version=have_version), timeout=60)
                       for c in self.clients]  # fmt: skip
            if {t.header.version for t in tickets} == {target} and all(t.ticket for t in tickets):
                return self._receive(target, tickets)
            for c, t in zip(self.clients, tickets):  # one moved on meanwhile: release, ask again
                _discard(c, t)
        raise transfer.BulkError(grpc.StatusCode.UNAVAILABLE,
                                 "weight_shards: the servers did not agree on a version")  # fmt: skip

    def _receive(self, version: int, tickets: list[pb.PullTicket]):
        header = pb.PartHeader(version=version, part=0, num_parts=1)
        bases = []
        for t in tickets:
            bases.append(header.nbytes)
            for tensor in t.header.tensors:
                header.tensors.add().CopyFrom(tensor)
                header.tensors[-1].offset = tensor.offset + bases[-1]
            header.nbytes += t.header.nbytes
        buf = self.clients[0]._buffer(header.nbytes)
        view = memoryview(buf)

        def one(i: int) -> None:
            c, t, base = self.clients[i], tickets[i], bases[i]
            transfer.receive_into(c._host, t.port, t.ticket, view[base : base + t.header.nbytes],
                                  c.segments_of(t))  # fmt: skip

        with concurrent.futures.ThreadPoolExecutor(len(tickets)) as pool:
            list(pool.map(one, range(len(tickets))))
        return version, header, buf


def _push_run(client: Any, sub: pb.PartHeader, run: Iterator) -> pb.PushReply:
    """One server's run; a server that already holds this version (a retried push whose
    first try reached it) counts as a duplicate, so the rest still get theirs."""
    try:
        return client.push_one(sub, run)
    except grpc.RpcError as err:
        if (err.code() != grpc.StatusCode.FAILED_PRECONDITION
                or client.stat().version < sub.version):  # fmt: skip
            raise
        return pb.PushReply(version=sub.version, duplicate=True)


def _discard(client: Any, ticket: pb.PullTicket) -> None:
    """Gives back a pull ticket unused (the server's send fails and releases the version)."""
    if not ticket.ticket:
        return
    try:
        with socket.create_connection((client._host, ticket.port), timeout=5) as sock:
            sock.sendall(transfer.MAGIC + ticket.ticket)
    except OSError:
        pass  # the ticket expires on its own
