"""Critics: the value head reads the same hidden states the policy's head does."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.critic import (
    ValueHead,
    ValueModel,
    build_critic,
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

CFG = TransformerConfig(
    vocab_size=11, num_layers=2, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)
TOKENS = jnp.array([[0, 0, 4, 5, 6, 7], [3, 4, 5, 6, 7, 8]])
MASK = jnp.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], bool)


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


@pytest.mark.parametrize("value_model", ["head", "separate"])
def test_forward_with_values_aligns_values_with_logprobs(value_model):
    model = Transformer(CFG, rngs=nnx.Rngs(1))
    critic = build_critic(model, value_model)
    head = critic if value_model == "head" else critic.head
    head.proj.kernel[...] = jnp.ones((CFG.embed_dim, 1))
    logp, entropy, values = forward_with_values(model, critic, TOKENS, MASK)
    want_logp, want_entropy = sequence_logprobs(model, TOKENS, MASK)
    np.testing.assert_allclose(logp, want_logp, atol=1e-5)
    np.testing.assert_allclose(entropy, want_entropy, atol=1e-5)
    # values[:, t] is read from the hidden state at t, the one that predicts token t+1.
    trunk = model if value_model == "head" else critic.trunk
    expected = hidden_states(trunk, TOKENS, MASK).sum(-1)[:, :-1]
    np.testing.assert_allclose(values, expected, atol=1e-4)


def test_separate_critic_is_a_copy_not_the_policy():
    model = Transformer(CFG, rngs=nnx.Rngs(2))
    critic = build_critic(model, "separate")
    assert isinstance(critic, ValueModel) and critic.trunk is not model
    critic.trunk.embed.embedding[...] = jnp.zeros_like(critic.trunk.embed.embedding[...])
    assert np.abs(np.asarray(model.embed.embedding[...])).max() > 0


def test_unknown_value_model_lists_the_valid_ones():
    with pytest.raises(ValueError, match="head, separate"):
        build_critic(Transformer(CFG, rngs=nnx.Rngs(0)), "tied")
