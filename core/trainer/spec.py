"""The trainer's part of a run specification: ``rlax.train`` in gin.

What only the trainer reads: the algorithm and its optimiser, how many steps, where
the run directory goes, how the trainer state is saved, how the run is watched, and how
the trainer lies on devices and hosts. What every role shares (task, reward, sampler,
batch shape, staleness, ...) is the run specification's own
(:class:`rlax.core.spec.RunSpec`)::

    rlax.train.steps = 800
    rlax.train.algorithm = @algorithms.grpo()
    rlax.train.checkpointing = @rlax.checkpointing()   # configs/base/roles.gin binds these
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any

from rlax.core.constraints import AtLeast, check_fields
from rlax.core.contracts import Algorithm, Distils
from rlax.core.errors import ConfigError
from rlax.core.models.lora_config import LoraConfig
from rlax.core.parallel.mesh import MeshConfig
from rlax.core.parallel.multihost import DistributedSettings
from rlax.core.trainer.checkpoint import CheckpointSettings
from rlax.core.trainer.observe import WatchSettings
from rlax.core.trainer.optimizer import OptaxCall
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.types import ConfigPath

__all__ = ["TrainerSpec", "check_teacher", "needs_teacher"]


@dataclasses.dataclass(frozen=True)
class TrainerSpec:
    """The trainer role's settings (``rlax.train``).

    Args:
      algorithm: the RL algorithm (``@algorithms.grpo()``).
      optimizer: the optax optimiser (``@rlax.clipped_optimizer()``): a recipe the trainer
        builds (:class:`~rlax.core.trainer.optimizer.OptaxCall`), or a built optax
        ``GradientTransformation``.
      steps: training steps (the run is finished at this step).
      run_root / run_name: a new run directory is ``run_root/run_name-<time>``.
      progress: progress bars and lines on the terminal.
      checkpointing: how the whole trainer state is saved (docs/preemption.md).
      watch: loggers, traces, curves and evaluations during the run
        (docs/observability.md).
      mesh / trainer_settings / distributed: the trainer on devices and hosts
        (docs/mesh.md; None: one device, one process).
      teacher: a distilling algorithm's teacher checkpoint (``needs_teacher``).
      lora: train low-rank adapters on a frozen base (docs/lora.md).
      preemption_notices: the trainer's notice sources (None: SIGTERM and SIGINT).
    """

    algorithm: Algorithm | None = None
    optimizer: OptaxCall | Any = None
    steps: Annotated[int, AtLeast(1)] = 100
    run_root: str = "runs"
    run_name: str = "run"
    progress: bool = True
    checkpointing: CheckpointSettings = dataclasses.field(default_factory=CheckpointSettings)
    watch: WatchSettings = dataclasses.field(default_factory=WatchSettings)
    mesh: MeshConfig | None = None
    trainer_settings: TrainerSettings | None = None
    distributed: DistributedSettings | None = None
    teacher: ConfigPath | None = None
    lora: LoraConfig | None = None
    preemption_notices: Sequence[Any] | None = None

    def __post_init__(self) -> None:
        check_fields(self)


def needs_teacher(algorithm) -> bool:
    """Whether the algorithm distils from a teacher (:class:`~rlax.core.contracts.Distils`;
    an algorithm without the capability does not)."""
    return isinstance(algorithm, Distils) and algorithm.needs_teacher


def check_teacher(algorithm, teacher: object | None, setting: str = "rlax.train.teacher") -> None:
    """ConfigError if the algorithm distils from a teacher and none is named."""
    if needs_teacher(algorithm) and teacher is None:
        raise ConfigError(
            f"{setting}: the algorithm distils from a teacher; name the teacher's checkpoint "
            f"(e.g. --gin.{setting}=\"'/path/to/teacher'\")"
        )
