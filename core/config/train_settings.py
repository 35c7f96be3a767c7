"""What ``rlax run`` does with the trainer's settings before the trainer is built.

A trainer of several processes (``rlax.train.distributed``, or the ``RLAX_*`` variables
of docs/mesh.md) joins the others before any code touches a device: JAX's multi-process
runtime must start first. Building the run specification touches none (a component
binds a model and its devices only when a role sets it up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlax.core.errors import ConfigError

if TYPE_CHECKING:
    from rlax.core.spec import RunSpec

__all__ = ["join_trainer_processes"]


def join_trainer_processes(spec: RunSpec) -> None:
    """``jax.distributed.initialize`` with ``spec.train.distributed`` (a no-op for one process)."""
    from rlax.core.parallel import multihost  # imports JAX: only for a trainer

    try:
        multihost.initialize(spec.train.distributed)
    except ValueError as err:
        raise ConfigError(f"rlax.train.distributed: {err}") from err
