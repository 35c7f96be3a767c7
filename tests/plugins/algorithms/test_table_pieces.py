"""The rest of the algorithm table, by hand: dual clip, the KL estimators, sequence-level
IS correction, IcePop's ratio-bound masking and on-policy distillation."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax.plugins.algorithms.aggregation import Aggregation
from rlax.plugins.algorithms.alignment import Alignment
from rlax.plugins.algorithms.distill import distill
from rlax.plugins.algorithms.distillation import Distillation
from rlax.plugins.algorithms.grpo import grpo
from rlax.plugins.algorithms.objectives import ClippedSurrogate, kl_estimate
from rlax.plugins.algorithms.policy_gradient import PolicyGradient
from rlax.plugins.algorithms.ppo import ppo

f32 = jnp.float32


def grad_of(fn, x):
    return np.asarray(jax.grad(lambda v: fn(v)[0].sum())(x))


# ---- dual clip (Ye et al. 2020) --------------------------------------------------------


def test_dual_clip_bounds_the_loss_of_negative_advantages_by_hand():
    # Ratios 4, 2, 4 with A = -1, -1, +1; eps 0.2, c = 3.
    ratio = jnp.array([[4.0, 2.0, 4.0]])
    adv = jnp.array([[-1.0, -1.0, 1.0]])
    mask = jnp.ones((1, 3))
    old = jnp.zeros((1, 3))
    obj = ClippedSurrogate(0.2, 0.2, dual_clip=3.0)
    loss, metrics = obj(jnp.log(ratio), old, adv, mask)
    # Token 0: PPO's loss max(4, 1.2) = 4 is cut to c|A| = 3. Token 1: 2 < 3 stays.
    # Token 2 (A > 0): the ordinary clip, -min(4, 1.2) = -1.2.
    np.testing.assert_allclose(loss, [[3.0, 2.0, -1.2]], rtol=1e-6)
    assert float(metrics["dual_clip_fraction"]) == pytest.approx(1 / 3)
    # Gradient w.r.t. logp: 0 where a clip holds, -r A = 2 on token 1.
    g = grad_of(lambda lp: obj(lp, old, adv, mask), jnp.log(ratio))
    np.testing.assert_allclose(g, [[0.0, 2.0, 0.0]], atol=1e-6)
    # Without dual clip token 0's loss is PPO's 4.
    plain, _ = ClippedSurrogate(0.2, 0.2)(jnp.log(ratio), old, adv, mask)
    assert float(plain[0, 0]) == pytest.approx(4.0)


def test_dual_clip_must_lie_above_the_upper_clip():
    with pytest.raises(ValueError, match="dual_clip must be > 1 \\+ eps_high"):
        ClippedSurrogate(0.2, 0.2, dual_clip=1.1)
    assert ppo(dual_clip=3.0).objective.dual_clip == 3.0
    assert grpo(dual_clip=3.0).objective.dual_clip == 3.0


# ---- KL estimators (Schulman 2020) ------------------------------------------------------


def test_kl_estimators_by_hand():
    logp, ref = jnp.log(jnp.array([0.5])), jnp.log(jnp.array([0.25]))  # d = log 2
    d = math.log(2.0)
    assert float(kl_estimate(logp, ref, "k1")[0]) == pytest.approx(d)
    assert float(kl_estimate(logp, ref, "k2")[0]) == pytest.approx(0.5 * d * d)
    assert float(kl_estimate(logp, ref, "k3")[0]) == pytest.approx(0.5 - 1.0 + d)
    with pytest.raises(ValueError, match="valid: k1, k2, k3"):
        kl_estimate(logp, ref, "k4")


def test_the_kl_terms_estimator_is_a_setting_by_hand():
    # One token, ratio 1, A = 0: the loss is beta * estimator(d), its gradient beta * d/dlogp.
    d = 0.3
    batch = {
        "loss_mask": jnp.ones((1, 1)),
        "old_logprobs": jnp.full((1, 1), -1.0),
        "advantages": jnp.zeros((1, 1)),
        "ref_logprobs": jnp.full((1, 1), -1.0 - d),
    }
    expect = {
        "k1": (d, 1.0),
        "k2": (0.5 * d * d, d),
        "k3": (math.exp(-d) - 1 + d, 1 - math.exp(-d)),
    }
    for name, (value, slope) in expect.items():
        algo = grpo(kl_beta=0.5, kl_estimator=name)
        (loss, _), g = jax.value_and_grad(algo.loss, has_aux=True)(batch["old_logprobs"], batch)
        assert float(loss) == pytest.approx(0.5 * value, rel=1e-5), name
        assert float(g[0, 0]) == pytest.approx(0.5 * slope, rel=1e-4), name
    with pytest.raises(ValueError, match="grpo: unknown kl_estimator 'k9'"):
        grpo(kl_beta=0.1, kl_estimator="k9")


# ---- IcePop and sequence-level IS -------------------------------------------------------


def alignment_batch(log_ratios, mask):
    old = jnp.zeros_like(mask)
    return {"loss_mask": mask, "old_logprobs": old, "train_logprobs": old + log_ratios}


def test_icepop_keeps_the_ratio_inside_the_bounds_and_drops_the_rest():
    rho = jnp.array([[0.4, 1.5, 3.0]])
    batch = alignment_batch(jnp.log(rho), jnp.ones((1, 3)))
    denom, weight, mask, metrics = Alignment("icepop", bounds=(0.5, 5.0))(batch)
    np.testing.assert_allclose(mask, [[0.0, 1.0, 1.0]])
    np.testing.assert_allclose(weight * mask, [[0.0, 1.5, 3.0]], rtol=1e-6)
    assert float(metrics["is_masked_fraction"]) == pytest.approx(1 / 3)
    assert denom is batch["train_logprobs"]
    # Through an algorithm: ratio 1, A = 1, token-mean over the two kept tokens.
    algo = grpo(alignment="icepop", is_bounds=(0.5, 5.0), aggregation="token-mean")
    loss, _ = algo.loss(batch["train_logprobs"], {**batch, "advantages": jnp.ones((1, 3))})
    assert float(loss) == pytest.approx(-(1.5 + 3.0) / 2, rel=1e-6)


def test_sequence_tis_truncates_each_rows_ratio_product():
    # Row 0: rho = 2 * 3 = 6 -> cap 2; row 1: rho = 0.5; row 2: empty.
    log_r = jnp.log(jnp.array([[2.0, 3.0], [0.5, 1.0], [1.0, 1.0]]))
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    _, weight, kept, metrics = Alignment("seq-tis", cap=2.0)(alignment_batch(log_r, mask))
    np.testing.assert_allclose(weight * mask, [[2.0, 2.0], [0.5, 0.0], [0.0, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(kept, mask)
    assert float(metrics["is_truncated_fraction"]) == pytest.approx(1 / 2)  # of 2 real rows


def test_sequence_mis_drops_whole_rows_outside_the_bounds():
    # Row 0: rho = 6 > 4, dropped; row 1: rho = 0.8 kept with weight 0.8; row 2: rho = 0.3 < 0.5.
    log_r = jnp.log(jnp.array([[2.0, 3.0], [0.8, 1.0], [0.3, 1.0]]))
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    _, weight, kept, metrics = Alignment("seq-mis", bounds=(0.5, 4.0))(alignment_batch(log_r, mask))
    np.testing.assert_allclose(kept, [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    assert float((weight * kept)[1, 0]) == pytest.approx(0.8, rel=1e-6)
    assert float(metrics["is_masked_fraction"]) == pytest.approx(2 / 3)
    # The dropped rows leave the seq-mean's denominator: one sequence counts.
    algo = grpo(alignment="seq-mis", is_bounds=(0.5, 4.0))
    batch = {**alignment_batch(log_r, mask), "advantages": jnp.ones((3, 2))}
    loss, _ = algo.loss(batch["train_logprobs"], batch)
    assert float(loss) == pytest.approx(-0.8, rel=1e-6)


def test_unknown_alignment_lists_the_new_modes():
    with pytest.raises(ValueError, match="icepop, seq-tis, seq-mis"):
        Alignment("seq")


# ---- on-policy distillation -------------------------------------------------------------


def test_distillation_adds_the_teachers_log_ratio_to_the_advantages_by_hand():
    old = jnp.array([[-1.0, -2.0, 0.0]])
    teacher = jnp.array([[-0.5, -3.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 0.0]])
    batch = {"train_logprobs": old, "teacher_logprobs": teacher}
    adv, metrics = Distillation(coef=2.0)(jnp.zeros((1, 3)), batch, mask)
    np.testing.assert_allclose(adv, [[1.0, -2.0, 0.0]])  # 2 * (teacher - old) on the mask
    assert float(metrics["distill_reverse_kl"]) == pytest.approx((-0.5 + 1.0) / 2)
    k3 = (math.exp(0.5) - 1 - 0.5 + math.exp(-1.0) - 1 + 1.0) / 2
    assert float(metrics["distill_reverse_kl_k3"]) == pytest.approx(k3, rel=1e-6)


def test_pure_distillation_loss_and_gradient_by_hand():
    # Ratio 1 (new = old = sampler), token-mean over 2 tokens: loss = -mean(A), dL/dlogp = -A/2.
    algo = distill(coef=1.0)
    assert algo.needs_teacher and not algo.needs_reference
    np.testing.assert_array_equal(algo.advantages(np.array([[1.0, 0.0]])), [[0.0, 0.0]])
    old = jnp.array([[-1.0, -2.0], [-1.0, -1.0]])
    batch = {
        "loss_mask": jnp.array([[1.0, 1.0], [0.0, 0.0]]),
        "old_logprobs": old,
        "train_logprobs": old,
        "advantages": jnp.zeros((2, 2)),
        "teacher_logprobs": jnp.array([[-0.5, -3.0], [0.0, 0.0]]),
    }
    (loss, _), g = jax.value_and_grad(algo.loss, has_aux=True)(old, batch)
    assert float(loss) == pytest.approx(-(0.5 - 1.0) / 2)
    np.testing.assert_allclose(g, [[-0.25, 0.5], [0.0, 0.0]], rtol=1e-6)
    # reward_coef mixes in GRPO's advantages: +-0.7071 for rewards [1, 0].
    mixed = distill(reward_coef=0.5).advantages(np.array([[1.0, 0.0]]))
    np.testing.assert_allclose(mixed, [[0.5 / math.sqrt(2), -0.5 / math.sqrt(2)]], rtol=1e-5)
    assert distill(kl_beta=0.1).needs_reference  # its KL term's target: the reference


def test_distillation_and_a_kl_term_each_read_their_own_logprobs_by_hand():
    # The teacher's shape the advantages; the KL term's target is the reference (k1: d).
    algo = distill(coef=1.0, kl_beta=0.5, kl_estimator="k1")
    old = jnp.array([[-1.0, -2.0]])
    batch = {
        "loss_mask": jnp.ones((1, 2)),
        "old_logprobs": old,
        "train_logprobs": old,
        "advantages": jnp.zeros((1, 2)),
        "teacher_logprobs": jnp.array([[-0.5, -3.0]]),
        "ref_logprobs": jnp.array([[-1.5, -1.0]]),
    }
    _, metrics = algo.loss(old, batch)
    assert float(metrics["distill_reverse_kl"]) == pytest.approx((-0.5 + 1.0) / 2)
    assert float(metrics["kl_ref"]) == pytest.approx((0.5 - 1.0) / 2)


def test_distillation_is_a_piece_any_policy_gradient_composes():
    algo = PolicyGradient(
        name="mine",
        estimator=lambda r: r * 0,
        objective=ClippedSurrogate(),
        aggregation=Aggregation("token-mean"),
        distill=Distillation(0.5),
    )
    assert algo.needs_teacher
    with pytest.raises(ValueError, match="distill: distillation: coef must be > 0"):
        distill(coef=0.0)
