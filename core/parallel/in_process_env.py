"""The supervisor's word to a one-process trainer: which of its devices are whose.

In ``"one_process"`` and ``"colocated"`` placement the supervisor starts one trainer
process that sees every device of both roles (:func:`~rlax.core.parallel.process_env.
child_environments`). That process must not decide the split again: with its
environment narrowed it sees fewer devices than the host has, so positions written
for the host would not resolve. The supervisor therefore adds one variable,
:data:`ROLE_DEVICES_ENV`, holding :meth:`RoleDevices.in_process`: the mode and each
role's positions in the child's ``jax.devices()``. JAX-free, like the supervisor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from rlax.core.parallel.placement import RoleDevices

__all__ = ["ROLE_DEVICES_ENV", "InProcessRoles", "read_role_devices", "role_devices_env"]

ROLE_DEVICES_ENV = "RLAX_ROLE_DEVICES"
IN_PROCESS_MODES = ("one_process", "colocated")


@dataclasses.dataclass(frozen=True)
class InProcessRoles:
    """The one process's split: its mode and each role's positions in ``jax.devices()``
    (empty: decide from the devices the process sees)."""

    mode: str
    trainer: tuple[int, ...] = ()
    sampler: tuple[int, ...] = ()


def role_devices_env(roles: RoleDevices) -> dict[str, str]:
    """What the supervisor adds to the trainer child's environment: ``{}`` unless the
    sampler runs in the trainer's process; else ``RLAX_ROLE_DEVICES=MODE:T,T:S,S``."""
    if roles.mode not in IN_PROCESS_MODES:
        return {}
    trainer, sampler = roles.in_process()
    value = f"{roles.mode}:{','.join(map(str, trainer))}:{','.join(map(str, sampler))}"
    return {ROLE_DEVICES_ENV: value}


def read_role_devices(env: Mapping[str, str]) -> InProcessRoles | None:
    """The split :func:`role_devices_env` wrote into ``env`` (None: not set).

    Raises:
      ValueError: a malformed value (naming the variable).
    """
    value = env.get(ROLE_DEVICES_ENV)
    if not value:
        return None
    parts = value.split(":")
    if len(parts) != 3 or parts[0] not in IN_PROCESS_MODES:
        raise ValueError(f"{ROLE_DEVICES_ENV}: MODE:TRAINER:SAMPLER expected, got {value!r}")
    try:
        trainer, sampler = (tuple(int(d) for d in p.split(",") if d) for p in parts[1:])
    except ValueError:
        raise ValueError(f"{ROLE_DEVICES_ENV}: device positions are integers, got {value!r}")
    return InProcessRoles(parts[0], trainer, sampler)
