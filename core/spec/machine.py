"""Facts of this machine a run specification must fit, checked before any work.

Paths the run writes into must be folders (or not exist yet, under a folder that does),
the placement must fit the host's devices and cores, the starting checkpoint must be there, and the
sampler's cache for its rows must fit in this machine's memory with room to spare.
Each refusal is one :class:`ConfigError` line naming the setting.
"""

from __future__ import annotations

import os
import pathlib
from typing import TYPE_CHECKING

from rlax.core.errors import BadSetting, ConfigError
from rlax.core.spec.lengths import sampler_cache_bytes

if TYPE_CHECKING:
    from rlax.core.spec.run import RunSpec

__all__ = ["MACHINE_RULES", "available_memory_bytes", "check_folder"]

#: The share of this machine's available memory all the sampler caches of a run may take.
CACHE_SHARE = 0.5


def check_folder(path: str | os.PathLike[str] | None, setting: str) -> None:
    """ConfigError unless ``path`` is a folder, or can be made one (its nearest existing
    parent is a writable folder)."""
    if path is None or path == "":
        return
    target = pathlib.Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{setting}: {str(path)!r} is a file, not a folder; name a folder")
    parent = target
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{setting}: {str(path)!r} cannot be made: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{setting}: {str(path)!r} cannot be written: {parent} is read-only")


def check_folders(spec: RunSpec, role: str) -> None:
    """The run's root, the server's state folder and the compile cache are folders."""
    if role in ("all", "trainer", "inline"):
        check_folder(spec.train.run_root, "rlax.train.run_root")
    if role in ("all", "param_server"):
        check_folder(spec.param_server.state_dir, "rlax.param_server.state_dir")
    cache = spec.compile_cache.path
    if isinstance(cache, str):
        check_folder(cache, "rlax.compile_cache.path")


def check_placement(spec: RunSpec, role: str) -> None:
    """The placement fits this host: its devices and cores exist, no two processes share a
    device, a process owns a device count it may own (docs/accelerators.md). Only the
    supervisor places roles; a role started by a scheduler gets its devices from it."""
    if role != "all":
        return
    from rlax.core.parallel.process_env import plan_children

    try:
        plan_children(spec.placement, workers=spec.local_cluster.num_workers)
    except BadSetting as err:
        raise ConfigError(f"rlax.placement.{err.parameter}: {err}") from err


def check_checkpoints(spec: RunSpec, role: str) -> None:
    """The starting policy (and a teacher) exist, where they are local paths (``rlax eval``'s
    is its ``--checkpoint``, which it names itself)."""
    named: list[tuple[str, str | os.PathLike[str] | None]] = []
    if role != "eval":
        named.append(("rlax.run.init_checkpoint", spec.init_checkpoint))
    if role in ("all", "trainer", "inline"):
        named.append(("rlax.train.teacher", spec.train.teacher))
    for setting, path in named:
        if path is None or str(path).startswith("pypi:"):
            continue
        if not pathlib.Path(path).expanduser().exists():
            raise ConfigError(f"{setting}: {str(path)!r}: no such file or folder")


def available_memory_bytes() -> int | None:
    """This machine's available memory (``MemAvailable``), or None where it cannot be read."""
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_sampler_memory(spec: RunSpec, role: str) -> None:
    """The samplers' caches for their rows fit in half this machine's available memory
    (every worker of a local run holds one, and the trainer's evaluation another)."""
    if role not in ("all", "worker", "inline", "eval"):
        return
    need = sampler_cache_bytes(spec)
    have = available_memory_bytes()
    if need is None or have is None:
        return
    copies = spec.local_cluster.num_workers + 1 if role == "all" else 1
    if need * copies > CACHE_SHARE * have:
        raise ConfigError(
            f"rlax.run.sampler: its cache for {need.rows} rows of {need.columns} tokens takes "
            f"{need / 2**30:.1f} GiB (x{copies} processes), more than half of this machine's "
            f"{have / 2**30:.1f} GiB available; lower the sampler's max_new_tokens or its rows "
            "(rlax.worker.prompts_per_lease, rlax.run.group_size, the engine's slots)"
        )


MACHINE_RULES = (check_folders, check_placement, check_checkpoints, check_sampler_memory)
