"""The train/rollout mismatch: the sampler's logprobs against the trainer's *under the same weights*.

What the metrics are for is the sampler's numerics, its kept sets and its weight load
(docs/observability.md, "Train/rollout alignment"), so a token is compared with the
trainer's logprob under the weights of the version that sampled it, never under newer
ones: with rollouts one version stale (the quickstart's ``max_staleness = 1``) the
trainer's current weights differ from the sampler's by one update, and a comparison with
them shows the policy's change, not the sampler's error (|Δlogp| 0.064 either way on the
quickstart at top-p 0.8, whether the recorded distribution was the sampled one or not).

- Each target of the batch carries its ``policy_lag`` ([B, L] int32, from
  :func:`rlax.core.trainer.batches.make_batch`): how many versions before the one the
  trainer is updating it was sampled with (per token: a partial rollout can span
  versions).
- Lag 0 is compared with the trainer's logprobs at the start of the step (free: the
  update's own forward pass, or the fixed anchors of several updates).
- Lag 1 is compared with :data:`LAGGED` logprobs: the trainer keeps the previous
  version's weights (``TrainerSettings.lagged_mismatch``; one more copy of the policy's
  parameters) and runs one forward without gradient over a batch that holds such tokens
  (:func:`with_lagged_logprobs`), with one trainer process.
- Older tokens, and lag-1 tokens without those logprobs, are not measured;
  ``mismatch_coverage`` says which fraction of the loss-mask tokens was, and a step that
  measured none reports no mismatch at all rather than a zero (:func:`unmeasured_dropped`).

References:
  Schulman, 2020, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html (k3)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from rlax.core.masked import masked_mean
from rlax.core.runtime import executables

if TYPE_CHECKING:
    from rlax.core.trainer.step import Trainer

#: The band of π_train / π_sampler a token's ratio is "in" (``ratio_out_of_band``): peers
#: report half the tokens outside it when the recorded distribution is not the sampled one.
RATIO_BAND = (0.9, 1.1)
#: The batch key of each target's age in versions, int32 [B, L] (absent: every target 0).
LAG = "policy_lag"
#: The batch key of the trainer's logprobs under the previous version's weights, [B, L].
LAGGED = "lagged_logprobs"
#: The name of the lagged forward's compiled programs in the store (:mod:`executables`).
PROGRAM = "lagged_logprobs"
#: The metrics that say how far apart the two are; absent from a step that measured no token.
METRICS = ("mismatch_abs_logp", "mismatch_abs_logp_p99", "ratio_out_of_band", "mismatch_kl")


def masked_p99(x: jax.Array, mask: jax.Array) -> jax.Array:
    """The nearest-rank 99th percentile of ``x`` over ``mask`` (0 on an empty mask)."""
    flat = jnp.where(mask > 0, x, -jnp.inf).reshape(-1)
    n = jnp.sum(mask > 0)
    rank = flat.shape[0] - n + jnp.ceil(0.99 * n).astype(jnp.int32) - 1
    value = jnp.sort(flat)[jnp.clip(rank, 0, flat.shape[0] - 1)]
    return jnp.where(n > 0, value, 0.0)


def mismatch_metrics(train_logp: jax.Array, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """How far the sampler's logprobs are from the trainer's under the same weights.

    ``train_logp``: the trainer's logprobs of the batch's targets under its current
    weights (the batch's ``train_logprobs`` take their place when present: the anchors
    of several updates, taken before the first). π_sampler is the distribution each
    token was drawn from: the batch's ``sampled_logprobs`` where the recorded
    ``old_logprobs`` are not its. With d = log π_train − log π_sampler per measured
    token (see the module doc for which are): ``mismatch_abs_logp`` the mean of |d|,
    ``mismatch_abs_logp_p99`` its 99th percentile, ``ratio_out_of_band`` the fraction
    of tokens whose ratio e^d lies outside :data:`RATIO_BAND`, ``mismatch_kl`` the k3
    estimate of KL(π_sampler ‖ π_train), E_sampler[e^d − 1 − d], and
    ``mismatch_coverage`` the measured fraction of the loss-mask tokens.
    """
    loss_mask = batch["loss_mask"]
    train = batch.get("train_logprobs", train_logp)
    measured = jnp.ones_like(loss_mask, dtype=bool)
    if LAG in batch:
        lag = batch[LAG]
        measured = lag == 0
        if LAGGED in batch:  # NaN where the previous weights' logprobs were not taken
            lagged = (lag == 1) & jnp.isfinite(batch[LAGGED])
            train = jnp.where(lagged, batch[LAGGED], train)
            measured = measured | lagged
    mask = loss_mask * measured.astype(loss_mask.dtype)
    d = train - batch.get("sampled_logprobs", batch["old_logprobs"])
    low, high = RATIO_BAND
    outside = (d < jnp.log(low)) | (d > jnp.log(high))
    return {
        "mismatch_abs_logp": masked_mean(jnp.abs(d), mask),
        "mismatch_abs_logp_p99": masked_p99(jnp.abs(d), mask),
        "ratio_out_of_band": masked_mean(outside.astype(jnp.float32), mask),
        "mismatch_kl": masked_mean(jnp.exp(d) - 1.0 - d, mask),
        "mismatch_coverage": jnp.sum(mask) / jnp.maximum(jnp.sum(loss_mask), 1.0),
    }


def unmeasured_dropped(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` without the mismatch's values when no token was measured (their zeros
    would read as a perfect match); the coverage stays."""
    if metrics.get("mismatch_coverage", 1.0) > 0:
        return metrics
    return {k: v for k, v in metrics.items() if k not in METRICS}


def lagged_tokens(lag: np.ndarray | None, loss_mask: np.ndarray) -> bool:
    """Whether the (global) batch has loss-mask tokens sampled one version back."""
    return lag is not None and bool(np.any((np.asarray(lag) == 1) & (np.asarray(loss_mask) > 0)))


def remembered(trainer: Trainer) -> Any:
    """The trainer's current weights, to keep as the previous version's once the update is
    applied (a copy where the step donates them), or None when not kept
    (``lagged_mismatch`` off, or several trainer processes)."""
    if not trainer.settings.lagged_mismatch or jax.process_count() > 1:
        return None
    params = trainer.state.params
    return jax.tree.map(jnp.copy, params) if trainer.donate_params else params


def with_lagged_logprobs(trainer: Trainer, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` (with a :data:`LAG`) plus :data:`LAGGED`: the trainer's logprobs of its
    targets under the previous version's weights (one forward without gradient) when it
    keeps them and the batch has tokens at lag 1, NaN otherwise (not measured; the key is
    there either way, so the step compiles once). ``arrays`` without a lag: unchanged."""
    if LAG not in arrays:
        return arrays
    previous = getattr(trainer, "previous_params", None)
    if previous is None or not lagged_tokens(arrays[LAG], arrays["loss_mask"]):
        return {**arrays, LAGGED: np.full(np.shape(arrays["loss_mask"]), np.nan, np.float32)}
    placed = trainer.device_batch(arrays)
    key = ("lagged_logprobs", tuple(sorted((k, np.ndim(v)) for k, v in placed.items())))
    if key not in trainer._compiled:

        def forward(params, batch):
            logp, _, _ = trainer._scan_forward(params, None, batch)
            return jax.lax.stop_gradient(logp.astype(jnp.float32))

        shardings = (trainer.param_shardings, trainer.batch_shardings(placed))
        jitted = jax.jit(forward, in_shardings=shardings)
        trainer._compiled[key] = executables.stored(PROGRAM, jitted, trainer.closure())
    logp = trainer._compiled[key](previous, placed)
    return {**arrays, LAGGED: np.asarray(jax.device_get(logp))}
