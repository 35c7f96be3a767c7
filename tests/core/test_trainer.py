"""The train step is exactly one optimiser update on the algorithm's loss."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from toy_groups import toy_batch, toy_groups

from rlax.core.models.config import TransformerConfig
from rlax.core.models.critic import ValueHead, ValueModel, forward_with_values
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.trainer.step import Trainer, batch_arrays
from rlax.plugins.algorithms.grpo import grpo
from rlax.plugins.algorithms.ppo import ppo
from rlax.plugins.critics.head import HeadCritic
from rlax.plugins.critics.separate import SeparateCritic

CFG = TransformerConfig(
    vocab_size=9, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)


def groups():
    return toy_groups()


def batch(algorithm=None):
    return toy_batch(algorithm)


def arrays_of(b):
    return jax.tree.map(jnp.asarray, batch_arrays(b))


def assert_trees_close(got, want, atol=1e-6):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, atol=atol)


def test_step_equals_a_hand_applied_sgd_update():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    b = batch()
    arrays = arrays_of(b)

    def loss(p):
        logp, _ = sequence_logprobs(
            nnx.merge(graphdef, p), arrays["tokens"], arrays["attention_mask"]
        )
        return grpo().loss(logp, arrays)[0]

    lr = 0.1
    value, grads = jax.jit(jax.value_and_grad(loss))(params)  # one program, not op by op
    expected = jax.tree.map(lambda p, g: p - lr * g, params, grads)
    trainer = Trainer(model, grpo(), optax.sgd(lr), settings=TrainerSettings(post_update_kl=True))
    metrics = trainer.step(b)
    assert_trees_close(trainer.state.params, expected)
    assert trainer.state.step == 1 and trainer.state.critic is None
    assert metrics["loss"] == pytest.approx(float(value), abs=1e-6)
    assert metrics["kl_old"] > 0  # the update moved the policy


def test_zero_learning_rate_changes_nothing_and_kl_is_zero():
    model = Transformer(CFG, rngs=nnx.Rngs(1))
    before = jax.tree.map(np.asarray, nnx.state(model))
    trainer = Trainer(model, grpo(), optax.sgd(0.0), settings=TrainerSettings(post_update_kl=True))
    metrics = trainer.step(batch())
    assert_trees_close(trainer.state.params, before, atol=0)
    assert metrics["kl_old"] == 0.0


def test_the_post_update_kl_pass_is_off_by_default():
    # No objective reads kl_old: by default the step runs no forward pass for it.
    trainer = Trainer(Transformer(CFG, rngs=nnx.Rngs(1)), grpo(), optax.sgd(0.1))
    assert "kl_old" not in trainer.step(batch())


def test_train_inference_mismatch_is_measured_by_hand():
    # The sampler's logprobs are the trainer's own minus 0.1 on every generated token:
    # mean |dlogp| = 0.1 and KL(sampler || train) k3 = e^0.1 - 1 - 0.1.
    model = Transformer(CFG, rngs=nnx.Rngs(2))
    b = batch()
    arrays = arrays_of(b)
    logp, _ = sequence_logprobs(model, arrays["tokens"], arrays["attention_mask"])
    shifted = np.asarray((logp - 0.1) * arrays["loss_mask"])
    b = type(b)(**{**b.__dict__, "old_logprobs": shifted})
    metrics = Trainer(model, grpo(), optax.sgd(0.0)).step(b)
    assert metrics["mismatch_abs_logp"] == pytest.approx(0.1, rel=1e-4)
    assert metrics["mismatch_kl"] == pytest.approx(math.exp(0.1) - 1.1, rel=1e-3)


def test_tis_algorithm_gets_the_trainers_own_logprobs():
    # With alignment 'tis' and a sampler that agrees with the trainer, every weight is 1 and
    # the ratio is 1: the update equals the no-alignment update on the trainer's logprobs.
    model = Transformer(CFG, rngs=nnx.Rngs(3))
    b = batch()
    arrays = arrays_of(b)
    logp, _ = sequence_logprobs(model, arrays["tokens"], arrays["attention_mask"])
    b = type(b)(**{**b.__dict__, "old_logprobs": np.asarray(logp * arrays["loss_mask"])})
    plain = Trainer(Transformer(CFG, rngs=nnx.Rngs(3)), grpo(), optax.sgd(0.1))
    tis = Trainer(model, grpo(alignment="tis"), optax.sgd(0.1))
    plain.step(b)
    metrics = tis.step(b)
    assert_trees_close(tis.state.params, plain.state.params, atol=1e-6)
    assert metrics["is_truncated_fraction"] == 0.0


def test_reference_policy_is_the_frozen_start():
    model = Transformer(CFG, rngs=nnx.Rngs(4))
    graphdef, start = nnx.split(model)
    start = jax.tree.map(jnp.array, start)
    algo = grpo(kl_beta=0.5)
    trainer = Trainer(model, algo, optax.sgd(0.5))
    b = batch()
    first = trainer.step(b)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-7)  # policy == reference at step 0
    # Step 2 by hand: loss with the reference's logprobs from the starting parameters.
    arrays = arrays_of(b)
    ref_logp, _ = sequence_logprobs(
        nnx.merge(graphdef, start), arrays["tokens"], arrays["attention_mask"]
    )
    params = trainer.state.params

    def loss(p):
        logp, _ = sequence_logprobs(
            nnx.merge(graphdef, p), arrays["tokens"], arrays["attention_mask"]
        )
        return algo.loss(logp, dict(arrays, ref_logprobs=ref_logp))[0]

    expected = jax.tree.map(lambda p, g: p - 0.5 * g, params, jax.jit(jax.grad(loss))(params))
    second = trainer.step(b)
    assert second["kl_ref"] > 0
    assert_trees_close(trainer.state.params, expected, atol=1e-5)


@pytest.mark.parametrize("value_model", ["head", "separate"])
def test_critic_step_equals_a_hand_applied_sgd_update(value_model):
    model = Transformer(CFG, rngs=nnx.Rngs(5))
    critic = HeadCritic() if value_model == "head" else SeparateCritic()
    algo = ppo(value_model=critic)
    trainer = Trainer(model, algo, optax.sgd(0.1))
    critic_cls = ValueHead if value_model == "head" else ValueModel
    critic_def, critic0 = trainer.critic_graphdef, trainer.state.critic
    assert isinstance(nnx.merge(critic_def, critic0), critic_cls)
    graphdef, params0 = nnx.split(model)
    b = batch(algo)
    arrays = arrays_of(b)

    def loss(trainable):
        p, c = trainable
        logp, _, values = forward_with_values(
            nnx.merge(graphdef, p),
            critic,
            nnx.merge(critic_def, c),
            arrays["tokens"],
            arrays["attention_mask"],
        )
        inputs = dict(
            arrays,
            train_logprobs=jax.lax.stop_gradient(logp),
            values=values,
            old_values=jax.lax.stop_gradient(values),
        )
        return algo.loss(logp, inputs)[0]

    trainable = (params0, critic0)
    grads = jax.jit(jax.grad(loss))(trainable)
    expected = jax.tree.map(lambda p, g: p - 0.1 * g, trainable, grads)
    metrics = trainer.step(b)
    assert_trees_close((trainer.state.params, trainer.state.critic), expected)
    assert metrics["value_loss"] > 0 and metrics["value_mean"] == 0.0  # zero-initialised head
    # The value head learned; it started at exactly zero.
    head = nnx.merge(critic_def, trainer.state.critic)
    kernel = (head.proj if value_model == "head" else head.head.proj).kernel[...]
    assert np.abs(np.asarray(kernel)).max() > 0


def test_separate_critic_has_its_own_trunk():
    model = Transformer(CFG, rngs=nnx.Rngs(6))
    trainer = Trainer(model, ppo(value_model=SeparateCritic()), optax.sgd(0.1))
    critic = nnx.merge(trainer.critic_graphdef, trainer.state.critic)
    start = np.asarray(model.embed.embedding[...])
    np.testing.assert_array_equal(critic.trunk.embed.embedding[...], start)  # a copy of the policy
    trainer.step(batch(ppo()))
    critic = nnx.merge(trainer.critic_graphdef, trainer.state.critic)
    # The policy moved; the critic's trunk did not (its head starts at zero, so no gradient
    # reaches the trunk on the first step) and it is not the policy's trunk.
    assert not np.array_equal(trainer.model().embed.embedding[...], start)
    np.testing.assert_array_equal(critic.trunk.embed.embedding[...], start)
