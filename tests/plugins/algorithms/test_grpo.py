"""GRPO's pieces against hand-computed numbers."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rlax.plugins.algorithms.grpo import GRPO, aggregate, clipped_surrogate, group_advantages, k3_kl


def test_group_advantages_by_hand():
    # mean 0.5; std with ddof=1 = sqrt(4 * 0.25 / 3) = 0.57735...
    adv = group_advantages(np.array([[1.0, 0.0, 0.0, 1.0]]), eps=0.0)
    expected = 0.5 / math.sqrt(1 / 3)
    np.testing.assert_allclose(adv, [[expected, -expected, -expected, expected]], rtol=1e-6)


def test_group_advantages_uses_ddof1_not_population_std():
    adv = group_advantages(np.array([[0.0, 2.0]]), eps=0.0)
    # ddof=1: std = sqrt(2) -> A = (0 - 1)/sqrt(2); ddof=0 would give -1.
    np.testing.assert_allclose(adv, [[-1 / math.sqrt(2), 1 / math.sqrt(2)]], rtol=1e-6)


def test_equal_rewards_give_zero_advantage_and_rows_are_independent():
    adv = group_advantages(np.array([[1.0, 1.0, 1.0], [0.0, 3.0, 6.0]]))
    np.testing.assert_array_equal(adv[0], [0.0, 0.0, 0.0])
    np.testing.assert_allclose(adv[1], [-1.0, 0.0, 1.0], rtol=1e-5)  # std = 3


def test_advantages_are_shift_and_scale_invariant():
    r = np.array([[0.2, 0.9, 0.4, 0.4, 0.1]])
    np.testing.assert_allclose(group_advantages(r), group_advantages(3 * r + 7), atol=1e-5)


def test_clipped_surrogate_by_hand():
    # ratio e^0.5 = 1.6487 > 1.2 with A = +1: clipped to 1.2 -> loss -1.2, counted as clipped.
    # ratio e^-0.5 = 0.6065 < 0.8 with A = +1: min(0.6065, 0.8) = 0.6065 -> not clipped.
    # ratio e^0.5 with A = -1: min(-1.6487, -1.2) = -1.6487 -> not clipped (pessimistic bound).
    logratio = jnp.array([0.5, -0.5, 0.5])
    adv = jnp.array([1.0, 1.0, -1.0])
    loss, clipped = clipped_surrogate(logratio, adv, 0.2, 0.2)
    np.testing.assert_allclose(loss, [-1.2, -math.exp(-0.5), math.exp(0.5)], rtol=1e-6)
    np.testing.assert_array_equal(clipped, [True, False, False])


def test_asymmetric_clip_uses_high_bound_above_one():
    loss, _ = clipped_surrogate(jnp.array([1.0]), jnp.array([2.0]), 0.2, 0.28)
    np.testing.assert_allclose(loss, [-2 * 1.28], rtol=1e-6)


def test_k3_kl_is_zero_at_equality_and_positive_elsewhere():
    logp = jnp.array([-1.0, -1.0, -2.0])
    ref = jnp.array([-1.0, -2.0, -1.0])
    kl = k3_kl(logp, ref)
    np.testing.assert_allclose(kl, [0.0, math.exp(-1) + 1 - 1, math.exp(1) - 1 - 1], rtol=1e-6)
    assert np.all(np.asarray(kl) >= 0)


def test_aggregations_by_hand():
    x = jnp.array([[1.0, 2.0, 3.0, 0.0], [10.0, 0.0, 0.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert float(aggregate(x, mask, "token-mean")) == pytest.approx((1 + 2 + 3 + 10) / 4)
    assert float(aggregate(x, mask, "seq-mean-token-mean")) == pytest.approx((2.0 + 10.0) / 2)
    assert float(aggregate(x, mask, "seq-mean-token-sum-norm")) == pytest.approx(
        (6 / 4 + 10 / 4) / 2
    )
    assert float(aggregate(x, mask, "seq-mean-token-sum-norm", max_len=8)) == pytest.approx(
        (6 / 8 + 10 / 8) / 2
    )


def test_empty_rows_do_not_count_as_sequences():
    x = jnp.array([[4.0, 2.0], [9.0, 9.0]])
    mask = jnp.array([[1.0, 1.0], [0.0, 0.0]])
    assert float(aggregate(x, mask, "seq-mean-token-mean")) == pytest.approx(3.0)


def test_grpo_loss_on_policy_is_minus_mean_advantage():
    # Ratio 1 everywhere: loss = -(seq-mean of token-mean of A).
    batch = {
        "loss_mask": jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
        "old_logprobs": jnp.array([[-0.3, -0.2, 0.0], [-1.0, 0.0, 0.0]]),
        "advantages": jnp.array([[0.5, 0.5, 0.0], [-2.0, 0.0, 0.0]]),
    }
    loss, metrics = GRPO().loss(batch["old_logprobs"], batch)
    assert float(loss) == pytest.approx(-(0.5 + -2.0) / 2)
    assert float(metrics["clip_fraction"]) == 0.0


def test_grpo_kl_term_added_with_beta():
    batch = {
        "loss_mask": jnp.array([[1.0]]),
        "old_logprobs": jnp.array([[-1.0]]),
        "advantages": jnp.array([[0.0]]),
        "ref_logprobs": jnp.array([[-2.0]]),
    }
    algo = GRPO(kl_beta=0.5)
    assert algo.needs_reference and not GRPO().needs_reference
    loss, metrics = algo.loss(jnp.array([[-1.0]]), batch)
    kl = math.exp(-1) + 1 - 1
    assert float(metrics["kl_ref"]) == pytest.approx(kl, rel=1e-6)
    assert float(loss) == pytest.approx(0.5 * kl, rel=1e-6)


@pytest.mark.parametrize("kwargs", [{"aggregation": "sum"}, {"clip_eps": 0.0}, {"kl_beta": -1.0}])
def test_invalid_settings_are_rejected(kwargs):
    with pytest.raises(ValueError, match="grpo"):
        GRPO(**kwargs)
