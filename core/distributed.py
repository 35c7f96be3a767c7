"""Several trainer hosts as one JAX program: start-up, each host's batch rows, each host's shards.

The trainer scales with JAX's own multi-controller runtime: one process per
host, all running the same program over one global mesh
(:func:`rlax.core.mesh.make_mesh` sees every process's devices once
:func:`initialize` has run). Nothing here moves tensors between hosts; XLA
does, inside the compiled step.

- :func:`initialize` calls ``jax.distributed.initialize`` with the
  coordinator, process count and id from gin (``rlax.distributed``) or the
  environment (``RLAX_COORDINATOR``, ``RLAX_NUM_PROCESSES``,
  ``RLAX_PROCESS_ID``; on a Kubernetes indexed Job ``JOB_COMPLETION_INDEX``
  is the process id). It must run before anything touches a device.
- :func:`process_rows` says which rows of the global batch this process
  feeds; :func:`global_batch` builds the global arrays from them.
- :func:`local_shards` lists the parameter shards this process holds (one
  copy of each: replicas are skipped), and :func:`push_local_shards` pushes
  them as this host's part of a version; the parameter server assembles the
  parts, and workers pull whole tensors.
- The trainer's loop is one controller (process 0, :func:`is_lead`) with
  followers: :func:`run_on_lead` runs a piece of host code (taking a batch
  from the parameter server) on process 0 and gives its result, or its
  exception, to every process; :func:`broadcast_object` and
  :func:`allgather_objects` move small Python values (a batch, the metrics,
  a preemption flag) between processes; :func:`gather_tree` makes whole numpy
  arrays of a sharded tree on every process (evaluation, export). Each is a
  no-op with one process, and every process must call it at the same point.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, NamedSharding

from rlax.core.mesh import batch_spec
from rlax.core.weight_sync import leaf_name

ENV = {
    "coordinator": "RLAX_COORDINATOR",
    "num_processes": "RLAX_NUM_PROCESSES",
    "process_id": "RLAX_PROCESS_ID",
}
WIRE_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """Where the trainer's processes meet. Unset fields come from the environment.

    In gin (``rlax.distributed``)::

        rlax.distributed.coordinator = "trainer-0.trainer:8476"
        rlax.distributed.num_processes = 4

    Attributes:
      coordinator: ``host:port`` of process 0's coordination service.
      num_processes: how many trainer processes (hosts); 1 or None: no-op.
      process_id: this process's index in ``[0, num_processes)``.
      initialization_timeout_s: how long to wait for every process to join.
    """

    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    initialization_timeout_s: int = 300

    def resolved(self, env: Mapping[str, str] | None = None) -> DistributedSettings:
        env = os.environ if env is None else env
        values = {}
        for field, var in ENV.items():
            value = getattr(self, field)
            if value is None and env.get(var):
                value = env[var] if field == "coordinator" else int(env[var])
            values[field] = value
        if values["process_id"] is None and env.get("JOB_COMPLETION_INDEX"):
            values["process_id"] = int(env["JOB_COMPLETION_INDEX"])
        return dataclasses.replace(self, **values)


def initialize(settings: DistributedSettings | None = None) -> bool:
    """Joins this process to the others; returns False when there is just one.

    Raises:
      ValueError: several processes are asked for but the coordinator or this
        process's id is missing or out of range.
    """
    s = (settings or DistributedSettings()).resolved()
    if s.num_processes in (None, 1):
        return False
    if jax.distributed.is_initialized():  # the CLI did it before gin built anything
        if jax.process_count() != s.num_processes:
            raise ValueError(
                f"distributed: already initialized with {jax.process_count()} processes, "
                f"asked for {s.num_processes}"
            )
        return True
    if not s.coordinator or s.process_id is None or not 0 <= s.process_id < s.num_processes:
        raise ValueError(
            f"distributed: {s.num_processes} processes need a coordinator and a process id "
            f"in [0, {s.num_processes}); got coordinator={s.coordinator!r}, "
            f"process_id={s.process_id!r} (set them in gin or {', '.join(ENV.values())})"
        )
    jax.distributed.initialize(
        coordinator_address=s.coordinator,
        num_processes=s.num_processes,
        process_id=s.process_id,
        initialization_timeout=s.initialization_timeout_s,
    )
    return True


# -------------------------------------------------------------------------
# One controller: process 0 decides, every process gets its decision
# -------------------------------------------------------------------------


def is_lead() -> bool:
    """True on process 0: the one that talks to the rollout queue, evaluates and writes files."""
    return jax.process_index() == 0


def _padded(n: int) -> int:
    # A power of two: the collectives below compile once per size, not once per message.
    return max(1024, 1 << (n - 1).bit_length())


def broadcast_object(obj: Any) -> Any:
    """Process 0's ``obj`` (any picklable value), returned on every process.

    The others' ``obj`` is ignored. One broadcast of the size, one of the
    pickled bytes (padded to a power of two).
    """
    if jax.process_count() == 1:
        return obj
    from jax.experimental import multihost_utils

    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if is_lead() else b""
    size = int(multihost_utils.broadcast_one_to_all(np.array(len(data), np.int64)))
    buffer = np.zeros(_padded(size), np.uint8)
    buffer[: len(data)] = np.frombuffer(data, np.uint8)
    buffer = multihost_utils.broadcast_one_to_all(buffer)
    return obj if is_lead() else pickle.loads(buffer[:size].tobytes())


def allgather_objects(obj: Any) -> list[Any]:
    """Every process's ``obj`` (small, picklable), in process order, on every process."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils

    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sizes = multihost_utils.process_allgather(np.array(len(data), np.int64))
    buffer = np.zeros(_padded(int(sizes.max())), np.uint8)
    buffer[: len(data)] = np.frombuffer(data, np.uint8)
    buffers = multihost_utils.process_allgather(buffer)
    return [pickle.loads(b[:n].tobytes()) for b, n in zip(buffers, sizes.tolist())]


class LeadFailed(RuntimeError):
    """Process 0 failed in code only it runs; the other processes raise this instead."""


def run_on_lead(fn: Callable[[], Any]) -> Any:
    """``fn()`` run on process 0 only; its result — or its exception — on every process.

    An exception that is an :class:`~rlax.core.errors.Preempted` (a safe
    point after a notice) is raised as itself everywhere, so every process
    stops at the same point; any other is raised on process 0 and as
    :class:`LeadFailed` (naming it) on the others.
    """
    if jax.process_count() == 1:
        return fn()
    from rlax.core.errors import Preempted

    if not is_lead():
        kind, value = broadcast_object(None)
        if kind == "raise":
            raise value
        return value
    try:
        result = fn()
    except Preempted as err:
        broadcast_object(("raise", err))
        raise
    except Exception as err:
        broadcast_object(("raise", LeadFailed(f"trainer process 0: {type(err).__name__}: {err}")))
        raise
    broadcast_object(("ok", result))
    return result


def gather_tree(tree: Any) -> Any:
    """``tree`` with every array whole, as numpy, on every process (a collective).

    With one process every array is whole already: ``tree`` is returned as it is.
    """
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def barrier(name: str) -> None:
    """Waits until every process has reached the barrier called ``name``."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


# -------------------------------------------------------------------------
# The batch: each process feeds its own rows
# -------------------------------------------------------------------------


def process_rows(mesh: Mesh, global_rows: int, process: int | None = None) -> np.ndarray:
    """Sorted indices of the global batch's rows that ``process`` (default: this one) feeds.

    They are the rows the batch sharding puts on that process's devices.
    """
    process = jax.process_index() if process is None else process
    sharding = NamedSharding(mesh, batch_spec(1))
    rows: set[int] = set()
    for device, index in sharding.devices_indices_map((global_rows,)).items():
        if device.process_index == process:
            rows.update(range(global_rows)[index[0]])
    return np.array(sorted(rows), dtype=np.int64)


def global_batch(mesh: Mesh, local: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
    """Global arrays split over (data, fsdp) from this process's rows (:func:`process_rows`).

    Every process passes the same number of rows, in the order of its row indices.
    """
    local_rows = len(next(iter(local.values())))
    global_rows = local_rows * jax.process_count()
    rows = process_rows(mesh, global_rows)
    if len(rows) != local_rows:
        raise ValueError(
            f"process {jax.process_index()} feeds rows {rows.tolist()[:8]}... "
            f"({len(rows)} rows) of a global batch of {global_rows}, but got {local_rows}"
        )
    position = np.full(global_rows, -1)
    position[rows] = np.arange(local_rows)
    out = {}
    for name, x in local.items():
        x = np.asarray(x)
        shape = (global_rows, *x.shape[1:])
        sharding = NamedSharding(mesh, batch_spec(x.ndim))
        pieces = [
            jax.device_put(x[position[np.arange(global_rows)[index[0]]]], device)
            for device, index in sharding.addressable_devices_indices_map(shape).items()
        ]
        out[name] = jax.make_array_from_single_device_arrays(shape, sharding, pieces)
    return out


# -------------------------------------------------------------------------
# Publishing: each process pushes the shards it holds
# -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LocalShard:
    """One block of one tensor, held by this process.

    Attributes:
      name: the tensor's name on the wire (:func:`rlax.core.weight_sync.leaf_name`,
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
    client: Any, tree: Any, version: int, *, wire_dtype: str = "float32", chunk_bytes: int = 4 << 20
) -> Any:
    """Pushes this process's shards of ``tree`` as part ``process_index`` of ``version``.

    Every process calls it (in parallel); the version is complete, and served
    as whole tensors, once all ``process_count`` parts have arrived. Needs the
    parameter-server client's ``push_part(header, pieces)``.
    """
    from rlax.core.weight_sync import chunks

    shards = local_shards(tree, wire_dtype)
    header = part_header(
        shards,
        version,
        part=jax.process_index(),
        num_parts=jax.process_count(),
        wire_dtype=wire_dtype,
    )
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
