"""Which devices each role gets: one setting, checked against the host before anything starts.

Three modes (:class:`Placement`'s ``mode``):

- ``"processes"``: the trainer and each worker are their own processes, each seeing
  only its own devices (verl's resource pools; the usual way on GPU). The sampler's
  devices are divided evenly among the workers.
- ``"one_process"``: one process owns every device used; the trainer runs on one
  sub-mesh and the sampler on another (Tunix's role-to-mesh map; the usual way on TPU,
  where only one process can open a chip).
- ``"colocated"``: the trainer and the sampler share every device, time-sliced.

The default (``mode="auto"``), by the number of accelerators ``n``:

- no accelerator (CPU): ``"processes"``, pinned to CPU cores as before;
- ``n == 1``: ``"colocated"`` (one device cannot be split);
- ``n >= 2``: the trainer takes the first ``ceil(n / 2)`` devices and the sampler the
  rest; ``"processes"`` when every process would own a device count it may own (always on
  GPU; on TPU a count of the generation's ``process_bounds``) and the sampler's devices
  divide evenly among the workers, else ``"one_process"``.

Refused, with :class:`~rlax.core.errors.BadSetting` naming the setting and what is
possible: a device the host does not have, a device given twice, two processes on one
device (only ``"colocated"`` shares), sampler devices that do not divide among the
workers, and a TPU chip count a process may not own (v5e/v6e: 1, 4 or 8, never 2 --
:data:`~rlax.core.parallel.inventory.TPU_GENERATIONS` cites Google's pages). A process's
TPU chips must also be an aligned run (``k`` chips starting at a multiple of ``k``): that
is the block ``TPU_CHIPS_PER_PROCESS_BOUNDS`` describes (chips ``0,1`` and ``2,3`` are the
two-chip blocks of the JAX team's recipe).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Annotated, Literal

from rlax.core.constraints import AtLeast, OneOf, Range, check_fields
from rlax.core.errors import BadSetting
from rlax.core.parallel.inventory import Inventory

__all__ = ["MODES", "Placement", "RoleDevices", "place_roles"]

Mode = Literal["processes", "one_process", "colocated"]
MODES: tuple[str, ...] = ("auto", "processes", "one_process", "colocated")

#: A role's devices: a count (that many, in order), explicit positions, or None (the rule's).
Devices = Annotated[int, AtLeast(1)] | tuple[Annotated[int, AtLeast(0)], ...] | None


@dataclasses.dataclass(frozen=True)
class Placement:
    """Which devices each role gets (a field of the run specification).

    Device numbers are positions in the host's accelerators (``0..n-1``, the order of
    :attr:`Inventory.ids`).

    Attributes:
      mode: ``"auto"`` (the module's rule), ``"processes"``, ``"one_process"`` or
        ``"colocated"``.
      trainer: the trainer's devices: a count or positions; None: the rule's.
      sampler: the sampler's devices (all workers' together in ``"processes"``); a count
        takes that many of the devices the trainer does not use.
      trainer_cores / worker_cores: CPU cores to pin the trainer / every worker to
        (a CPU host's placement, as ``local_cluster`` always did); None leaves them free.
      gpu_memory_fraction: the share of each GPU a process preallocates (JAX's
        ``XLA_PYTHON_CLIENT_MEM_FRACTION``; JAX's own default is 0.75).
    """

    mode: Annotated[str, OneOf(*MODES)] = "auto"
    trainer: Devices = None
    sampler: Devices = None
    trainer_cores: tuple[Annotated[int, AtLeast(0)], ...] | None = None
    worker_cores: tuple[Annotated[int, AtLeast(0)], ...] | None = None
    gpu_memory_fraction: Annotated[float, Range(gt=0, le=1)] = 0.9

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("trainer", "sampler"):
            value = getattr(self, name)
            if isinstance(value, int) and value < 1:
                raise BadSetting(name, f"a device count must be >= 1, got {value}")


@dataclasses.dataclass(frozen=True)
class RoleDevices:
    """What :func:`place_roles` decided: each role's device positions.

    Attributes:
      mode: the mode in force (``"auto"`` resolved).
      trainer: the trainer's devices.
      sampler: the sampler's devices (in ``"colocated"`` the trainer's).
      workers: ``"processes"``: each worker process's devices (the sampler's, divided);
        otherwise empty (the sampler runs in the trainer's process).
      trainer_cores / worker_cores: CPU pinning, as given.
      gpu_memory_fraction: as given.
    """

    mode: Mode
    trainer: tuple[int, ...]
    sampler: tuple[int, ...]
    workers: tuple[tuple[int, ...], ...] = ()
    trainer_cores: tuple[int, ...] | None = None
    worker_cores: tuple[int, ...] | None = None
    gpu_memory_fraction: float = 0.9

    def in_process(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The trainer's and the sampler's devices as the one process of ``"one_process"`` /
        ``"colocated"`` numbers them: positions in its visible devices (the sorted union of
        both roles', which is all its environment lets it see), i.e. in ``jax.devices()``."""
        visible = sorted(set(self.trainer) | set(self.sampler))
        where = {d: i for i, d in enumerate(visible)}
        return tuple(where[d] for d in self.trainer), tuple(where[d] for d in self.sampler)


def _ownable(inventory: Inventory, count: int) -> bool:
    """Whether one process may own ``count`` of ``inventory``'s devices."""
    return inventory.platform != "tpu" or count in inventory.tpu.process_bounds


def _possible_counts(inventory: Inventory) -> str:
    counts = [c for c in inventory.tpu.process_bounds if c <= inventory.count]
    return (
        f"{', '.join(map(str, counts[:-1]))} or {counts[-1]}" if len(counts) > 1 else str(counts[0])
    )


def _check_ownable(inventory: Inventory, setting: str, devices: Sequence[int], who: str) -> None:
    """BadSetting unless one process may own ``devices`` (a TPU generation's counts, aligned)."""
    if inventory.platform != "tpu":
        return
    k = len(devices)
    if k not in inventory.tpu.process_bounds:
        raise BadSetting(
            setting,
            f"{who} would own {k} TPU {inventory.kind} chips; a process may own "
            f"{_possible_counts(inventory)} chips of a {inventory.count}-chip host",
        )
    if list(devices) != list(range(devices[0], devices[0] + k)) or devices[0] % k:
        blocks = ", ".join(f"{s}-{s + k - 1}" for s in range(0, inventory.count, k))
        raise BadSetting(
            setting,
            f"{who}'s {k} TPU chips {list(devices)} are not one block; blocks of {k}: {blocks}",
        )


def _resolve(
    inventory: Inventory, setting: str, value: Devices, free: Sequence[int], default: Sequence[int]
) -> tuple[int, ...]:
    """A role's positions from a count (the first of ``free``), positions, or None (``default``)."""
    n = inventory.count
    if value is None:
        return tuple(default)
    if isinstance(value, int):
        if value > len(free):
            raise BadSetting(
                setting, f"asks for {value} devices; {len(free)} of the host's {n} are free for it"
            )
        return tuple(free[:value])
    if not value:
        raise BadSetting(setting, "needs at least one device, got none")
    if bad := [d for d in value if not 0 <= d < n]:
        raise BadSetting(
            setting,
            f"device {bad[0]} does not exist: the host has {n} {inventory.platform} devices (0..{n - 1})",
        )
    if len(set(value)) != len(value):
        raise BadSetting(setting, f"names a device twice: {list(value)}")
    return tuple(value)


def _split(
    inventory: Inventory, placement: Placement, mode: str
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The trainer's and the sampler's devices in ``mode``."""
    everything = tuple(range(inventory.count))
    if mode == "colocated":
        trainer = _resolve(inventory, "trainer", placement.trainer, everything, everything)
        sampler = _resolve(inventory, "sampler", placement.sampler, everything, trainer)
        if sampler != trainer:
            raise BadSetting(
                "sampler",
                f"colocated roles share their devices: the trainer has {list(trainer)}, the sampler {list(sampler)}",
            )
        return trainer, sampler
    half = math.ceil(inventory.count / 2)
    trainer = _resolve(inventory, "trainer", placement.trainer, everything, everything[:half])
    rest = tuple(d for d in everything if d not in trainer)
    sampler = _resolve(inventory, "sampler", placement.sampler, rest, rest)
    if shared := sorted(set(trainer) & set(sampler)):
        raise BadSetting(
            "sampler",
            f"device {shared[0]} is the trainer's too; only mode='colocated' shares devices "
            f"(in '{mode}' give the trainer and the sampler different devices)",
        )
    if not sampler:
        raise BadSetting(
            "trainer",
            f"takes all {inventory.count} devices and leaves the sampler none; give it fewer, or mode='colocated'",
        )
    return trainer, sampler


def _divide(sampler: tuple[int, ...], workers: int) -> tuple[tuple[int, ...], ...] | None:
    """The sampler's devices in ``workers`` equal runs, or None if they do not divide."""
    if workers < 1 or len(sampler) % workers:
        return None
    k = len(sampler) // workers
    return tuple(sampler[i * k : (i + 1) * k] for i in range(workers))


def _auto_mode(inventory: Inventory, placement: Placement, workers: int) -> str:
    if inventory.platform == "cpu":
        return "processes"
    if inventory.count == 1:
        return "colocated"
    trainer, sampler = _split(inventory, placement, "processes")
    parts = _divide(sampler, workers) if workers else ()
    if parts is None or not _ownable(inventory, len(trainer)):
        return "one_process"
    return "processes" if all(_ownable(inventory, len(p)) for p in parts) else "one_process"


def place_roles(inventory: Inventory, placement: Placement, *, workers: int) -> RoleDevices:
    """Each role's devices on ``inventory`` by ``placement``, or BadSetting if impossible.

    Args:
      inventory: the host's devices (:func:`~rlax.core.parallel.inventory.detect_inventory`).
      placement: the setting.
      workers: worker processes the run starts (``"processes"`` divides the sampler's
        devices among them; the in-process modes start none).

    Returns:
      The :class:`RoleDevices`; pure: the same arguments give the same answer.
    """
    mode = _auto_mode(inventory, placement, workers) if placement.mode == "auto" else placement.mode
    _check_cores(inventory, placement)
    if inventory.platform == "cpu":
        for name in ("trainer", "sampler"):
            if getattr(placement, name) is not None:
                raise BadSetting(
                    name,
                    "this host has no accelerator (CPU only): leave it unset, "
                    "or pin CPU cores with trainer_cores / worker_cores",
                )
        no_devices = ((),) * workers if mode == "processes" else ()
        return _decided(placement, mode, (), (), no_devices)
    trainer, sampler = _split(inventory, placement, mode)
    if mode != "processes":
        one = sorted(set(trainer) | set(sampler))
        _check_ownable(inventory, "mode", one, f"the one '{mode}' process")
        return _decided(placement, mode, trainer, sampler, ())
    parts = _divide(sampler, workers) if workers else ()
    if parts is None:
        fits = [w for w in range(1, len(sampler) + 1) if len(sampler) % w == 0]
        raise BadSetting(
            "sampler",
            f"{len(sampler)} sampler devices do not divide among {workers} worker processes "
            f"(possible: {', '.join(map(str, fits))} workers, or mode='one_process')",
        )
    _check_ownable(inventory, "trainer", trainer, "the trainer process")
    for i, part in enumerate(parts):
        _check_ownable(inventory, "sampler", part, f"worker {i}")
    return _decided(placement, mode, trainer, sampler, parts)


def _decided(
    placement: Placement,
    mode: str,
    trainer: tuple[int, ...],
    sampler: tuple[int, ...],
    workers: tuple[tuple[int, ...], ...],
) -> RoleDevices:
    return RoleDevices(
        mode,  # type: ignore[arg-type]  # one of MODES less "auto", resolved above
        trainer,
        sampler,
        workers,
        placement.trainer_cores,
        placement.worker_cores,
        placement.gpu_memory_fraction,
    )


def _check_cores(inventory: Inventory, placement: Placement) -> None:
    """BadSetting for a pinned core this machine does not let the run use."""
    if not inventory.cpu_cores:
        return
    for name in ("trainer_cores", "worker_cores"):
        cores = getattr(placement, name) or ()
        if missing := [c for c in cores if c not in inventory.cpu_cores]:
            have = inventory.cpu_cores
            raise BadSetting(
                name, f"core {missing[0]} is not one this run may use (cores {have[0]}..{have[-1]})"
            )
