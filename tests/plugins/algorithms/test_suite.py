"""Every algorithm of the suite on one small ragged batch: advantages, loss and its gradient.

The batch: one group of G = 4 completions of lengths 3, 1, 2 and 4 (T = 4), rewards
[1, 0, 0, 0], on-policy (new = old logprobs, so every ratio is 1). Expected values
are written from each paper's formula, not from the library's pieces.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax.plugins.algorithms.cispo import cispo
from rlax.plugins.algorithms.dapo import dapo
from rlax.plugins.algorithms.drgrpo import drgrpo
from rlax.plugins.algorithms.grpo import grpo
from rlax.plugins.algorithms.gspo import gspo
from rlax.plugins.algorithms.ppo import ppo
from rlax.plugins.algorithms.reinforcepp import reinforcepp, reinforcepp_baseline
from rlax.plugins.algorithms.rloo import rloo
from rlax.plugins.critics.head import HeadCritic
from rlax.plugins.critics.separate import SeparateCritic

REWARDS = np.array([[1.0, 0.0, 0.0, 0.0]])
LENGTHS = [3, 1, 2, 4]
N, TOKENS = 4, sum(LENGTHS)
MASK = np.array([[1.0] * n + [0.0] * (4 - n) for n in LENGTHS])
OLD = -np.array(
    [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8], [0.9, 1.0, 1.1, 1.2], [1.3, 1.4, 1.5, 1.6]]
)
OLD = OLD * MASK
# Group statistics by hand: mean 1/4, std (ddof 1) = sqrt((9/16 + 3/16) / 3) = 1/2.
GRPO_A = np.array([1.5, -0.5, -0.5, -0.5])
CENTERED_A = np.array([0.75, -0.25, -0.25, -0.25])
LOO_A = np.array([1.0, -1 / 3, -1 / 3, -1 / 3])  # R_i - mean of the other three


def batch_for(algo, rewards=REWARDS, mask=MASK, old=OLD):
    adv = algo.advantages(rewards).reshape(-1)
    arrays = {
        "loss_mask": mask,
        "old_logprobs": old,
        "train_logprobs": old,
        "advantages": adv[:, None] * mask,
    }
    if algo.needs_critic:
        arrays["values"] = arrays["old_values"] = np.zeros_like(mask)
    return {k: jnp.asarray(v, jnp.float32) for k, v in arrays.items()}


def loss_and_grad(algo, batch):
    (loss, metrics), grad = jax.value_and_grad(algo.loss, has_aux=True)(
        batch["old_logprobs"], batch
    )
    return float(loss), metrics, np.asarray(grad)


def per_row(values):
    """A [N] per-sequence value on every masked token."""
    return np.asarray(values)[:, None] * MASK


def whitened(x):
    """Normalisation over the masked tokens of the batch (population std)."""
    tokens = x[MASK > 0]
    return (x - tokens.mean()) / math.sqrt(tokens.var() + 1e-8) * MASK


L = np.array(LENGTHS, float)


@pytest.mark.parametrize(
    ("make", "advantages", "loss", "grad"),
    [
        # GRPO: seq-mean-token-mean; on-policy the loss is -mean_i A_i = 0.
        (grpo, GRPO_A, 0.0, per_row(-GRPO_A / (N * L))),
        # DAPO: token-mean: -sum_i |o_i| A_i / sum_i |o_i| = -(4.5 - 0.5 - 1 - 2) / 10.
        (dapo, GRPO_A, -0.1, per_row(-GRPO_A / TOKENS)),
        # Dr.GRPO: A = R - mean, every token weighted 1 / (G * L_max) = 1 / 16.
        (
            lambda: drgrpo(max_len=4),
            CENTERED_A,
            -(2.25 - 0.25 - 0.5 - 1.0) / 16,
            per_row(-CENTERED_A / (N * 4)),
        ),
        # GSPO on-policy: s_i = 1, loss -mean_i A_i; gradient A_i spread over the row's tokens.
        (gspo, GRPO_A, 0.0, per_row(-GRPO_A / (N * L))),
        # CISPO: -sg(r) A logp with r = 1: the loss is the advantage-weighted log-likelihood.
        (cispo, GRPO_A, -float(np.sum(per_row(GRPO_A) * OLD)) / TOKENS, per_row(-GRPO_A / TOKENS)),
        # RLOO: the sequence is one action (token-sum), mean over sequences.
        (rloo, LOO_A, -(3.0 - 1 / 3 - 2 / 3 - 4 / 3) / 4, per_row(-LOO_A / N)),
    ],
)
def test_group_algorithms_by_hand(make, advantages, loss, grad):
    algo = make()
    np.testing.assert_allclose(algo.advantages(REWARDS)[0], advantages, rtol=1e-5)
    got_loss, metrics, got_grad = loss_and_grad(algo, batch_for(algo))
    assert got_loss == pytest.approx(loss, abs=1e-5)
    np.testing.assert_allclose(got_grad, grad, rtol=1e-4, atol=1e-7)
    assert float(metrics["clip_fraction"]) == 0.0  # on-policy nothing clips


def test_reinforcepp_normalises_over_the_batch_tokens_by_hand():
    algo = reinforcepp()
    np.testing.assert_array_equal(algo.advantages(REWARDS), REWARDS)  # raw rewards to the step
    # Token returns: 1 on the 3 tokens of row 0, 0 on the 7 others: mean 0.3, variance 0.21.
    a_hat = whitened(per_row(REWARDS[0]))
    np.testing.assert_allclose(a_hat[0, :3], 0.7 / math.sqrt(0.21), rtol=1e-6)
    loss, _, grad = loss_and_grad(algo, batch_for(algo))
    assert loss == pytest.approx(-float(np.sum(a_hat)) / TOKENS, abs=1e-6)
    np.testing.assert_allclose(grad, -a_hat / TOKENS, rtol=1e-4, atol=1e-7)


def test_reinforcepp_baseline_subtracts_the_group_mean_first():
    # Two groups of two one-token completions; group 1 is all-correct.
    rewards = np.array([[1.0, 0.0], [1.0, 1.0]])
    mask = np.ones((4, 1))
    old = -np.ones((4, 1))
    plain, baseline = reinforcepp(), reinforcepp_baseline()
    # REINFORCE++: [1, 0, 1, 1] whitened: mean 0.75, variance 0.1875; the all-correct
    # group gets a positive advantage because the batch as a whole did worse.
    _, _, g_plain = loss_and_grad(plain, batch_for(plain, rewards, mask, old))
    expected = -(np.array([1.0, 0.0, 1.0, 1.0]) - 0.75) / math.sqrt(0.1875 + 1e-8) / 4
    np.testing.assert_allclose(g_plain[:, 0], expected, rtol=1e-5)
    # -baseline: [0.5, -0.5, 0, 0] whitened: mean 0, variance 0.125; the all-correct group: 0.
    np.testing.assert_allclose(baseline.advantages(rewards), [[0.5, -0.5], [0.0, 0.0]])
    _, _, g_base = loss_and_grad(baseline, batch_for(baseline, rewards, mask, old))
    expected = -np.array([0.5, -0.5, 0.0, 0.0]) / math.sqrt(0.125 + 1e-8) / 4
    np.testing.assert_allclose(g_base[:, 0], expected, rtol=1e-5)


def test_ppo_gae_advantages_and_value_loss_by_hand():
    algo = ppo(lam=0.95, gamma=1.0, vf_coef=0.5)
    assert algo.needs_critic and algo.value_model == HeadCritic()
    batch = batch_for(algo)
    # V = 0 everywhere: delta_t = r_t, so A_t = lambda^(distance to the last token) * R.
    gae = np.zeros((4, 4))
    gae[0, :3] = [0.95**2, 0.95, 1.0]
    a_hat = whitened(gae)

    def loss(logp, values):
        return algo.loss(logp, dict(batch, values=values))[0]

    g_logp, g_values = jax.grad(loss, argnums=(0, 1))(batch["old_logprobs"], batch["values"])
    np.testing.assert_allclose(g_logp, -a_hat / TOKENS, rtol=1e-4, atol=1e-7)
    # Value loss 0.5 * 0.5 * mean_t (V - R)^2 with returns R = A + V = the GAE above.
    np.testing.assert_allclose(g_values, 0.5 * (0.0 - gae) / TOKENS, rtol=1e-5, atol=1e-8)
    total, metrics = algo.loss(batch["old_logprobs"], batch)
    value_loss = 0.5 * float(np.sum(gae**2)) / TOKENS
    assert float(metrics["value_loss"]) == pytest.approx(value_loss, rel=1e-5)
    assert float(total) == pytest.approx(
        -float(np.sum(a_hat)) / TOKENS + 0.5 * value_loss, abs=1e-6
    )


def test_ppo_separate_value_model_and_reference_flags():
    assert ppo(value_model=SeparateCritic()).value_model == SeparateCritic()
    assert ppo(kl_beta=0.05).needs_reference and not ppo().needs_reference
    assert reinforcepp(kl_beta=0.01).needs_reference
    assert grpo(kl_beta=0.1).needs_reference and not dapo().needs_reference
    with pytest.raises(AttributeError, match="no critic"):
        _ = grpo().value_model


GROUP_ALGORITHMS = [grpo, dapo, lambda: drgrpo(max_len=4), gspo, cispo, rloo]


@pytest.mark.parametrize("make", GROUP_ALGORITHMS)
def test_all_equal_groups_give_no_gradient(make):
    # Group 0 is all correct, group 1 is mixed: only group 1's tokens move.
    algo = make()
    rewards = np.array([[1.0, 1.0], [1.0, 0.0]])
    mask = MASK
    _, _, grad = loss_and_grad(algo, batch_for(algo, rewards, mask, OLD))
    np.testing.assert_array_equal(grad[:2], 0.0)
    assert np.all(grad[2][mask[2] > 0] < 0) and np.all(grad[3][mask[3] > 0] > 0)


@pytest.mark.parametrize("make", GROUP_ALGORITHMS)
def test_one_sample_groups_give_no_gradient(make):
    algo = make()
    rewards = np.array([[1.0], [0.0], [1.0], [0.0]])
    loss, _, grad = loss_and_grad(algo, batch_for(algo, rewards))
    np.testing.assert_array_equal(grad, 0.0)
    assert loss == 0.0


def test_one_sample_groups_still_teach_reinforcepp():
    algo = reinforcepp()
    rewards = np.array([[1.0], [0.0], [1.0], [0.0]])
    _, _, grad = loss_and_grad(algo, batch_for(algo, rewards))
    assert np.all(grad[[0, 2]][MASK[[0, 2]] > 0] < 0) and np.all(grad[[1, 3]][MASK[[1, 3]] > 0] > 0)


def test_tis_weights_each_tokens_gradient_by_the_truncated_ratio():
    # The trainer's logprobs differ from the sampler's on row 0: pi_train / pi_sampler = e^1
    # (truncated to 2) and e^-0.5 on its first two tokens; the ratio is measured against
    # pi_train, so on-policy for the trainer every ratio is 1 and the gradient is -w A / 10.
    algo = dapo(alignment="tis", is_cap=2.0)
    batch = batch_for(algo)
    sampler = batch["old_logprobs"].at[0, 0].add(-1.0).at[0, 1].add(0.5)
    batch = dict(batch, old_logprobs=sampler)
    (_, metrics), grad = jax.value_and_grad(algo.loss, has_aux=True)(batch["train_logprobs"], batch)
    weight = np.ones((4, 4))
    weight[0, :2] = [2.0, math.exp(-0.5)]
    np.testing.assert_allclose(grad, -weight * per_row(GRPO_A) / TOKENS, rtol=1e-5, atol=1e-8)
    assert float(metrics["is_truncated_fraction"]) == pytest.approx(1 / TOKENS)


def test_masked_is_drops_mismatched_tokens_from_loss_and_denominator():
    algo = dapo(alignment="mask", is_bounds=(0.5, 2.0))
    batch = batch_for(algo)
    batch = dict(batch, old_logprobs=batch["old_logprobs"].at[0, 0].add(-1.0))  # ratio e > 2
    loss, _ = algo.loss(batch["train_logprobs"], batch)
    grad = jax.grad(lambda lp: algo.loss(lp, batch)[0])(batch["train_logprobs"])
    kept = MASK.copy()
    kept[0, 0] = 0.0
    np.testing.assert_allclose(grad, -per_row(GRPO_A) * kept / 9, rtol=1e-5, atol=1e-8)
    assert float(loss) == pytest.approx(-float(np.sum(per_row(GRPO_A) * kept)) / 9, rel=1e-5)


def test_without_alignment_the_ratio_is_taken_against_the_sampler():
    # Same mismatch as above, alignment "none": r = pi_new / pi_sampler = e on row 0, token 0,
    # where A > 0 -> clipped by DAPO's upper bound (1.28): no gradient there.
    algo = dapo()
    batch = batch_for(algo)
    batch = dict(batch, old_logprobs=batch["old_logprobs"].at[0, 0].add(-1.0))
    grad = jax.grad(lambda lp: algo.loss(lp, batch)[0])(batch["train_logprobs"])
    assert float(grad[0, 0]) == 0.0 and float(grad[0, 1]) == pytest.approx(-1.5 / TOKENS, rel=1e-5)


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: grpo(aggregation="sum"), "grpo"),
        (lambda: dapo(eps_high=0.0), "dapo"),
        (lambda: drgrpo(max_len=0), "drgrpo"),
        (lambda: gspo(alignment="always"), "gspo"),
        (lambda: cispo(eps_low=2.0), "cispo"),
        (lambda: rloo(is_cap=-1.0), "rloo"),
        (lambda: reinforcepp(kl_beta=-0.1), "reinforcepp"),
        (lambda: ppo(value_model="tied"), "ppo"),  # a name is not a critic
        (lambda: ppo(lam=1.5), "ppo"),
    ],
)
def test_invalid_settings_name_the_algorithm(make, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        make()


# ---- clipping on both sides, off-policy, for every algorithm ------------------------------

# New logprobs move from the old ones on four tokens (every other ratio stays 1):
#   row 0 (A > 0), token 0: r = e^0.5 above 1 + eps_high -> clipped, no gradient;
#   row 0 (A > 0), token 1: r = e^-0.5 below 1 - eps_low, but for A > 0 the lower clip never binds;
#   row 1 (A < 0), token 0: r = e^-0.5 below 1 - eps_low -> clipped, no gradient;
#   row 2 (A < 0), token 0: r = e^0.5 above 1 + eps_high, but for A < 0 the upper clip never binds.
SHIFT = np.zeros((4, 4))
SHIFT[0, 0], SHIFT[0, 1], SHIFT[1, 0], SHIFT[2, 0] = 0.5, -0.5, -0.5, 0.5
CLIPPED = np.zeros((4, 4), bool)
CLIPPED[0, 0] = CLIPPED[1, 0] = True
# Per-token advantages of the batch-normalised estimators (see the tests above).
PPO_GAE = np.zeros((4, 4))
PPO_GAE[0, :3] = [0.95**2, 0.95, 1.0]
# Aggregation weight of each token: loss = sum_t weight_t * per-token loss.
SEQ_MEAN = per_row(1 / (N * L))
TOKEN_MEAN = MASK / TOKENS


@pytest.mark.parametrize(
    ("make", "advantages", "weight", "eps_low", "eps_high"),
    [
        (grpo, per_row(GRPO_A), SEQ_MEAN, 0.2, 0.2),
        (dapo, per_row(GRPO_A), TOKEN_MEAN, 0.2, 0.28),
        (lambda: drgrpo(max_len=4), per_row(CENTERED_A), MASK / (N * 4), 0.2, 0.2),
        (rloo, per_row(LOO_A), MASK / N, 0.2, 0.2),
        (reinforcepp, whitened(per_row(REWARDS[0])), TOKEN_MEAN, 0.2, 0.2),
        (reinforcepp_baseline, whitened(per_row(CENTERED_A)), TOKEN_MEAN, 0.2, 0.2),
        (ppo, whitened(PPO_GAE), TOKEN_MEAN, 0.2, 0.2),
    ],
    ids=["grpo", "dapo", "drgrpo", "rloo", "reinforcepp", "reinforcepp_baseline", "ppo"],
)
def test_token_clipping_on_both_sides_by_hand(make, advantages, weight, eps_low, eps_high):
    algo = make()
    batch = batch_for(algo)
    ratio = np.exp(SHIFT) * MASK
    per_token = -np.minimum(
        ratio * advantages, np.clip(ratio, 1 - eps_low, 1 + eps_high) * advantages
    )
    (loss, metrics), grad = jax.value_and_grad(algo.loss, has_aux=True)(
        batch["old_logprobs"] + SHIFT, batch
    )
    policy_loss = float(loss) - 0.5 * float(metrics.get("value_loss", 0.0))  # PPO's c_V = 0.5
    assert policy_loss == pytest.approx(float(np.sum(weight * per_token)), abs=1e-6)
    expected = np.where(CLIPPED, 0.0, -ratio * advantages * weight)
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-7)
    assert float(metrics["clip_fraction_high"]) == pytest.approx(1 / TOKENS)
    assert float(metrics["clip_fraction_low"]) == pytest.approx(1 / TOKENS)


@pytest.mark.parametrize(("eps_low", "low_binds"), [(1.0, False), (0.2, True)])
def test_cispo_clips_the_weight_on_both_sides_and_keeps_every_gradient(eps_low, low_binds):
    # CISPO bounds the IS weight, never the gradient: d loss / d logp = -clip(r) A / T everywhere.
    algo = cispo(eps_low=eps_low)
    batch = batch_for(algo)
    logp = batch["old_logprobs"] + SHIFT
    ratio = np.exp(SHIFT) * MASK
    w = np.clip(ratio, 1 - eps_low, 1 + 0.28)
    if not low_binds:  # the paper's default: no lower bound, e^-0.5 is kept as it is
        np.testing.assert_allclose(w[0, 1], math.exp(-0.5))
    else:
        assert w[0, 1] == w[1, 0] == pytest.approx(0.8)
    (loss, metrics), grad = jax.value_and_grad(algo.loss, has_aux=True)(logp, batch)
    a = per_row(GRPO_A)
    assert float(loss) == pytest.approx(float(np.sum(-w * a * np.asarray(logp))) / TOKENS, abs=1e-6)
    np.testing.assert_allclose(grad, -w * a / TOKENS, rtol=1e-5, atol=1e-8)
    assert float(metrics["clip_fraction"]) == pytest.approx((4 if low_binds else 2) / TOKENS)


def test_gspo_clips_the_sequence_ratio_on_both_sides_by_hand():
    # Whole rows move: s_0 = e^0.01 > 1 + 4e-4 with A > 0 and s_1 = e^-0.01 < 1 - 3e-4 with
    # A < 0 are clipped (no gradient for their tokens); s_2 = e^0.01 with A < 0 is not.
    algo = gspo()
    batch = batch_for(algo)
    shift = np.array([0.01, -0.01, 0.01, 0.0])[:, None] * MASK
    s = np.exp([0.01, -0.01, 0.01, 0.0])
    (loss, metrics), grad = jax.value_and_grad(algo.loss, has_aux=True)(
        batch["old_logprobs"] + shift, batch
    )
    per_seq = -np.minimum(s * GRPO_A, np.clip(s, 1 - 3e-4, 1 + 4e-4) * GRPO_A)
    assert float(loss) == pytest.approx(float(np.mean(per_seq)), abs=1e-6)
    expected = per_row(np.array([0.0, 0.0, 1.0, 1.0]) * -s * GRPO_A / (N * L))
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-7)
    assert float(metrics["clip_fraction"]) == pytest.approx(0.5)


# ---- batch-level baselines on one-sample and all-equal groups ----------------------------


@pytest.mark.parametrize(
    ("make", "rewards", "advantages"),
    [
        # One-sample groups: REINFORCE++ and PPO (critic 0) whiten [1, 0, 1, 0] to +-1 ...
        (reinforcepp, [[1.0], [0.0], [1.0], [0.0]], [1.0, -1.0, 1.0, -1.0]),
        (ppo, [[1.0], [0.0], [1.0], [0.0]], [1.0, -1.0, 1.0, -1.0]),
        # ... while -baseline centres each one-sample group to 0 first: no signal left.
        (reinforcepp_baseline, [[1.0], [0.0], [1.0], [0.0]], [0.0, 0.0, 0.0, 0.0]),
        # An all-correct group beside a mixed one: [1, 1, 1, 0] has mean 0.75, variance 3/16.
        (ppo, [[1.0, 1.0], [1.0, 0.0]], np.array([0.25, 0.25, 0.25, -0.75]) / math.sqrt(3 / 16)),
    ],
    ids=["reinforcepp-one-sample", "ppo-one-sample", "baseline-one-sample", "ppo-all-equal"],
)
def test_batch_level_baselines_on_one_sample_and_all_equal_groups(make, rewards, advantages):
    algo = make()
    mask, old = np.ones((4, 1)), -np.ones((4, 1))
    _, _, grad = loss_and_grad(algo, batch_for(algo, np.array(rewards), mask, old))
    np.testing.assert_allclose(grad[:, 0], -np.asarray(advantages) / 4, rtol=1e-5, atol=1e-7)
