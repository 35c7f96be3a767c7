"""Several optimiser updates per rollout batch: PPO's epochs over shuffled minibatches.

With one update per batch the policy ratio is measured against the policy
that is being updated, so it is 1 (up to the sampler mismatch), the clip
never binds and PPO's value clip never acts. As PPO does (K epochs of
minibatch SGD on each batch of rollouts; verl's ``ppo_epochs`` and
``ppo_mini_batch_size``, TRL's ``steps_per_generation``), the trainer can
instead take ``epochs x minibatches`` updates per batch
(:class:`~rlax.core.trainer.settings.TrainerSettings`):

1. one forward pass without gradient on the whole batch fixes the anchors of
   every update: ``train_logprobs`` (the decoupled ratio's denominator, the
   train/inference alignment's numerator), ``old_values`` (the value clip's
   centre, GAE's values) and ``ref_logprobs``; and, for an algorithm with
   :class:`~rlax.core.contracts.BatchTerms`, the per-token terms of the
   whole batch (PPO's and REINFORCE++'s advantages, whitened over all of its
   tokens as with one update, not over each minibatch);
2. each epoch shuffles the batch's groups with a generator seeded by
   ``(seed, step, epoch)`` and splits them into ``minibatches`` parts of
   whole groups (a group's advantages are relative to its own samples), each
   padded with empty rows to one row count;
3. each minibatch is one :meth:`~rlax.core.trainer.step.Trainer.step`.

With ``routing_replay = "trainer"`` (R2-style, :mod:`rlax.core.models.routing_replay`)
a mixture-of-experts policy's routing of the batch is taken first, with the
parameters before any update (:func:`first_pass_routes`), and replaces the
batch's rollout record: the anchors and every update route by it. With one
update per batch the trainer routes itself (the first pass is the update).

The weight version still counts rollout batches: after the updates the
trainer's step is one more than before, so publishing, staleness and
checkpoints see one step per batch, and the shuffle depends only on the run's
seed and the step, so a resumed run repeats it exactly. The metrics are the
updates' means; ``updates`` says how many there were.

References:
  Schulman et al., 2017, PPO, https://arxiv.org/abs/1707.06347 (section 5, K epochs of
  minibatch SGD per batch)
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from rlax.core.contracts import BatchTerms
from rlax.core.errors import ConfigError
from rlax.core.models import lora as loralib
from rlax.core.models.routing_replay import ROUTES_DTYPE
from rlax.core.models.transformer import causal_mask, positions_from_mask
from rlax.core.parallel import mesh as meshlib
from rlax.core.runtime import executables
from rlax.core.trainer import mismatch
from rlax.core.trainer.microbatch import cast_floats
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.trainer.step import Trainer, batch_arrays
from rlax.core.types import TrainBatch

Arrays = dict[str, np.ndarray]


def updates_per_batch(trainer: Trainer) -> int:
    return trainer.settings.epochs * trainer.settings.minibatches


def minibatch_rows(
    group_ids: np.ndarray, minibatches: int, rng: np.random.Generator, row_multiple: int = 1
) -> list[np.ndarray]:
    """Each minibatch's row indices: whole groups, shuffled, padded with ``len(group_ids)``.

    ``group_ids`` [B] names each row's group (-1: an empty filler row). The
    groups are permuted by ``rng`` and split into ``minibatches`` parts whose
    group counts differ by at most one; every part is padded to one row count
    (a multiple of ``row_multiple``) with the index ``B``, which stands for an
    empty row. Parts without a group are left out.
    """
    groups = np.unique(group_ids[group_ids >= 0])
    rows = [np.flatnonzero(group_ids == g) for g in rng.permutation(groups)]
    parts = [p for p in np.array_split(np.arange(len(rows)), minibatches) if len(p)]
    chosen = [np.concatenate([rows[i] for i in p]) for p in parts]
    width = max((len(c) for c in chosen), default=0)
    width = max(row_multiple, -(-width // row_multiple) * row_multiple)
    pad = len(group_ids)
    return [np.concatenate([c, np.full(width - len(c), pad, c.dtype)]) for c in chosen]


def _fixed_fn(trainer: Trainer, arrays: dict):
    """The compiled no-gradient forward that fixes the anchors (see the module doc)."""

    def fixed(params, critic, ref_params, batch):
        logp, _, values = trainer._scan_forward(params, critic, batch)
        out = {"train_logprobs": logp.astype(jnp.float32)}
        if values is not None:
            out["old_values"] = values.astype(jnp.float32)
        if ref_params is not None and "ref_logprobs" not in batch:
            ref_logp, _, _ = trainer._scan_forward(ref_params, None, batch)
            out["ref_logprobs"] = ref_logp.astype(jnp.float32)
        if isinstance(trainer.algorithm, BatchTerms):  # e.g. advantages whitened over the batch
            out.update(trainer.algorithm.batch_terms({**batch, **out}))
        return jax.lax.stop_gradient(out)

    key = ("fixed", tuple(sorted((k, np.ndim(v)) for k, v in arrays.items())))
    if key not in trainer._compiled:
        shardings = (
            trainer.param_shardings,
            trainer.critic_shardings,
            trainer.ref_shardings,
            trainer.batch_shardings(arrays),
        )
        jitted = jax.jit(fixed, in_shardings=shardings)
        trainer._compiled[key] = executables.stored("fixed_anchors", jitted, trainer.closure())
    return trainer._compiled[key]


def fixed_anchors(trainer: Trainer, arrays: Arrays) -> Arrays:
    """``arrays`` plus the anchors every update of the batch shares, on the host."""
    placed = trainer.device_batch(arrays)
    s = trainer.state
    out = _fixed_fn(trainer, placed)(s.params, s.critic, trainer.ref_params, placed)
    return {**arrays, **{k: np.asarray(v) for k, v in jax.device_get(out).items()}}


def first_pass_routes(trainer: Trainer, arrays: Arrays) -> np.ndarray | None:
    """int16 [B, T, L, k]: the experts the trainer's current parameters route each token of
    the padded batch to (-1 on padding); None for a dense model. One forward of the whole
    batch without the head, in the step's compute dtype."""
    if trainer._model_cfg.moe is None:
        return None
    tokens, mask = arrays["tokens"], np.asarray(arrays["attention_mask"])
    key = ("first_pass_routes", tokens.shape)
    if key not in trainer._compiled:

        def routes(params, tokens, mask):
            ids = None
            if trainer.passes.token_ids:  # LoRA dropout: each token's identity
                ids = jnp.arange(tokens.size, dtype=jnp.int32).reshape(tokens.shape)
            params = cast_floats(params, trainer._compute_dtype)
            model = loralib.model_of(trainer.graphdef, params, ids)
            _, _, routed = model.routed_hidden_states(
                tokens, positions_from_mask(mask), causal_mask(mask)
            )
            return routed.ids.astype(ROUTES_DTYPE)

        trainer._compiled[key] = jax.jit(routes)
    out = np.asarray(trainer._compiled[key](trainer.state.params, tokens, mask))
    return np.where(mask[..., None, None], out, -1).astype(ROUTES_DTYPE)


def _with_empty_row(arrays: Arrays) -> Arrays:
    """Each array with one more, all-zero row (no attention, no loss): the padding row."""
    return {k: np.concatenate([v, np.zeros((1, *v.shape[1:]), v.dtype)]) for k, v in arrays.items()}


def several_updates(
    trainer: Trainer, arrays: Arrays, group_ids: np.ndarray, *, seed: int, step: int
) -> list[dict]:
    """``epochs x minibatches`` updates on the batch ``arrays``; each update's metrics, in order.

    ``group_ids`` [B] names each row's group (:attr:`TrainBatch.group_ids`).
    The trainer's step advances by one, whatever the number of updates.
    """
    settings = trainer.settings
    if settings.routing_replay == "trainer":  # R2: every update routes as the first pass
        arrays = {k: v for k, v in arrays.items() if k != "routes"}
        routes = first_pass_routes(trainer, arrays)
        if routes is not None:
            arrays["routes"] = routes
    arrays = _with_empty_row(fixed_anchors(trainer, arrays))
    if "routes" in arrays:
        arrays["routes"][-1] = -1  # the empty row: routed by the trainer (no loss)
    multiple = math.lcm(meshlib.batch_size_multiple(trainer.mesh), settings.microbatches)
    start, metrics = trainer.state.step, []
    for epoch in range(settings.epochs):
        rng = np.random.default_rng([seed, step, epoch])
        for rows in minibatch_rows(group_ids, settings.minibatches, rng, multiple):
            metrics.append(trainer.step({k: v[rows] for k, v in arrays.items()}))
    trainer.state = dataclasses.replace(trainer.state, step=start + 1)
    return metrics


def _without_routes(batch: TrainBatch | Arrays) -> TrainBatch | Arrays:
    if isinstance(batch, TrainBatch):
        return dataclasses.replace(batch, routes=None)
    return {k: v for k, v in batch.items() if k != "routes"}


def mean_metrics(per_update: list[dict]) -> dict[str, float]:
    """The updates' metrics averaged key by key, and ``updates``: how many there were."""
    keys: set[str] = set().union(*(m.keys() for m in per_update))
    means = {k: float(np.mean([m[k] for m in per_update if k in m])) for k in sorted(keys)}
    return {**means, "updates": float(len(per_update))}


def check_processes(settings: TrainerSettings | None, processes: int) -> None:
    """ConfigError, before any work, for several updates per batch on several processes."""
    if settings is not None and settings.epochs * settings.minibatches > 1 and processes > 1:
        raise ConfigError(
            "rlax.trainer_settings.epochs/minibatches: several updates per batch run on one "
            f"trainer process only, not {processes}"
        )


def update_on_batch(
    trainer: Trainer,
    batch: TrainBatch | Arrays,
    rows,
    *,
    seed: int,
    step: int,
    group_ids: np.ndarray | None = None,
) -> dict:
    """The step's updates on ``batch``; ``rows`` is what this process feeds a single update.

    One update (1 x 1) is exactly :meth:`Trainer.step` on ``rows``, as before
    several were possible. ``batch`` as arrays needs ``group_ids``. The weights before
    the updates become the trainer's ``previous_params`` (the mismatch of tokens sampled
    with them: :mod:`rlax.core.trainer.mismatch`).
    """
    before = mismatch.remembered(trainer)
    if updates_per_batch(trainer) == 1:
        if trainer.settings.routing_replay == "trainer":  # the update is the first pass
            rows = _without_routes(rows)
        if before is not None:  # kept: one process, so its rows are the batch
            rows = batch_arrays(rows) if isinstance(rows, TrainBatch) else rows
            rows = mismatch.with_lagged_logprobs(trainer, rows)
        metrics = trainer.step(rows)
    else:
        check_processes(trainer.settings, jax.process_count())
        if isinstance(batch, TrainBatch):
            group_ids = batch.group_ids
            arrays = batch_arrays(batch)
        else:
            arrays = batch
        assert group_ids is not None, "update_on_batch: arrays need their group_ids"
        if before is not None:
            arrays = mismatch.with_lagged_logprobs(trainer, arrays)
        metrics = mean_metrics(several_updates(trainer, arrays, group_ids, seed=seed, step=step))
    trainer.previous_params = before
    return metrics
