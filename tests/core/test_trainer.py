"""The train step is exactly one optimiser update on the algorithm's loss."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from rlax.core.batching import make_batch
from rlax.core.models.transformer import Transformer, TransformerConfig, sequence_logprobs
from rlax.core.trainer import Trainer, batch_arrays
from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.algorithms.grpo import GRPO

CFG = TransformerConfig(
    vocab_size=9, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)


def batch():
    rng = np.random.default_rng(0)
    groups = []
    for i in range(2):
        prompt = Prompt(str(i), "", rng.integers(3, 9, size=3 + i).astype(np.int32), "")
        comps = tuple(
            Completion(rng.integers(3, 9, size=n).astype(np.int32), -rng.random(n).astype(np.float32), "", "stop", 0)
            for n in (2, 3, 1)
        )  # fmt: skip
        groups.append(Group(prompt, comps, np.array([1.0, 0.0, 0.0], np.float32)))
    adv = GRPO().advantages(np.stack([g.rewards for g in groups]))
    return make_batch(groups, adv)


def test_step_equals_a_hand_applied_sgd_update():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    b = batch()
    arrays = jax.tree.map(np.asarray, batch_arrays(b))

    def loss(p):
        logp, _ = sequence_logprobs(
            nnx.merge(graphdef, p), arrays["tokens"], arrays["attention_mask"]
        )
        return GRPO().loss(logp, arrays)[0]

    lr = 0.1
    expected = jax.tree.map(lambda p, g: p - lr * g, params, jax.grad(loss)(params))
    trainer = Trainer(model, GRPO(), optax.sgd(lr))
    metrics = trainer.step(b)
    for got, want in zip(jax.tree.leaves(trainer.state.params), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert trainer.state.step == 1
    assert metrics["loss"] == pytest.approx(float(loss(params)), abs=1e-6)
    assert metrics["kl_old"] > 0  # the update moved the policy


def test_zero_learning_rate_changes_nothing_and_kl_is_zero():
    model = Transformer(CFG, rngs=nnx.Rngs(1))
    before = jax.tree.map(np.asarray, nnx.state(model))
    trainer = Trainer(model, GRPO(), optax.sgd(0.0))
    metrics = trainer.step(batch())
    for got, want in zip(jax.tree.leaves(trainer.state.params), jax.tree.leaves(before)):
        np.testing.assert_array_equal(got, want)
    assert metrics["kl_old"] == 0.0
    # The batch's old logprobs are random, not the model's: the gap is reported.
    assert metrics["sampler_logprob_gap"] > 0.1


def test_algorithms_needing_a_critic_are_refused_clearly():
    class NeedsCritic(GRPO):
        needs_critic = True

    with pytest.raises(NotImplementedError, match="critic"):
        Trainer(Transformer(CFG, rngs=nnx.Rngs(0)), NeedsCritic(), optax.sgd(0.1))
