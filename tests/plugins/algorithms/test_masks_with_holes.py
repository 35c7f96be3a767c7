"""Algorithms on a multi-turn episode's mask: model tokens 1, observation tokens 0 (holes).

The two-turn episode used throughout: 2 model tokens, 2 observation tokens,
2 model tokens (positions 0..5 of one row), reward 1 at the end.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from rlax.plugins.algorithms.aggregation import AGGREGATIONS, aggregate
from rlax.plugins.algorithms.returns import Returns, gae, terminal_rewards

MASK = jnp.array([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]])
MODEL = np.array([0, 1, 4, 5])  # the positions on the mask


def test_terminal_reward_goes_to_the_last_model_token_not_to_each_turn_s_end():
    mask = jnp.array([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]])
    r = terminal_rewards(jnp.array([3.0]), mask)
    np.testing.assert_array_equal(r, [[0, 0, 0, 0, 0, 3, 0, 0]])


def test_gae_over_two_turns_by_hand():
    # Model tokens' values .5 .2 | .4 .8 (the observations' 9s must not leak); gamma 1,
    # lambda 0.5; the next token of position 1 is position 4.
    # deltas: t5 = 1 - .8 = .2; t4 = .8 - .4 = .4; t1 = .4 - .2 = .2; t0 = .2 - .5 = -.3
    # A: t5 = .2; t4 = .4 + .5 * .2 = .5; t1 = .2 + .5 * .5 = .45; t0 = -.3 + .5 * .45 = -.075
    values = jnp.array([[0.5, 0.2, 9.0, 9.0, 0.4, 0.8]])
    rewards = jnp.array([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    adv, ret = gae(rewards, values, MASK, gamma=1.0, lam=0.5)
    np.testing.assert_allclose(adv, [[-0.075, 0.45, 0, 0, 0.5, 0.2]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0.425, 0.65, 0, 0, 0.9, 1.0]], atol=1e-6)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (0.5, 0.0)])
def test_gae_with_holes_equals_gae_on_the_model_tokens_alone(gamma, lam):
    rng = np.random.default_rng(0)
    values = jnp.asarray(rng.normal(size=(1, 6)), jnp.float32)
    rewards = jnp.asarray(rng.normal(size=(1, 6)), jnp.float32) * MASK
    adv, ret = gae(rewards, values, MASK, gamma, lam)
    compact = jnp.ones((1, 4))
    adv_c, ret_c = gae(rewards[:, MODEL], values[:, MODEL], compact, gamma, lam)
    np.testing.assert_allclose(adv[:, MODEL], adv_c, atol=1e-6)
    np.testing.assert_allclose(ret[:, MODEL], ret_c, atol=1e-6)
    np.testing.assert_array_equal(adv[:, 2:4], 0.0)


def test_values_and_rewards_over_observations_do_not_leak():
    values = jnp.array([[0.5, 0.2, 0.0, 0.0, 0.4, 0.8]])
    rewards = jnp.array([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    base = gae(rewards, values, MASK, 0.9, 0.8)
    noisy = gae(rewards.at[0, 2:4].set(5.0), values.at[0, 2:4].set(-7.0), MASK, 0.9, 0.8)
    for a, b in zip(base, noisy):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_returns_with_v_zero_give_every_model_token_the_episode_reward():
    # REINFORCE++'s return-to-go (gamma = lambda = 1, V = 0): 1 on all four model tokens.
    batch = {"advantages": jnp.full((1, 6), 1.0) * MASK}
    adv, ret, _ = Returns()(batch, MASK, None)
    np.testing.assert_allclose(adv, [[1, 1, 0, 0, 1, 1]], atol=1e-6)
    np.testing.assert_allclose(ret, adv, atol=1e-6)


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", (1 + 2 + 3 + 4 + 6) / 5),  # the observations' 100s count nowhere
        ("seq-mean-token-mean", ((1 + 2 + 3 + 4) / 4 + 6 / 1) / 2),
        ("seq-mean-token-sum-norm", ((1 + 2 + 3 + 4) / 6 + 6 / 6) / 2),
        ("seq-mean-token-sum", ((1 + 2 + 3 + 4) + 6) / 2),
    ],
)
def test_every_aggregation_counts_only_model_tokens(mode, expected):
    x = jnp.array([[1.0, 2.0, 100.0, 100.0, 3.0, 4.0], [6.0, 100.0, 100.0, 0.0, 0.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    assert mode in AGGREGATIONS
    assert float(aggregate(x, mask, mode)) == pytest.approx(expected, rel=1e-6)
