"""Critics: the built-ins compute what the value head and value model always did, on the
hidden states the policy's head reads, and keep the parameter tree checkpoints hold."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.critic import (
    ValueHead,
    ValueModel,
    forward_with_values,
    hidden_states,
    logits_from_hidden,
)
from rlax.core.models.transformer import (
    Transformer,
    causal_mask,
    positions_from_mask,
    sequence_logprobs,
)
from rlax.core.parallel.mesh import param_name, single_device_mesh
from rlax.core.trainer.checkpoint import Checkpointer
from rlax.core.trainer.loop import state_tree
from rlax.core.trainer.microbatch import RematBlock, wrap_blocks
from rlax.core.trainer.step import Trainer, TrainState
from rlax.plugins.algorithms.ppo import ppo
from rlax.plugins.critics.head import HeadCritic
from rlax.plugins.critics.separate import SeparateCritic

from .test_trainer import batch  # the trainer tests' tiny batch of two groups

CFG = TransformerConfig(
    vocab_size=11, num_layers=2, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)
TOKENS = jnp.array([[0, 0, 4, 5, 6, 7], [3, 4, 5, 6, 7, 8]])
MASK = jnp.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], bool)
CRITICS = {"head": HeadCritic(), "separate": SeparateCritic()}


@pytest.mark.parametrize("tie", [True, False])
def test_hidden_states_and_head_reproduce_the_models_logits(tie):
    model = Transformer(
        TransformerConfig(**{**CFG.to_dict(), "tie_embeddings": tie}), rngs=nnx.Rngs(0)
    )
    logits, _ = model(TOKENS, positions_from_mask(MASK), causal_mask(MASK))
    again = logits_from_hidden(model, hidden_states(model, TOKENS, MASK))
    np.testing.assert_allclose(again, logits, atol=1e-5)


def test_value_head_starts_at_zero_and_is_linear_in_the_hidden_state():
    head = ValueHead(4, rngs=nnx.Rngs(0))
    hidden = jnp.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(head(hidden), jnp.zeros((2, 3)))
    head.proj.kernel[...] = jnp.array([[1.0], [0.0], [-1.0], [0.5]])
    head.proj.bias[...] = jnp.array([0.25])
    # hidden[0, 0] = [0, 1, 2, 3]: 0 - 2 + 1.5 + 0.25.
    assert float(head(hidden)[0, 0]) == pytest.approx(-0.25)


def head_of(name: str, module: nnx.Module) -> ValueHead:
    return module if name == "head" else module.head  # type: ignore[return-value]


@pytest.mark.parametrize("name", sorted(CRITICS))
def test_the_built_ins_give_the_values_of_the_old_formula(name):
    model = Transformer(CFG, rngs=nnx.Rngs(1))
    critic = CRITICS[name]
    module = critic.build(model, nnx.Rngs(0))
    head = head_of(name, module)
    rng = np.random.default_rng(0)
    head.proj.kernel[...] = jnp.asarray(rng.standard_normal((CFG.embed_dim, 1)), jnp.float32)
    head.proj.bias[...] = jnp.array([0.5])
    logp, entropy, values = forward_with_values(model, critic, module, TOKENS, MASK)
    want_logp, want_entropy = sequence_logprobs(model, TOKENS, MASK)
    np.testing.assert_allclose(logp, want_logp, atol=1e-5)
    np.testing.assert_allclose(entropy, want_entropy, atol=1e-5)
    # As before: h W + b on the final hidden states of the policy's trunk (head) or of
    # the critic's own copy of it (separate), read at t, the position predicting t+1.
    trunk = model if name == "head" else module.trunk
    hidden = np.asarray(hidden_states(trunk, TOKENS, MASK))
    kernel, bias = np.asarray(head.proj.kernel[...]), np.asarray(head.proj.bias[...])
    expected = (hidden @ kernel + bias)[..., 0][:, :-1]
    np.testing.assert_allclose(values, expected, atol=1e-4)


def test_separate_critic_is_a_copy_not_the_policy():
    model = Transformer(CFG, rngs=nnx.Rngs(2))
    critic = SeparateCritic().build(model, nnx.Rngs(0))
    assert isinstance(critic, ValueModel) and critic.trunk is not model
    np.testing.assert_array_equal(critic.trunk.embed.embedding[...], model.embed.embedding[...])
    critic.trunk.embed.embedding[...] = jnp.zeros_like(critic.trunk.embed.embedding[...])
    assert np.abs(np.asarray(model.embed.embedding[...])).max() > 0


def test_remat_wraps_the_blocks_of_every_trunk_a_critic_has():
    # The step finds decoders by type inside any critic module, never by its kind.
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    mesh = single_device_mesh()
    separate = wrap_blocks(SeparateCritic().build(model, nnx.Rngs(0)), "block", mesh)
    assert [type(b) for b in separate.trunk.blocks] == [RematBlock] * CFG.num_layers
    head = HeadCritic().build(model, nnx.Rngs(0))
    assert wrap_blocks(head, "block", mesh) is head  # no trunk: nothing to wrap
    assert [type(b).__name__ for b in model.blocks] == ["Block"] * CFG.num_layers


def leaf_names(tree) -> list[str]:
    return [param_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def test_the_parameter_trees_are_those_checkpoints_hold():
    # Hand-listed, in flatten order: a checkpoint stores the leaves in this order, so a
    # run with a critic resumes from a checkpoint written before critics were plugins.
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    head = HeadCritic().build(model, nnx.Rngs(0))
    assert leaf_names(nnx.state(head)) == ["proj/bias", "proj/kernel"]
    separate = SeparateCritic().build(model, nnx.Rngs(0))
    policy = leaf_names(nnx.state(model))
    assert leaf_names(nnx.state(separate)) == [
        "head/proj/bias",
        "head/proj/kernel",
        *(f"trunk/{n}" for n in policy),
    ]


@pytest.mark.parametrize("name", sorted(CRITICS))
def test_a_ppo_checkpoint_restores_the_critic(tmp_path, name):
    algo = ppo(value_model=CRITICS[name])
    trainer = Trainer(Transformer(CFG, rngs=nnx.Rngs(5)), algo, optax.adam(0.05))
    trainer.step(batch(algo))
    ckpt = Checkpointer(tmp_path, every=1, keep=1)
    ckpt.save(1, state_tree(trainer.state), {"version": 1})
    ckpt.close()

    fresh = Trainer(Transformer(CFG, rngs=nnx.Rngs(9)), algo, optax.adam(0.05))
    restored = Checkpointer(tmp_path).restore_latest(state_tree(fresh.state))
    assert restored is not None
    params, opt_state, critic = restored.state
    fresh.state = TrainState(params, opt_state, 1, critic)
    for got, want in zip(jax.tree.leaves(critic), jax.tree.leaves(trainer.state.critic)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert fresh.step(batch(algo)) == trainer.step(batch(algo))  # and trains on from there
