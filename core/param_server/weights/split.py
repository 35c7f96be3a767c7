"""The arithmetic of a weight store split by tensor over several servers (the split lane).

The lane that pushes and pulls a split store is transport/split_lane.py.

The server at ``address`` holds the rollout queue and the first weight shard;
each address in ``weight_lanes.split.shards`` is a weight-only server holding one more.
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

from collections.abc import Iterator

import numpy as np

from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.codec import copy_probe


def split_points(sizes: list[int], shards: int) -> list[int]:
    """Tensor indices where shards start: ``[0, b1, ..., b_{S-1}, len(sizes)]``.

    Cuts the running byte total as near as possible to ``k/S`` of the whole;
    every shard gets at least one tensor.
    """
    if not 1 <= shards <= len(sizes):
        raise ValueError(f"split store: {shards} servers for a model of {len(sizes)} tensors")
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
            "split store: this part does not name every tensor of the model (a host with "
            "no block of some tensor), so it cannot be split by tensor; push_part(sizes=...)"
        )
    return [sizes[i] for i in range(len(sizes))]


def split_header(header: pb.PartHeader, points: list[int]) -> list[tuple[pb.PartHeader, int]]:
    """Per shard: the part's header for the tensors of its run, and the run's first byte."""
    indices = [t.index for t in header.tensors]
    if indices != sorted(indices):
        raise ValueError("split store: a part's tensors must be in the model's order")
    out = []
    for s in range(len(points) - 1):
        sub = pb.PartHeader(
            version=header.version,
            part=header.part,
            num_parts=header.num_parts,
            push_id=f"{header.push_id}/{s}" if header.push_id else "",
        )
        copy_probe(header, sub)  # every server serves the version's probe
        mine = [t for t in header.tensors if points[s] <= t.index < points[s + 1]]
        base = mine[0].offset if mine else 0
        for t in mine:
            sub.tensors.add().CopyFrom(t)
            sub.tensors[-1].offset = t.offset - base
        sub.nbytes = sum(t.nbytes for t in mine)
        out.append((sub, base))
    return out


def ranged(pieces: Iterator[tuple[int, memoryview]], lo: int, hi: int, carry: list):
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
