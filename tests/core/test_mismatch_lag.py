"""The train/rollout mismatch compares a token with the weights that sampled it, not newer ones.

At the quickstart's staleness 1 every row is one version old: compared with the trainer's
current weights the metric showed the policy's last update (|Δlogp| 0.064 whatever the
sampler did). These tests hold the rule: by hand, per token, and as a law on a real
trainer -- a sampler that matches the previous version exactly shows float rounding.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax.core.trainer import mismatch
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.epochs import fixed_anchors, update_on_batch
from rlax.core.trainer.step import batch_arrays
from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.algorithms.grpo import grpo
from tests.core.test_epochs import groups, trainer_for

NAN = math.nan


def hand_batch(**extra):
    # d = train - old (old = 0): 0.1, 0.2, 0.3 / 0.4, 0.5 on the loss mask; 9.0 off it.
    return {
        "old_logprobs": jnp.zeros((2, 3)),
        "loss_mask": jnp.asarray([[1.0, 1, 1], [1, 1, 0]]),
        **extra,
    }


TRAIN = jnp.asarray([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
LAG = jnp.asarray([[0, 1, 2], [1, 0, 0]], jnp.int32)


def values(train, batch):
    return {k: float(v) for k, v in mismatch.mismatch_metrics(train, batch).items()}


def test_only_tokens_whose_weights_the_trainer_holds_are_measured_by_hand():
    without_lag = values(TRAIN, hand_batch())  # no lag: every token is the current version's
    assert without_lag["mismatch_abs_logp"] == pytest.approx((0.1 + 0.2 + 0.3 + 0.4 + 0.5) / 5)
    assert without_lag["mismatch_coverage"] == 1.0

    # Lag 0 at (0,0) and (1,1); lag 2 at (0,2) is never measured; no previous weights' logprobs.
    current_only = values(TRAIN, hand_batch(policy_lag=LAG))
    assert current_only["mismatch_abs_logp"] == pytest.approx((0.1 + 0.5) / 2)
    assert current_only["mismatch_coverage"] == pytest.approx(2 / 5)

    # The previous weights' logprobs: 0.05 at (0,1) is measured instead of the current 0.2;
    # (1,0) has none (NaN) and stays out.
    lagged = jnp.asarray([[7.0, 0.05, 7.0], [NAN, 7.0, 7.0]])
    both = values(TRAIN, hand_batch(policy_lag=LAG, lagged_logprobs=lagged))
    assert both["mismatch_abs_logp"] == pytest.approx((0.1 + 0.05 + 0.5) / 3)
    assert both["mismatch_coverage"] == pytest.approx(3 / 5)
    k3 = sum(math.exp(d) - 1 - d for d in (0.1, 0.05, 0.5)) / 3
    assert both["mismatch_kl"] == pytest.approx(k3, rel=1e-5)
    # Ratios e^0.1 = 1.105 and e^0.5 are out of [0.9, 1.1], e^0.05 in.
    assert both["ratio_out_of_band"] == pytest.approx(2 / 3)

    # Several updates bring the anchors: they are the trainer's side, not each update's logp.
    anchored = values(TRAIN + 3.0, hand_batch(policy_lag=LAG, train_logprobs=TRAIN))
    assert anchored["mismatch_abs_logp"] == pytest.approx(current_only["mismatch_abs_logp"])


def test_a_step_that_measured_nothing_reports_no_mismatch_rather_than_a_zero():
    stale = values(TRAIN, hand_batch(policy_lag=jnp.full((2, 3), 2, jnp.int32)))
    assert stale["mismatch_coverage"] == 0.0
    shown = mismatch.unmeasured_dropped(stale)
    assert not set(mismatch.METRICS) & set(shown) and shown["mismatch_coverage"] == 0.0
    measured = values(TRAIN, hand_batch())
    assert mismatch.unmeasured_dropped(measured) == measured


def completion(tokens, version, versions=None, loss_mask=None):
    n = len(tokens)
    return Completion(
        np.asarray(tokens, np.int32),
        np.zeros(n, np.float32),
        "",
        "stop",
        version,
        versions=None if versions is None else np.asarray(versions, np.int32),
        loss_mask=None if loss_mask is None else np.asarray(loss_mask, np.int8),
    )


def test_each_target_carries_its_own_versions_lag():
    prompt = Prompt("p", "", np.asarray([3, 4], np.int32), "")
    spanning = completion([5, 6, 7], 3, versions=[3, 3, 4])  # a partial rollout resumed
    episode = completion([5, 6, 7], 5, loss_mask=[1, 0, 1])  # an observation in the middle
    group = Group(prompt, (spanning, episode), np.zeros(2, np.float32))
    batch = make_batch([group], np.zeros((1, 2), np.float32), length_bucket=1, version=5)
    # P = 2: the completion's targets are positions 1..3.
    np.testing.assert_array_equal(batch.policy_lag[0], [0, 2, 2, 1])
    np.testing.assert_array_equal(batch.policy_lag[1], [0, 0, 0, 0])
    without = make_batch([group], np.zeros((1, 2), np.float32), length_bucket=1)
    assert without.policy_lag is None


def lagged_batch(trainer):
    """Four groups sampled by version 0, trained as version 1, their recorded logprobs the
    trainer's own under version 0's weights (a sampler that matches it exactly)."""
    gs = groups()
    batch = make_batch(gs, grpo().advantages(np.stack([g.rewards for g in gs])), version=1)
    arrays = batch_arrays(batch)
    v0 = fixed_anchors(trainer, arrays)["train_logprobs"]
    arrays["old_logprobs"] = (v0 * arrays["loss_mask"]).astype(np.float32)
    assert np.all(arrays["policy_lag"][arrays["loss_mask"] > 0] == 1)
    return arrays, batch.group_ids


def update(trainer, arrays, group_ids, step=0):
    return update_on_batch(trainer, arrays, arrays, seed=0, step=step, group_ids=group_ids)


@pytest.mark.parametrize(
    "settings", [{}, {"epochs": 2, "minibatches": 2}], ids=["one update", "2x2 updates"]
)
@pytest.mark.parametrize("donate", [False, True], ids=["kept", "donated"])
def test_a_sampler_that_matches_the_previous_version_shows_rounding_not_the_update(
    settings, donate
):
    trainer = trainer_for(grpo(), lr=1.0, **settings)
    trainer.donate_params = donate
    arrays, group_ids = lagged_batch(trainer)
    before = [np.asarray(x) for x in jax.tree.leaves(trainer.state.params)]
    # Version 0 trains on its own rows (lag 0): the same weights on both sides.
    first = update(trainer, dict(arrays, policy_lag=np.zeros_like(arrays["policy_lag"])), group_ids)
    assert first["mismatch_coverage"] == 1.0 and first["mismatch_abs_logp"] < 1e-5
    kept = [np.asarray(x) for x in jax.tree.leaves(trainer.previous_params)]
    for a, b in zip(before, kept, strict=True):  # version 0's weights, whatever was donated
        np.testing.assert_array_equal(a, b)
    # The update moved the policy: against the current weights the same rows differ.
    moved = fixed_anchors(trainer, arrays)["train_logprobs"]
    change = np.abs(moved - arrays["old_logprobs"])[arrays["loss_mask"] > 0].mean()
    assert change > 1e-3

    second = update(trainer, arrays, group_ids, step=1)
    assert second["mismatch_coverage"] == 1.0
    assert second["mismatch_abs_logp"] < 1e-5 < change
    assert second["ratio_out_of_band"] == 0.0


def test_without_the_previous_weights_lagged_tokens_are_not_measured():
    trainer = trainer_for(grpo(), lr=1.0, lagged_mismatch=False)
    arrays, group_ids = lagged_batch(trainer)
    update(trainer, arrays, group_ids)
    assert trainer.previous_params is None
    metrics = update(trainer, arrays, group_ids, step=1)
    assert metrics["mismatch_coverage"] == 0.0
    assert not set(mismatch.METRICS) & set(metrics)
