"""One iteration of the RL loop (a "step"): take a batch, update, publish the new weights.

:func:`train_step` is what :class:`rlax.core.trainer.loop.TrainingRun` runs for
each step, whatever its rollout source (:class:`rlax.core.contracts.RolloutSource`).
With several trainer processes (docs/mesh.md) process 0 takes the batch and
every process gets it; each trains on its own rows and pushes its part of the
weights.
"""

from __future__ import annotations

import functools
import time

import jax
import numpy as np

from rlax.core.contracts import RolloutSource
from rlax.core.parallel import multihost
from rlax.core.rollout.groups import episode_metrics, generated_tokens
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.epochs import update_on_batch
from rlax.core.trainer.filling import Entry
from rlax.core.trainer.phases import PhaseClock
from rlax.core.trainer.step import Trainer, batch_arrays
from rlax.core.trainer.teacher import Teacher
from rlax.core.types import Group, TrainBatch


def entry_order(entry: Entry) -> tuple:
    """A fixed order for a batch's entries whatever order the workers delivered them in."""
    if isinstance(entry, Group):
        return (0, entry.prompt.id, "")
    return (1, "", np.asarray(entry.rewards, np.float32).tobytes().hex())


def take_batch(
    source: RolloutSource,
    trainer: Trainer,
    version: int,
    *,
    group_size: int,
    completion_len: int,
    deterministic: bool,
    groups: list[Group] | None = None,
):
    """Process 0's part of a step: (metrics so far, the TrainBatch or None, generated tokens).

    The batch's groups are appended to ``groups`` when given (for the rollout traces).
    """
    entries, info = source.next_batch(version)
    if deterministic:
        entries = sorted(entries, key=entry_order)
    rewards = np.concatenate([e.rewards for e in entries])
    kept = [e for e in entries if isinstance(e, Group)]
    if groups is not None:
        groups.extend(kept)
    metrics: dict[str, float] = {
        "reward": float(rewards.mean()),
        "pass_rate": float((rewards >= 1.0).mean()),
        "groups_kept": len(kept),
        **episode_metrics(kept),
        **info,
    }
    batch = None
    if kept:
        advantages = trainer.algorithm.advantages(np.stack([g.rewards for g in kept]))
        batch = make_batch(
            kept,
            advantages,
            row_multiple=8 * group_size,
            completion_len=completion_len,
            version=version,
        )
    return metrics, batch, generated_tokens(kept)


def own_rows(trainer: Trainer, batch):
    """The rows of the global ``batch`` (a TrainBatch or its arrays) this process feeds (all of
    them with one process)."""
    if jax.process_count() == 1:
        return batch
    arrays = batch_arrays(batch) if isinstance(batch, TrainBatch) else batch
    rows = multihost.process_rows(trainer.mesh, len(arrays["tokens"]))
    return {name: x[rows] for name, x in arrays.items()}


def update_own_rows(
    trainer: Trainer, batch: TrainBatch, *, step: int, seed: int, teacher: Teacher | None
) -> dict:
    """The training phase of a step on this process: the update(s) on its own rows of the
    global ``batch``, with the ``teacher``'s logprobs added as ``teacher_logprobs`` when given;
    their metrics."""
    arrays = batch if teacher is None else teacher.annotate(batch_arrays(batch))
    rows = own_rows(trainer, arrays)
    return update_on_batch(trainer, arrays, rows, seed=seed, step=step, group_ids=batch.group_ids)


def train_step(
    step: int,
    source: RolloutSource,
    trainer: Trainer,
    *,
    group_size: int,
    completion_len: int,
    version_offset: int = 0,
    deterministic: bool = False,
    clock: PhaseClock | None = None,
    groups: list[Group] | None = None,
    seed: int = 0,
    teacher: Teacher | None = None,
) -> dict:
    """Takes one batch, updates, publishes the new weights; returns the step's metrics.

    The weight version is the trainer's step plus ``version_offset`` (nonzero
    after a resume that had to skip versions a lost trainer had published).
    A notice that stopped process 0 waiting for rollouts stops every process
    here (the batch's broadcast carries the exception). ``clock`` times the
    phases (waiting for rollouts, training, publishing); process 0 appends the
    batch's groups to ``groups`` when given. The trainer's settings say how many
    updates the batch gives (:mod:`rlax.core.trainer.epochs`, shuffled by ``seed``
    and ``step``); a ``teacher`` adds its logprobs to the batch as ``teacher_logprobs``
    (:mod:`rlax.core.trainer.teacher`).
    """
    clock = clock or PhaseClock()
    start = time.perf_counter()
    with clock("wait_rollouts"):
        metrics, batch, tokens = multihost.run_on_lead(
            functools.partial(
                take_batch,
                source,
                trainer,
                trainer.state.step + version_offset,
                group_size=group_size,
                completion_len=completion_len,
                deterministic=deterministic,
                groups=groups,
            )
        )
    metrics = {"step": step, **metrics}
    if batch is not None:
        with clock("train"):
            metrics.update(update_own_rows(trainer, batch, step=step, seed=seed, teacher=teacher))
        with clock("publish"):
            metrics.update(
                source.publish(trainer.state.params, trainer.state.step + version_offset)
            )
    if multihost.is_lead():
        with clock("publish"):
            source.done()
    metrics["version"] = trainer.state.step + version_offset
    metrics["tokens_per_s"] = tokens / (time.perf_counter() - start)
    return metrics
