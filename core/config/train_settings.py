"""What ``rlax run`` reads of ``rlax.train``'s bindings before the trainer is built.

Some of the trainer's settings are needed before gin calls ``rlax.train``: the
run directory's root and name and the number of steps (to make, find or call
finished a run directory before any role starts), and ``rlax.train.distributed``
(a trainer of several processes joins the others before gin builds anything:
JAX's multi-process runtime must start before any code touches a device).
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import gin

from rlax.core.config.checks import check_weights_kept
from rlax.core.errors import ConfigError

__all__ = ["join_trainer_processes", "train_setting"]


def train_setting(name: str) -> Any:
    """``rlax.train``'s bound ``name`` (macros evaluated), else its default."""
    try:
        return copy.deepcopy(gin.query_parameter(f"rlax.train.{name}"))  # evaluates a macro
    except ValueError:
        from rlax.core.trainer import role as trainer_role

        return inspect.signature(trainer_role.train).parameters[name].default


def join_trainer_processes() -> None:
    """``jax.distributed.initialize`` with ``rlax.train.distributed`` (a no-op for one process)."""
    from rlax.core.parallel import multihost  # imports JAX: only for a trainer

    try:
        settings = copy.deepcopy(gin.query_parameter("rlax.train.distributed"))  # evaluates it
    except ValueError:  # not bound: the environment may still ask for several processes
        settings = None
    processes = (settings or multihost.DistributedSettings()).resolved().num_processes or 1
    check_weights_kept(processes)
    try:
        multihost.initialize(settings)
    except ValueError as err:
        raise ConfigError(f"rlax.train.distributed: {err}") from err
