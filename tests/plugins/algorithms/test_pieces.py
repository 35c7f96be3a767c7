"""The pieces algorithms are built from, each against hand-computed numbers."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax.plugins.algorithms.advantages import (
    group_centered,
    group_normalized,
    leave_one_out,
    raw_returns,
)
from rlax.plugins.algorithms.aggregation import Aggregation, aggregate
from rlax.plugins.algorithms.alignment import Alignment
from rlax.plugins.algorithms.objectives import (
    ClippedISWeight,
    ClippedSurrogate,
    SequenceClippedSurrogate,
)
from rlax.plugins.algorithms.returns import Returns, gae, terminal_rewards, whiten
from rlax.plugins.algorithms.value import ValueLoss

E = math.exp


# ---- sequence-level advantage estimators ------------------------------------------


def test_estimators_on_one_group_by_hand():
    r = np.array([[1.0, 0.0, 0.0]])  # mean 1/3, std (ddof 1) = sqrt(1/3)
    s = math.sqrt(1 / 3)
    np.testing.assert_allclose(
        group_normalized(r, eps=0.0), [[(2 / 3) / s, -(1 / 3) / s, -(1 / 3) / s]], rtol=1e-6
    )
    np.testing.assert_allclose(group_centered(r), [[2 / 3, -1 / 3, -1 / 3]], rtol=1e-6)
    # Leave-one-out: sample 0's baseline is mean(0, 0) = 0; sample 1's is mean(1, 0) = 0.5.
    np.testing.assert_allclose(leave_one_out(r), [[1.0, -0.5, -0.5]], rtol=1e-6)
    np.testing.assert_array_equal(raw_returns(r), r)


@pytest.mark.parametrize("estimator", [group_normalized, group_centered, leave_one_out])
def test_all_equal_groups_and_one_sample_groups_carry_no_signal(estimator):
    np.testing.assert_array_equal(estimator(np.array([[0.7, 0.7, 0.7, 0.7]])), np.zeros((1, 4)))
    np.testing.assert_array_equal(estimator(np.array([[1.0], [0.0]])), np.zeros((2, 1)))


def test_leave_one_out_is_a_rescaled_centering():
    r = np.array([[0.2, 0.9, 0.4, 0.1, 1.0]])
    np.testing.assert_allclose(leave_one_out(r), group_centered(r) * 5 / 4, rtol=1e-6)


def test_estimators_reject_flat_input():
    with pytest.raises(ValueError, match="groups, samples"):
        group_normalized(np.array([1.0, 0.0]))


# ---- aggregation -------------------------------------------------------------------

X = jnp.array([[1.0, 2.0, 3.0, 0.0], [10.0, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
M = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("mode", "max_len", "expected"),
    [
        ("token-mean", None, (1 + 2 + 3 + 10) / 4),
        ("seq-mean-token-mean", None, (2.0 + 10.0) / 2),
        ("seq-mean-token-sum-norm", None, (6 / 4 + 10 / 4) / 2),
        ("seq-mean-token-sum-norm", 8, (6 / 8 + 10 / 8) / 2),
        ("seq-mean-token-sum", None, (6 + 10) / 2),
    ],
)
def test_aggregations_by_hand_ignore_empty_rows(mode, max_len, expected):
    assert float(Aggregation(mode, max_len)(X, M)) == pytest.approx(expected)
    assert float(aggregate(X, M, mode, max_len)) == pytest.approx(expected)


def test_aggregation_weights_are_the_gradient():
    # d(token-mean)/dx = mask / 4; d(seq-mean-token-mean)/dx = mask / (N |o_i|).
    g = jax.grad(lambda x: Aggregation("token-mean")(x, M))(X)
    np.testing.assert_allclose(g, M / 4)
    g = jax.grad(lambda x: Aggregation("seq-mean-token-mean")(x, M))(X)
    np.testing.assert_allclose(g[0], [1 / 6, 1 / 6, 1 / 6, 0])
    np.testing.assert_allclose(g[1], [1 / 2, 0, 0, 0])
    np.testing.assert_allclose(g[2], 0)


@pytest.mark.parametrize("kwargs", [{"mode": "sum"}, {"mode": "token-mean", "max_len": 0}])
def test_invalid_aggregations_are_rejected(kwargs):
    with pytest.raises(ValueError, match="aggregation"):
        Aggregation(**kwargs)


# ---- per-token objectives -----------------------------------------------------------

# Row 0: A = +1, log-ratios 0.5 (above 1 + eps: clipped), 0 and -0.5 (below, but A > 0: kept).
# Row 1: A = -1, log-ratios -0.5 (below 1 - eps: clipped) and 0.5 (above, but A < 0: kept).
LOGRATIO = jnp.array([[0.5, 0.0, -0.5], [-0.5, 0.5, 0.0]])
ADV = jnp.array([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
MASK = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
OLD = jnp.array([[-1.0, -2.0, -0.5], [-1.5, -0.3, 0.0]])


def test_clipped_surrogate_clips_on_both_sides_by_hand():
    per_token, metrics = ClippedSurrogate(0.2, 0.2)(OLD + LOGRATIO, OLD, ADV, MASK)
    expected = [[-1.2, -1.0, -E(-0.5)], [0.8, E(0.5), 0.0]]
    np.testing.assert_allclose(per_token, expected, rtol=1e-6)
    assert float(metrics["clip_fraction_high"]) == pytest.approx(1 / 5)
    assert float(metrics["clip_fraction_low"]) == pytest.approx(1 / 5)
    assert float(metrics["clip_fraction"]) == pytest.approx(2 / 5)


def test_clipped_surrogate_gradient_is_zero_where_clipped():
    def loss(logp):
        per_token, _ = ClippedSurrogate(0.2, 0.28)(logp, OLD, ADV, MASK)
        return Aggregation("token-mean")(per_token, MASK)

    g = jax.grad(loss)(OLD + LOGRATIO)
    # d(-r A)/dlogp = -r A on unclipped tokens, divided by the 5 tokens of the batch.
    expected = [[0.0, -1 / 5, -E(-0.5) / 5], [0.0, E(0.5) / 5, 0.0]]
    np.testing.assert_allclose(g, expected, rtol=1e-6)


def test_clip_higher_moves_only_the_upper_bound():
    per_token, _ = ClippedSurrogate(0.2, 0.28)(OLD + LOGRATIO, OLD, ADV, MASK)
    assert float(per_token[0, 0]) == pytest.approx(-1.28)  # upper bound 1.28, not 1.2
    assert float(per_token[1, 0]) == pytest.approx(0.8)  # lower bound still 0.8


def test_sequence_ratio_is_clipped_per_sequence_by_hand():
    # Row 0: mean log-ratio 0.1 -> s = e^0.1 > 1 + 4e-4 with A = +1: clipped, no gradient.
    # Row 1: mean log-ratio 2e-4 -> s inside [1 - 3e-4, 1 + 4e-4], A = -1: loss s, gradient
    #        s / |o_1| per token, over N = 2 sequences.
    # Row 2: mean log-ratio -5e-4 < -3e-4 with A = -1: clipped below, no gradient.
    old = jnp.zeros((3, 3))
    logp = jnp.array([[0.3, -0.1, 0.1], [1e-4, 3e-4, 0.0], [-5e-4, 0.0, 0.0]])
    adv = jnp.array([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0], [-1.0, 0.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    objective = SequenceClippedSurrogate(3e-4, 4e-4)
    per_token, metrics = objective(logp, old, adv, mask)
    s1 = E(2e-4)
    np.testing.assert_allclose(per_token[:, 0], [-1.0004, s1, 0.9997], rtol=1e-6)
    assert float(metrics["clip_fraction"]) == pytest.approx(2 / 3)

    def loss(lp):
        return Aggregation("seq-mean-token-mean")(objective(lp, old, adv, mask)[0], mask)

    np.testing.assert_allclose(float(loss(logp)), (-1.0004 + s1 + 0.9997) / 3, rtol=1e-6)
    g = jax.grad(loss)(logp)
    np.testing.assert_allclose(g[0], 0.0, atol=1e-9)
    np.testing.assert_allclose(g[1], [s1 / 2 / 3, s1 / 2 / 3, 0.0], rtol=1e-5)
    np.testing.assert_allclose(g[2], 0.0, atol=1e-9)


def test_clipped_is_weight_keeps_the_gradient_of_clipped_tokens():
    # r = e^0.5 = 1.65 is clipped to 1.28; r = e^-1 = 0.37 is not (no lower bound).
    logp = jnp.array([[-1.0, -2.0]])
    old = jnp.array([[-1.5, -1.0]])
    adv = jnp.array([[2.0, 2.0]])
    mask = jnp.ones((1, 2))
    objective = ClippedISWeight(1.0, 0.28)
    per_token, metrics = objective(logp, old, adv, mask)
    np.testing.assert_allclose(per_token, [[-1.28 * 2 * -1.0, -E(-1) * 2 * -2.0]], rtol=1e-6)
    assert float(metrics["clip_fraction"]) == pytest.approx(0.5)
    g = jax.grad(lambda lp: Aggregation("token-mean")(objective(lp, old, adv, mask)[0], mask))(logp)
    np.testing.assert_allclose(g, [[-1.28 * 2 / 2, -E(-1) * 2 / 2]], rtol=1e-6)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ClippedSurrogate(0.0, 0.2),
        lambda: ClippedSurrogate(0.2, -0.1),
        lambda: SequenceClippedSurrogate(1.0, 4e-4),
        lambda: ClippedISWeight(1.5, 0.28),
    ],
)
def test_invalid_clip_ranges_are_rejected(make):
    with pytest.raises(ValueError, match="eps_low"):
        make()


# ---- token-level returns -------------------------------------------------------------


def test_terminal_reward_sits_on_the_last_masked_token():
    mask = jnp.array([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    r = terminal_rewards(jnp.array([2.0, -1.0, 5.0]), mask)
    np.testing.assert_array_equal(r, [[0, 0, 2, 0], [-1, 0, 0, 0], [0, 0, 0, 0]])


def test_gae_by_hand():
    # One completion of 3 tokens after one prompt position, reward 1 at the end.
    # delta = [0.2 - 0.5, 0.8 - 0.2, 1 - 0.8] = [-0.3, 0.6, 0.2]
    # A (gamma 1, lambda 0.5) = [-0.3 + 0.5 * 0.7, 0.6 + 0.5 * 0.2, 0.2] = [0.05, 0.7, 0.2]
    mask = jnp.array([[0.0, 1.0, 1.0, 1.0, 0.0]])
    values = jnp.array([[9.0, 0.5, 0.2, 0.8, 9.0]])  # off-mask values must not leak in
    rewards = jnp.array([[0.0, 0.0, 0.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    np.testing.assert_allclose(adv, [[0, 0.05, 0.7, 0.2, 0]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0, 0.55, 0.9, 1.0, 0]], atol=1e-6)


def test_gae_with_lambda_one_returns_discounted_returns_whatever_the_values():
    mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards = jnp.array([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    for values in (jnp.zeros((2, 3)), jnp.array([[0.5, 0.2, 0.8], [3.0, -1.0, 7.0]])):
        adv, ret = gae(rewards, values, mask, gamma=0.9, lam=1.0)
        np.testing.assert_allclose(ret, [[0.81, 0.9, 1.0], [1.8, 2.0, 0.0]], rtol=1e-6)
        np.testing.assert_allclose(adv, (ret - values) * mask, atol=1e-6)


def test_whiten_by_hand():
    x = jnp.array([[1.0, 1.0, 1.0, 7.0], [0.0, 0.0, 7.0, 7.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    # Masked tokens: [1, 1, 1, 0, 0], mean 0.6, variance 0.24.
    std = math.sqrt(0.24)
    np.testing.assert_allclose(
        whiten(x, mask), [[0.4 / std] * 3 + [0.0], [-0.6 / std] * 2 + [0.0, 0.0]], rtol=1e-5
    )
    np.testing.assert_array_equal(whiten(jnp.full((2, 4), 3.0), mask), jnp.zeros((2, 4)))


def test_returns_with_a_kl_penalty_in_the_reward_by_hand():
    # REINFORCE++: G_t = R - beta * sum_{s >= t} (old - ref)_s, then no whitening here.
    batch = {
        "advantages": jnp.array([[1.0, 1.0, 1.0]]),
        "train_logprobs": jnp.array([[-1.0, -2.0, -0.5]]),
        "ref_logprobs": jnp.array([[-1.5, -1.0, -0.5]]),
    }
    mask = jnp.ones((1, 3))
    returns = Returns(gamma=1.0, lam=1.0, kl_beta=0.1)
    assert returns.needs_reference and not Returns().needs_reference
    adv, ret, metrics = returns(batch, mask, None)
    k1 = [0.5, -1.0, 0.0]
    np.testing.assert_allclose(adv, [[1 - 0.1 * (0.5 - 1.0), 1 - 0.1 * -1.0, 1.0]], rtol=1e-6)
    np.testing.assert_allclose(ret, adv)
    assert float(metrics["reward_kl"]) == pytest.approx(sum(k1) / 3)
    # The metric alone (a minibatch whose returns came with its batch): the same number.
    assert float(returns.metrics(batch, mask)["reward_kl"]) == pytest.approx(sum(k1) / 3)
    assert Returns().metrics(batch, mask) == {}


# ---- alignment -------------------------------------------------------------------------

ALIGN_BATCH = {
    "loss_mask": jnp.array([[1.0, 1.0, 1.0, 0.0]]),
    "old_logprobs": jnp.array([[-2.0, -1.0, -0.5, 0.0]]),  # the sampler's
    "train_logprobs": jnp.array([[-1.0, -1.0, -1.0, 0.0]]),  # pi_train / pi_sampler = e, 1, e^-0.5
}


def test_no_alignment_measures_the_ratio_against_the_sampler():
    old, weight, mask, metrics = Alignment("none")(ALIGN_BATCH)
    np.testing.assert_array_equal(old, ALIGN_BATCH["old_logprobs"])
    np.testing.assert_array_equal(weight, jnp.ones((1, 4)))
    np.testing.assert_array_equal(mask, ALIGN_BATCH["loss_mask"])
    assert metrics == {}


def test_truncated_importance_sampling_by_hand():
    old, weight, mask, metrics = Alignment("tis", cap=2.0)(ALIGN_BATCH)
    np.testing.assert_array_equal(old, ALIGN_BATCH["train_logprobs"])
    np.testing.assert_allclose(weight[0, :3], [2.0, 1.0, E(-0.5)], rtol=1e-6)
    np.testing.assert_array_equal(mask, ALIGN_BATCH["loss_mask"])
    assert float(metrics["is_truncated_fraction"]) == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("bounds", "kept"), [((0.5, 2.0), [0, 1, 1, 0]), ((0.7, 3.0), [1, 1, 0, 0])]
)
def test_masked_importance_sampling_by_hand(bounds, kept):
    old, weight, mask, metrics = Alignment("mask", bounds=bounds)(ALIGN_BATCH)
    np.testing.assert_array_equal(old, ALIGN_BATCH["train_logprobs"])
    np.testing.assert_array_equal(weight, jnp.ones((1, 4)))
    np.testing.assert_array_equal(mask[0], kept)
    assert float(metrics["is_masked_fraction"]) == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "kwargs", [{"mode": "is"}, {"cap": 0.0}, {"bounds": (1.2, 2.0)}, {"bounds": (0.5, 0.9)}]
)
def test_invalid_alignments_are_rejected(kwargs):
    with pytest.raises(ValueError, match="alignment"):
        Alignment(**kwargs)


# ---- value loss ---------------------------------------------------------------------------


def test_value_loss_by_hand_and_clipping():
    loss_fn = ValueLoss(clip_eps=0.2, coef=0.5)
    mask = jnp.ones((1, 2))
    old = jnp.array([[0.2, 0.2]])
    returns = jnp.array([[1.0, 1.0]])
    # Token 0 moved 0.3 > 0.2 from its old value: clipped to 0.4, (0.4 - 1)^2 = 0.36 > 0.25.
    # Token 1 moved 0.1: inside the clip, (0.3 - 1)^2 = 0.49.
    values = jnp.array([[0.5, 0.3]])
    loss, metrics = loss_fn(values, old, returns, mask)
    assert float(metrics["value_loss"]) == pytest.approx(0.5 * (0.36 + 0.49) / 2)
    assert float(loss) == pytest.approx(0.5 * 0.5 * (0.36 + 0.49) / 2)
    assert float(metrics["value_clip_fraction"]) == pytest.approx(0.5)
    g = jax.grad(lambda v: loss_fn(v, old, returns, mask)[0])(values)
    # The clipped token's loss is flat in V; the other's gradient is coef * 0.5 * 2 (V - R) / 2.
    np.testing.assert_allclose(g, [[0.0, 0.5 * (0.3 - 1.0) / 2]], rtol=1e-6)


@pytest.mark.parametrize("kwargs", [{"model": "tied"}, {"clip_eps": 0.0}, {"coef": -1.0}])
def test_invalid_value_losses_are_rejected(kwargs):
    with pytest.raises(ValueError, match="value"):
        ValueLoss(**kwargs)
