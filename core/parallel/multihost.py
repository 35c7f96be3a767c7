"""Several trainer hosts as one JAX program: start-up, each host's batch rows, each host's shards.

The trainer scales with JAX's own multi-controller runtime: one process per
host, all running the same program over one global mesh
(:func:`rlax.core.parallel.mesh.make_mesh` sees every process's devices once
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
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np

from rlax.core.constraints import AtLeast
from rlax.core.parallel.mesh import batch_spec

if TYPE_CHECKING:  # the settings are read where JAX is not started (the supervisor)
    import jax
    from jax.sharding import Mesh

ENV = {
    "coordinator": "RLAX_COORDINATOR",
    "num_processes": "RLAX_NUM_PROCESSES",
    "process_id": "RLAX_PROCESS_ID",
}


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
    num_processes: Annotated[int, AtLeast(1)] | None = None
    process_id: Annotated[int, AtLeast(0)] | None = None
    initialization_timeout_s: Annotated[int, AtLeast(1)] = 300

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
    import jax

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


def is_lead() -> bool:
    """True on process 0: the one that talks to the rollout queue, evaluates and writes files."""
    import jax

    return jax.process_index() == 0


def _padded(n: int) -> int:
    # A power of two: the collectives below compile once per size, not once per message.
    return max(1024, 1 << (n - 1).bit_length())


def broadcast_object(obj: Any) -> Any:
    """Process 0's ``obj`` (any picklable value), returned on every process.

    The others' ``obj`` is ignored. One broadcast of the size, one of the
    pickled bytes (padded to a power of two).
    """
    import jax

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
    import jax

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
    import jax

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
    import jax

    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def barrier(name: str) -> None:
    """Waits until every process has reached the barrier called ``name``."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def process_rows(mesh: Mesh, global_rows: int, process: int | None = None) -> np.ndarray:
    """Sorted indices of the global batch's rows that ``process`` (default: this one) feeds.

    They are the rows the batch sharding puts on that process's devices.
    """
    import jax
    from jax.sharding import NamedSharding

    process = jax.process_index() if process is None else process
    sharding = NamedSharding(mesh, batch_spec(1))
    rows: set[int] = set()
    for device, index in sharding.devices_indices_map((global_rows,)).items():
        # jaxlib's Device lives in a compiled module without stubs: mypy cannot see its fields.
        if device.process_index == process:  # type: ignore[attr-defined]
            rows.update(range(global_rows)[index[0]])
    return np.array(sorted(rows), dtype=np.int64)


def global_batch(mesh: Mesh, local: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
    """Global arrays split over (data, fsdp) from this process's rows (:func:`process_rows`).

    Every process passes the same number of rows of each array, in the order of its row
    indices. Arrays may differ in rows (a packed batch's packed rows and its padded rows):
    each is placed by its own count.
    """
    import jax
    from jax.sharding import NamedSharding

    out: dict[str, jax.Array] = {}
    for name, x in local.items():
        x = np.asarray(x)
        local_rows = len(x)
        global_rows = local_rows * jax.process_count()
        rows = process_rows(mesh, global_rows)
        if len(rows) != local_rows:
            raise ValueError(
                f"process {jax.process_index()} feeds rows {rows.tolist()[:8]}... "
                f"({len(rows)} rows) of a global {name!r} of {global_rows}, but got {local_rows}"
            )
        position = np.full(global_rows, -1)
        position[rows] = np.arange(local_rows)
        shape = (global_rows, *x.shape[1:])
        sharding = NamedSharding(mesh, batch_spec(x.ndim))
        pieces = [
            jax.device_put(x[position[np.arange(global_rows)[_row_slice(index)]]], device)
            for device, index in sharding.addressable_devices_indices_map(shape).items()
        ]
        out[name] = jax.make_array_from_single_device_arrays(shape, sharding, pieces)
    return out


def _row_slice(index: tuple[slice, ...] | None) -> slice:
    """The rows of one device's index; jax types the index Optional, a batch sharding has one."""
    if index is None:
        raise ValueError("global_batch: a device of the batch sharding holds no rows")
    return index[0]
