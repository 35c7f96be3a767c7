"""Each child process's devices, as environment variables set before it starts.

:func:`child_environments` turns :func:`~rlax.core.parallel.placement.place_roles`'
decision into what the supervisor adds to each child's environment (and the CPU
cores it pins the child to). It imports no JAX: the variables act when the child's
JAX starts its backend.

- **Parameter server**: ``JAX_PLATFORMS=cpu`` (and on GPU ``CUDA_VISIBLE_DEVICES=""``):
  it serves bytes and must never open an accelerator, even if something imports JAX.
- **GPU**: ``CUDA_VISIBLE_DEVICES`` lists the child's GPUs (the host's ids), so no two
  processes meet on a GPU; each process preallocates ``gpu_memory_fraction`` of its own
  GPUs (``XLA_PYTHON_CLIENT_MEM_FRACTION``, and its newer name ``XLA_CLIENT_MEM_FRACTION``:
  docs.jax.dev/en/latest/gpu_memory_allocation.html -- JAX preallocates 75% by default,
  and "running multiple JAX processes concurrently" is the first cause of OOM it names).
- **TPU**: a process that owns only some of the host's chips gets the variables of the
  JAX team's recipe for several processes on one TPU VM
  (gist.github.com/skye/f82ba45d2445bb19d53545538754f9a3, "non-communicating processes"):
  ``TPU_CHIPS_PER_PROCESS_BOUNDS`` (its block of chips, e.g. ``2,2,1``),
  ``TPU_PROCESS_BOUNDS=1,1,1`` (it is a slice of its own), ``TPU_VISIBLE_CHIPS`` (which
  chips; the recipe's older name is ``TPU_VISIBLE_DEVICES``, and ``TPU_VISIBLE_CHIPS`` is
  the one Google's PyTorch/XLA sets, ``torch_xla/_internal/tpu.py``), and a ``TPU_MESH_CONTROLLER_ADDRESS`` / ``_PORT`` unique per process; with
  ``ALLOW_MULTIPLE_LIBTPU_LOAD=1`` so a second process may load libtpu beside the first
  (libtpu otherwise refuses through its lock file, jax-ml/jax#10192, #13043). Our roles
  talk over gRPC, never through one XLA program, so the variables of *communicating*
  processes (``TPU_PROCESS_ADDRESSES``, ``TPU_PROCESS_PORT``, ``CLOUD_TPU_TASK_ID``,
  which join processes into one multi-process slice) are not set. A process that owns
  every chip of the host needs nothing.
- **CPU**: nothing in the environment; the cores of ``trainer_cores`` / ``worker_cores``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from rlax.core.parallel.inventory import Inventory, detect_inventory
from rlax.core.parallel.placement import Placement, RoleDevices, place_roles

__all__ = [
    "PARAM_SERVER",
    "TRAINER",
    "ChildDevices",
    "child_environments",
    "plan_children",
    "worker_name",
]

PARAM_SERVER, TRAINER = "param_server", "trainer"
TPU_BASE_PORT = 8476  # the recipe's first mesh-controller port


def worker_name(index: int) -> str:
    """The child name of worker ``index`` (``local_cluster``'s ``worker-{i}``)."""
    return f"worker-{index}"


@dataclasses.dataclass(frozen=True)
class ChildDevices:
    """What one child process is given.

    Attributes:
      env: variables to add to (and override in) the supervisor's environment.
      cores: CPU cores to pin the child to; None leaves it free.
    """

    env: Mapping[str, str]
    cores: tuple[int, ...] | None = None


def _gpu_env(inventory: Inventory, devices: Sequence[int], fraction: float) -> dict[str, str]:
    share = f"{fraction:g}"
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(str(inventory.ids[d]) for d in devices),
        "XLA_PYTHON_CLIENT_MEM_FRACTION": share,
        "XLA_CLIENT_MEM_FRACTION": share,
    }


def _tpu_env(inventory: Inventory, chips: Sequence[int], port: int, shared: bool) -> dict[str, str]:
    if len(chips) == inventory.count:
        return {}
    bounds = inventory.tpu.process_bounds[len(chips)]
    env = {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": ",".join(map(str, bounds)),
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_VISIBLE_CHIPS": ",".join(str(inventory.ids[c]) for c in chips),
        "TPU_MESH_CONTROLLER_ADDRESS": f"localhost:{port}",
        "TPU_MESH_CONTROLLER_PORT": str(port),
    }
    if shared:
        env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    return env


def plan_children(
    placement: Placement,
    *,
    workers: int,
    inventory: Inventory | None = None,
    tpu_port: int = TPU_BASE_PORT,
) -> tuple[RoleDevices, dict[str, ChildDevices]]:
    """The supervisor's one call: the host's inventory (detected unless given), each
    role's devices, and each child's environment and cores; BadSetting if impossible."""
    inventory = inventory if inventory is not None else detect_inventory()
    roles = place_roles(inventory, placement, workers=workers)
    return roles, child_environments(inventory, roles, tpu_port=tpu_port)


def child_environments(
    inventory: Inventory, roles: RoleDevices, *, tpu_port: int = TPU_BASE_PORT
) -> dict[str, ChildDevices]:
    """Each child's environment additions and cores, by child name.

    Args:
      inventory: the host's devices.
      roles: the placement's decision (:func:`~rlax.core.parallel.placement.place_roles`).
      tpu_port: the first TPU mesh-controller port; the trainer takes it and worker ``i``
        the ``i + 1``-th after it.

    Returns:
      ``{"param_server": ..., "trainer": ..., "worker-0": ..., ...}``: workers only in
      ``"processes"`` mode (the in-process modes run the sampler in the trainer's process).
    """
    server = {"JAX_PLATFORMS": "cpu"}
    if inventory.platform == "gpu":
        server["CUDA_VISIBLE_DEVICES"] = ""
    children = {PARAM_SERVER: ChildDevices(server)}
    trainer_devices = sorted(set(roles.trainer) | set(roles.sampler))
    if roles.mode == "processes":
        trainer_devices = list(roles.trainer)
    owners = [trainer_devices, *map(list, roles.workers)]
    shared = sum(bool(d) for d in owners) > 1
    for i, devices in enumerate(owners):
        env: dict[str, str] = {}
        if inventory.platform == "gpu":
            env = _gpu_env(inventory, devices, roles.gpu_memory_fraction)
        elif inventory.platform == "tpu":
            env = _tpu_env(inventory, devices, tpu_port + i, shared)
        name = TRAINER if i == 0 else worker_name(i - 1)
        cores = roles.trainer_cores if i == 0 else roles.worker_cores
        children[name] = ChildDevices(env, tuple(cores) if cores is not None else None)
    return children
