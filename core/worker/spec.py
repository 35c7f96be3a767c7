"""The workers' part of a run specification: ``rlax.worker`` in gin.

What only a worker reads: how many prompts it leases at once, where its verifier runs,
and when it loads new weights inside a batch. The sampler, the reward, the curation
filters, the group size and the reload staleness are the run's
(:class:`rlax.core.spec.RunSpec`), shared with the trainer's evaluation::

    rlax.worker.prompts_per_lease = 16
    rlax.worker.reward_workers = 1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any

from rlax.core.constraints import AtLeast, Positive, check_fields

__all__ = ["WORKER_ID_ENV", "WorkerSpec"]

#: The environment variable that names a worker process of a local cluster (``worker-0``);
#: the supervisor sets it, the worker takes it as its name.
WORKER_ID_ENV = "RLAX_WORKER_ID"


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """The worker role's settings (``rlax.worker``).

    Args:
      prompts_per_lease: prompts a worker leases (and generates) at once.
      reward_workers: verifier processes per worker (0: in the worker's process; they
        boot while the worker loads, :mod:`rlax.core.worker.background_pool`).
      reward_timeout_s: a hard deadline per verifier call: a verifier that hangs or
        crashes costs a counted zero.
      reload_in_flight: load newer weights between decode steps too (a Resumable
        sampler only, e.g. ``@samplers.engine()``), asking the server at most every
        ``refresh_interval_s``.
      preemption_notices: the worker's notice sources (None: SIGTERM and SIGINT).
      probe_check: the weight-load check (:mod:`rlax.core.rollout.probe`): the trainer
        publishes a probe's logprobs with each version, and a worker refuses a version
        whose probe its loaded weights do not reproduce (an error line, the
        ``probe_refused`` count; it keeps its weights or waits for the next version).
      probe_tolerance: the largest per-token |logprob difference| the check accepts, in
        nats (reduction order across devices and programs, not the wire's rounding: the
        trainer rounds before it scores).
    """

    prompts_per_lease: Annotated[int, AtLeast(1)] = 16
    reward_workers: Annotated[int, AtLeast(0, means="0: in this process")] = 1
    reward_timeout_s: Annotated[float, Positive] = 10.0
    reload_in_flight: bool = False
    refresh_interval_s: Annotated[float, Positive] = 0.5
    preemption_notices: Sequence[Any] | None = None
    probe_check: bool = True
    probe_tolerance: Annotated[float, Positive] = 0.01

    def __post_init__(self) -> None:
        check_fields(self)
