"""The parameter server's part of a run specification: ``rlax.param_server`` in gin.

What only the server reads: how deep its rollout queue is, how long a lease lasts, the
curricula that see every group, and what it keeps on disk. Where it listens and how
weights travel are the run's ``server`` settings (``rlax.ps_settings``), which every
client reads too::

    rlax.param_server.lease_ttl_s = 120.0
    rlax.param_server.saved_weights = 1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any

from rlax.core.constraints import AtLeast, Positive, check_fields
from rlax.core.contracts import Curriculum

__all__ = ["ParamServerSpec"]


@dataclasses.dataclass(frozen=True)
class ParamServerSpec:
    """The parameter-server role's settings (``rlax.param_server``).

    Args:
      capacity: prompts leased, queued or being trained on at once. None:
        ``prompts_per_step * max(1, max_staleness + 1 - reload_staleness)`` -- one batch
        in synchronous mode, otherwise as many batches ahead as the staleness rule can
        accept (a group made with weights up to ``reload_staleness`` versions old waits
        behind at most that many batches; deeper queues only make groups the trainer
        must drop).
      lease_ttl_s: a lease not fulfilled within this time is served again.
      curricula: see every submitted group and keep retired prompts from being leased
        again (e.g. ``@curation.pass_rate_curriculum()``).
      state_dir: where ``queue.sqlite`` and ``weights/`` are kept (None: the run
        directory's ``param_server/``; without a run directory nothing is kept).
      saved_weights: the newest served versions kept on disk (0: none; the trainer
        publishes again after a restart, docs/preemption.md).
      preemption_notices: the server's notice sources (None: SIGTERM and SIGINT).
    """

    capacity: Annotated[int, AtLeast(1)] | None = None
    lease_ttl_s: Annotated[float, Positive] = 120.0
    curricula: Sequence[Curriculum] = ()
    state_dir: str | None = None
    saved_weights: Annotated[int, AtLeast(0, means="0: save none")] = 1
    preemption_notices: Sequence[Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "curricula", tuple(self.curricula))
        check_fields(self)

    def queue_capacity(
        self, prompts_per_step: int, max_staleness: int, reload_staleness: int
    ) -> int:
        """The rollout queue's capacity (``capacity``, or its default)."""
        ahead = max(1, max_staleness + 1 - reload_staleness)
        return self.capacity or prompts_per_step * ahead
