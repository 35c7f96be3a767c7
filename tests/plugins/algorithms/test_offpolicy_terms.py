"""The off-policy loss terms by hand: sequence masking, the IS-corrected KL, the entropy bonus."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from toy_groups import toy_batch

from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.trainer.step import Trainer, batch_arrays
from rlax.plugins import algorithms as algos

# Three rows of three positions; the last position of each is off the loss mask.
MASK = jnp.asarray([[1.0, 1.0, 0.0]] * 3)
NEW = jnp.asarray([[-2.0, -2.0, 0.0], [-2.0, -2.0, 0.0], [-1.0, -1.4, 0.0]])
OLD = jnp.asarray([[-1.0, -1.0, 0.0], [-1.0, -1.0, 0.0], [-1.0, -1.0, 0.0]])
ADV = jnp.asarray([[-1.0, -1.0, 0.0], [1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])


def test_off_policy_sequence_mask_by_hand():
    # Drifts (mean of old - new over the mask): 1.0, 1.0, 0.2. With delta 0.5 only row 0
    # is masked: it drifted and its advantage is negative; row 1 drifted with A > 0.
    mask, metrics = algos.OffPolicySequenceMask(0.5)(NEW, OLD, ADV, MASK)
    np.testing.assert_array_equal(mask, [[0, 0, 0], [1, 1, 0], [1, 1, 0]])
    assert float(metrics["offpolicy_masked_fraction"]) == pytest.approx(1 / 3)
    assert float(metrics["offpolicy_drift_mean"]) == pytest.approx((1 + 1 + 0.2) / 3)
    # delta 0.1 also masks row 2 (drift 0.2); delta 1.0 masks nothing (not strictly above).
    assert np.asarray(algos.OffPolicySequenceMask(0.1)(NEW, OLD, ADV, MASK)[0])[2].sum() == 0
    assert np.array_equal(algos.OffPolicySequenceMask(1.0)(NEW, OLD, ADV, MASK)[0], MASK)
    with pytest.raises(ValueError, match="delta"):
        algos.OffPolicySequenceMask(0.0)


def test_the_masked_sequence_leaves_the_loss_by_hand():
    # GRPO's clipped surrogate, token-mean over the kept tokens (row 0 is masked), with
    # r = e^(new - old): row 1 (A = +1, r = e^-1 each) gives -r twice; row 2 (A = -1)
    # gives -min(-1, -1) = 1 at r = 1 and -min(-0.67, -0.8) = 0.8 at r = e^-0.4.
    batch = {"loss_mask": MASK, "old_logprobs": OLD, "advantages": ADV}
    algo = algos.grpo(aggregation="token-mean", off_policy_delta=0.5)
    loss, metrics = algo.loss(NEW, batch)
    want = (-2 * math.exp(-1) + 1.0 + 0.8) / 4
    assert float(loss) == pytest.approx(want, rel=1e-6)
    assert float(metrics["offpolicy_masked_fraction"]) == pytest.approx(1 / 3)


def test_k3_is_by_hand():
    logp, ref, old = math.log(0.5), math.log(0.25), math.log(0.4)
    got = algos.kl_estimate(jnp.float32(logp), jnp.float32(ref), "k3-is", jnp.float32(old))
    k3 = 0.25 / 0.5 - math.log(0.25 / 0.5) - 1  # 0.19315
    assert float(got) == pytest.approx(0.5 / 0.4 * k3, rel=1e-6)  # 0.24143
    with pytest.raises(ValueError, match="sampler's logprobs"):
        algos.kl_estimate(jnp.float32(logp), jnp.float32(ref), "k3-is")


def test_k3_is_is_unbiased_off_policy_and_so_is_its_gradient():
    """Over tokens drawn from another policy, E_old[k3-is] = KL(pi || ref) exactly, and its
    gradient is KL's; plain k3 is biased there."""
    theta = jnp.asarray([0.3, -1.2, 2.0, 0.5])
    ref = jax.nn.log_softmax(jnp.asarray([1.0, 0.0, -1.0, 0.2]))
    old = jax.nn.log_softmax(jnp.asarray([-0.5, 0.8, 0.1, 0.0]))
    p_old = jnp.exp(old)

    def expected(t, estimator):
        logp = jax.nn.log_softmax(t)
        return jnp.sum(p_old * algos.kl_estimate(logp, ref, estimator, old))

    def exact(t):
        logp = jax.nn.log_softmax(t)
        return jnp.sum(jnp.exp(logp) * (logp - ref))

    assert float(expected(theta, "k3-is")) == pytest.approx(float(exact(theta)), rel=1e-5)
    np.testing.assert_allclose(
        jax.grad(expected)(theta, "k3-is"), jax.grad(exact)(theta), rtol=1e-5, atol=1e-6
    )
    assert abs(float(expected(theta, "k3")) - float(exact(theta))) > 0.1


def test_the_kl_term_uses_the_sampler_s_logprobs_by_hand():
    algo = algos.grpo(aggregation="token-mean", kl_beta=0.5, kl_estimator="k3-is")
    ref = jnp.full((3, 3), -1.5)
    batch = {"loss_mask": MASK, "old_logprobs": OLD, "advantages": ADV * 0, "ref_logprobs": ref}
    _, metrics = algo.loss(NEW, batch)
    d = np.asarray(ref - NEW)
    kl = np.exp(np.asarray(NEW - OLD)) * (np.exp(d) - d - 1)
    want = (kl * np.asarray(MASK)).sum() / 6
    assert float(metrics["kl_ref"]) == pytest.approx(want, rel=1e-6)


def test_entropy_bonus_by_hand():
    entropy = jnp.asarray([[1.0, 2.0, 9.0], [0.5, 0.0, 9.0], [0.0, 0.0, 9.0]])
    mask = jnp.asarray([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    batch = {"loss_mask": mask, "old_logprobs": OLD, "advantages": ADV, "entropy": entropy}
    plain = algos.grpo(aggregation="token-mean")
    bonus = algos.grpo(aggregation="token-mean", entropy_coef=0.1)
    assert not plain.needs_entropy and bonus.needs_entropy
    base, _ = plain.loss(NEW, batch)
    loss, metrics = bonus.loss(NEW, batch)
    # token-mean of the entropy over the mask: (1 + 2 + 0.5) / 3; the term is -0.1 x that.
    assert float(loss - base) == pytest.approx(-0.1 * 3.5 / 3, rel=1e-6)
    assert float(metrics["entropy_bonus"]) == pytest.approx(0.1 * 3.5 / 3, rel=1e-6)
    # seq-mean-token-mean: rows (1 + 2) / 2 and 0.5 / 1, the empty row ignored: 1.0.
    seq = algos.grpo(entropy_coef=0.1)
    assert float(seq.loss(NEW, batch)[0] - algos.grpo().loss(NEW, batch)[0]) == pytest.approx(
        -0.1, rel=1e-6
    )


CFG = TransformerConfig(
    vocab_size=9, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)


@pytest.mark.parametrize("microbatches", [1, 2])
def test_the_trainer_differentiates_the_entropy_bonus(microbatches):
    """Zero advantages: the update is the entropy bonus's gradient alone, applied by hand."""
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    b = toy_batch()
    b = dataclasses.replace(b, advantages=np.zeros_like(b.advantages))
    arrays = jax.tree.map(jnp.asarray, batch_arrays(b))
    algo = algos.grpo(aggregation="token-mean", entropy_coef=0.5)

    def loss(p):
        _, entropy = sequence_logprobs(
            nnx.merge(graphdef, p), arrays["tokens"], arrays["attention_mask"]
        )
        mask = arrays["loss_mask"]
        return -0.5 * jnp.sum(entropy * mask) / jnp.sum(mask)

    lr = 0.5
    grads = jax.jit(jax.grad(loss))(params)
    expected = jax.tree.map(lambda p, g: p - lr * g, params, grads)
    settings = TrainerSettings(microbatches=microbatches)
    trainer = Trainer(model, algo, optax.sgd(lr), settings=settings)
    metrics = trainer.step(b)
    for got, want in zip(jax.tree.leaves(trainer.state.params), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert metrics["entropy_bonus"] > 0
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads)) > 1e-3
