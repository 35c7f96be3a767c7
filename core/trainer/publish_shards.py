"""Publishing from several trainer hosts: each pushes the shards it holds, the server assembles.

:func:`local_shards` lists the parameter shards this process holds (one copy
of each: replicas are skipped), and :func:`push_local_shards` pushes them as
this host's part of a version; the parameter server assembles the parts
(:func:`assemble` is the same rule in numpy), and workers pull whole tensors.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import jax
import numpy as np

from rlax.core.wire import WIRE_DTYPES, leaf_name


@dataclasses.dataclass(frozen=True)
class LocalShard:
    """One block of one tensor, held by this process.

    Attributes:
      name: the tensor's name on the wire (:func:`rlax.core.wire.leaf_name`,
        ``"blocks/0/attn/q/kernel/value"``), as in a whole-model push.
      index: the tensor's position in the model's flattened tree.
      shape: the whole tensor's shape.
      start: the block's first index per dimension.
      data: the block, in the wire dtype.
    """

    name: str
    index: int
    shape: tuple[int, ...]
    start: tuple[int, ...]
    data: np.ndarray


def _start(index: tuple, ndim: int) -> tuple[int, ...]:
    start = tuple(s.start or 0 for s in index)
    return start + (0,) * (ndim - len(start))  # an index tuple may be shorter than the rank


def local_shards(tree: Any, wire_dtype: str = "float32") -> list[LocalShard]:
    """The blocks of ``tree``'s arrays that this process publishes: each block once, globally.

    A block held by several processes (a replica across ``data``) is published
    by one of them, chosen round-robin over the blocks, so every process sends
    a share of the model and the lists of all processes tile every tensor
    exactly once.
    """
    wire = WIRE_DTYPES[wire_dtype]
    me = jax.process_index()
    out = []
    for i, (path, x) in enumerate(jax.tree_util.tree_flatten_with_path(tree)[0]):
        holders: dict[tuple[int, ...], set[int]] = {}
        for device, index in x.sharding.devices_indices_map(x.shape).items():
            holders.setdefault(_start(index, x.ndim), set()).add(device.process_index)
        local = {_start(s.index, x.ndim): s for s in x.addressable_shards}
        for k, start in enumerate(sorted(holders)):
            procs = sorted(holders[start])
            if procs[(i + k) % len(procs)] == me:
                data = np.asarray(local[start].data).astype(wire)
                # The wire names of a whole-model push (WirePlan), so workers see one layout.
                out.append(LocalShard(leaf_name(path), i, tuple(x.shape), start, data))
    return out


def part_header(
    shards: list[LocalShard], version: int, *, part: int, num_parts: int, wire_dtype: str
) -> Any:
    """The ``PartHeader`` of one host's part: its shards, back to back in one buffer."""
    from rlax.core.param_server import rlax_pb2 as pb

    header = pb.PartHeader(
        version=version, part=part, num_parts=num_parts, push_id=uuid.uuid4().hex
    )
    offset = 0
    for s in shards:
        header.tensors.add(
            name=s.name,
            dtype=wire_dtype,
            shape=s.shape,
            slice_start=s.start,
            slice_shape=s.data.shape,
            offset=offset,
            nbytes=s.data.nbytes,
            index=s.index,
        )
        offset += s.data.nbytes
    header.nbytes = offset
    return header


def push_local_shards(
    client: Any,
    tree: Any,
    version: int,
    *,
    wire_dtype: str = "float32",
    chunk_bytes: int = 4 << 20,
    probe: Any = None,
) -> Any:
    """Pushes this process's shards of ``tree`` as part ``process_index`` of ``version``
    (each part carries the version's ``probe``; None: none).

    Every process calls it (in parallel); the version is complete, and served
    as whole tensors, once all ``process_count`` parts have arrived. Needs the
    parameter-server client's ``push_part(header, pieces)``.
    """
    from rlax.core.param_server.codec import set_probe
    from rlax.core.wire import chunks

    shards = local_shards(tree, wire_dtype)
    header = part_header(
        shards,
        version,
        part=jax.process_index(),
        num_parts=jax.process_count(),
        wire_dtype=wire_dtype,
    )
    set_probe(header, probe)
    pieces = [s.data.reshape(-1).view(np.uint8) for s in shards]
    buffer = np.concatenate(pieces) if pieces else np.zeros(0, np.uint8)  # a host with no blocks
    return client.push_part(header, chunks(buffer, chunk_bytes))


def assemble(shards: list[LocalShard]) -> dict[str, np.ndarray]:
    """Whole tensors from the shards of every process (what a pull returns), by name."""
    out: dict[str, np.ndarray] = {}
    for s in shards:
        whole = out.setdefault(s.name, np.zeros(s.shape, s.data.dtype))
        whole[tuple(slice(a, a + n) for a, n in zip(s.start, s.data.shape))] = s.data
    return out
