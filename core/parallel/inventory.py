"""What accelerators this host has, learnt without opening them.

The supervisor (``rlax run --role all``) must know the host's devices to give
each role its own, and it must not initialise a JAX backend to find out: a
backend costs 1.5-2 s, preallocates GPU memory, and on a TPU VM the process
that opens a chip holds it, so no child could. :func:`detect_inventory`
therefore reads what the operating system already says, in this order:

1. ``JAX_PLATFORMS=cpu`` in the environment: the user asked for CPU.
2. TPU: the PCI devices of Google's vendor id ``0x1ae0`` under
   ``/sys/bus/pci/devices`` whose device id names a TPU generation (the ids JAX
   itself uses to detect a TPU without opening it, ``jax/_src/hardware_utils.py``).
   Reading sysfs opens no chip.
3. GPU: ``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits``
   (NVML, no CUDA context), honouring ``CUDA_VISIBLE_DEVICES`` if it is set.
4. Otherwise CPU: the cores this process may run on (``os.sched_getaffinity``).

A short subprocess that imports JAX would also work; it is not used because it
costs the backend's start-up (seconds) and, on TPU, takes the chips while it
lives. A deployment that knows better gives an explicit :class:`Inventory`
(a frozen setting of the run specification) and nothing is detected.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

__all__ = [
    "PLATFORMS",
    "TPU_GENERATIONS",
    "Inventory",
    "TpuGeneration",
    "detect_inventory",
]

Platform = Literal["cpu", "gpu", "tpu"]
PLATFORMS: tuple[Platform, ...] = ("cpu", "gpu", "tpu")


@dataclasses.dataclass(frozen=True)
class TpuGeneration:
    """What one TPU generation's host looks like and which chips a process may own.

    Attributes:
      pci_id: the PCI device id (vendor ``0x1ae0``).
      chips_per_host: chips on a full host.
      hbm_bytes: memory per chip.
      process_bounds: chip count -> the ``x,y,z`` block of chips a process owning
        that many chips holds (``TPU_CHIPS_PER_PROCESS_BOUNDS``); a count not
        listed may not be owned by one process.
    """

    pci_id: str
    chips_per_host: int
    hbm_bytes: int
    process_bounds: Mapping[int, tuple[int, int, int]]


_GB = 10**9
# Host shapes and per-process blocks:
# - v4 / v5p hosts hold 4 chips as a 2x2x1 block; a process may hold 1 (1,1,1), 2 (1,2,1) or
#   all 4 (2,2,1) -- "2x 2 chips per process" is in the JAX team's recipe for running
#   several processes on one TPU VM (gist.github.com/skye/f82ba45d2445bb19d53545538754f9a3).
#   Google documents 2-chip blocks for v4 only, so v5p allows 1 or 4.
# - v5e / v6e hosts hold 8 chips as 2x4; the slice shapes Google supports on one host are
#   1x1, 2x2 and 2x4 (1, 4, 8 chips: cloud.google.com/tpu/docs/v6e "Supported
#   configurations", cloud.google.com/tpu/docs/v5e), never 2.
# HBM per chip: v4 32 GB, v5p 95 GB, v5e 16 GB, v6e 32 GB (the same pages' specifications).
TPU_GENERATIONS: Mapping[str, TpuGeneration] = {
    "v4": TpuGeneration("0x005e", 4, 32 * _GB, {1: (1, 1, 1), 2: (1, 2, 1), 4: (2, 2, 1)}),
    "v5p": TpuGeneration("0x0062", 4, 95 * _GB, {1: (1, 1, 1), 4: (2, 2, 1)}),
    "v5e": TpuGeneration("0x0063", 8, 16 * _GB, {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}),
    "v6e": TpuGeneration("0x006f", 8, 32 * _GB, {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}),
}
GOOGLE_PCI_VENDOR = "0x1ae0"


@dataclasses.dataclass(frozen=True)
class Inventory:
    """One host's devices: what placement divides among the roles.

    Attributes:
      platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
      count: accelerators (GPUs, TPU chips); 0 on CPU.
      kind: ``"NVIDIA H100 80GB HBM3"``, a TPU generation of :data:`TPU_GENERATIONS`
        (``"v6e"``), or ``"cpu"``.
      memory_bytes: memory per accelerator (0: unknown, or CPU).
      cpu_cores: the CPU cores the run may use (the supervisor's affinity).
      device_ids: the host's ids of the accelerators, in order (``nvidia-smi``'s
        index, which ``CUDA_VISIBLE_DEVICES`` names; TPU chip 0..n-1); empty: ``0..count-1``.
    """

    platform: Platform
    count: int = 0
    kind: str = "cpu"
    memory_bytes: int = 0
    cpu_cores: tuple[int, ...] = ()
    device_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise ValueError(
                f"inventory.platform: one of {', '.join(PLATFORMS)}, got {self.platform!r}"
            )
        if self.platform != "cpu" and self.count < 1:
            raise ValueError(
                f"inventory.count: a {self.platform} host has >= 1 device, got {self.count}"
            )
        if self.platform == "tpu" and self.kind not in TPU_GENERATIONS:
            raise ValueError(
                f"inventory.kind: a TPU generation ({', '.join(TPU_GENERATIONS)}), got {self.kind!r}"
            )
        if self.device_ids and len(self.device_ids) != self.count:
            raise ValueError(f"inventory.device_ids: {self.count} ids, got {len(self.device_ids)}")

    @property
    def ids(self) -> tuple[int, ...]:
        """The host ids of the accelerators (``device_ids`` or ``0..count-1``)."""
        return self.device_ids or tuple(range(self.count))

    @property
    def tpu(self) -> TpuGeneration:
        """The TPU generation's facts (a TPU inventory only)."""
        return TPU_GENERATIONS[self.kind]


Runner = Callable[[Sequence[str]], str]


def _run(argv: Sequence[str]) -> str:
    """``argv``'s standard output, or "" if it is missing, fails or hangs (5 s)."""
    if shutil.which(argv[0]) is None:
        return ""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _tpu_chips(sys_root: pathlib.Path) -> tuple[str, int] | None:
    """(generation, chips) from the PCI devices under ``sys_root``, or None: no TPU."""
    by_id = {g.pci_id: name for name, g in TPU_GENERATIONS.items()}
    found: list[str] = []
    for device in sorted((sys_root / "bus" / "pci" / "devices").glob("*")):
        try:
            vendor = (device / "vendor").read_text().strip()
            pci_id = (device / "device").read_text().strip()
        except OSError:
            continue
        if vendor == GOOGLE_PCI_VENDOR and pci_id in by_id:
            found.append(by_id[pci_id])
    return (found[0], len(found)) if found else None


def _gpus(run: Runner, env: Mapping[str, str]) -> list[tuple[int, str, int]]:
    """(index, name, memory bytes) of each GPU ``nvidia-smi`` lists and the environment shows."""
    out = run(
        ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"]
    )
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            mib = int(parts[2]) if parts[2].isdigit() else 0
            gpus.append((int(parts[0]), parts[1], mib * 2**20))
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        shown = {int(v) for v in visible.split(",") if v.strip().isdigit()}
        gpus = [g for g in gpus if g[0] in shown]
    return gpus


def detect_inventory(
    *,
    env: Mapping[str, str] | None = None,
    sys_root: str | os.PathLike[str] = "/sys",
    run: Runner = _run,
    cpu_cores: Sequence[int] | None = None,
) -> Inventory:
    """This host's devices, from the operating system (no JAX imported, no device opened).

    Args:
      env: the environment to honour (default ``os.environ``): ``JAX_PLATFORMS=cpu``
        forces CPU; ``CUDA_VISIBLE_DEVICES`` narrows the GPUs.
      sys_root: where sysfs is (a test gives a tree of its own).
      run: runs a command and returns its output ("" when it fails); a test gives a fake.
      cpu_cores: the usable cores (default: this process's affinity).

    Returns:
      The :class:`Inventory`; CPU when no accelerator is found.
    """
    env = os.environ if env is None else env
    cores = tuple(sorted(os.sched_getaffinity(0) if cpu_cores is None else cpu_cores))
    platforms = env.get("JAX_PLATFORMS", "").lower()
    if platforms.split(",")[0].strip() == "cpu":
        return Inventory("cpu", cpu_cores=cores)
    if tpu := _tpu_chips(pathlib.Path(sys_root)):
        kind, chips = tpu
        memory = TPU_GENERATIONS[kind].hbm_bytes
        return Inventory("tpu", chips, kind, memory, cores)
    if gpus := _gpus(run, env):
        ids = tuple(g[0] for g in gpus)
        return Inventory("gpu", len(gpus), gpus[0][1], gpus[0][2], cores, ids)
    return Inventory("cpu", cpu_cores=cores)
