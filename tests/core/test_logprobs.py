"""Chunked sampled-token logprobs equal the full-logits ones, values and gradients, without [B, T, V]."""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.critic import forward_with_values
from rlax.core.models.logprobs import chunk_positions, chunked_token_logprobs
from rlax.core.models.transformer import (
    Transformer,
    causal_mask,
    positions_from_mask,
    sequence_logprobs,
    token_logprobs,
)
from rlax.core.trainer.microbatch import cast_floats
from rlax.plugins.critics.head import HeadCritic
from rlax.plugins.critics.separate import SeparateCritic

V = 97  # a vocabulary size no other dimension has, so [.., V] arrays are easy to spot
CFG = TransformerConfig(
    vocab_size=V, num_layers=2, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)
TOKENS = jnp.array(
    [[0, 0, 4, 50, 6, 70, 8, 9], [3, 4, 5, 96, 7, 8, 1, 2], [0, 0, 0, 11, 12, 13, 14, 0]]
)
MASK = jnp.array(
    [[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 0]], bool
)
WEIGHTS = jnp.asarray(np.random.default_rng(0).normal(size=(3, 7)), jnp.float32)  # [B, T-1]


def model_of(tie: bool, seed: int = 0) -> Transformer:
    return Transformer(
        TransformerConfig(**{**CFG.to_dict(), "tie_embeddings": tie}), rngs=nnx.Rngs(seed)
    )


def full_logprobs(model, tokens, mask, temperature):
    """The reference: the whole batch's logits, then log-softmax."""
    logits, _ = model(tokens, positions_from_mask(mask), causal_mask(mask))
    return token_logprobs(logits, tokens, temperature)


def loss_and_grads(fn, model, dtype=jnp.float32):
    """A masked loss mixing logprob and entropy (both get gradients), and its gradient."""
    graphdef, params = nnx.split(model)
    keep = MASK[:, 1:].astype(jnp.float32)

    def loss(p):
        logp, entropy = fn(nnx.merge(graphdef, cast_floats(p, dtype)))
        return jnp.sum((WEIGHTS * logp + 0.3 * entropy) * keep)

    return jax.value_and_grad(loss)(params)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_tokens", [1, 5, 9, 1000])
def test_chunked_values_and_gradients_equal_the_full_logits(tie, temperature, chunk_tokens):
    model = model_of(tie)
    got = sequence_logprobs(model, TOKENS, MASK, temperature, chunk_tokens)
    want = full_logprobs(model, TOKENS, MASK, temperature)
    for g, w in zip(got, want, strict=True):
        assert g.shape == (3, 7) and g.dtype == jnp.float32
        np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-6)
    loss_c, grads_c = loss_and_grads(
        lambda m: sequence_logprobs(m, TOKENS, MASK, temperature, chunk_tokens), model
    )
    loss_f, grads_f = loss_and_grads(lambda m: full_logprobs(m, TOKENS, MASK, temperature), model)
    np.testing.assert_allclose(loss_c, loss_f, rtol=1e-6)
    for g, w in zip(jax.tree.leaves(grads_c), jax.tree.leaves(grads_f), strict=True):
        # float32 rounding of sums taken in another order: an element near zero in an array
        # of gradients up to ~5 differs by ~1e-6 (AVX-512 kernels), so atol scales with it
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, atol=1e-6 * scale, rtol=1e-5)
    # The gradient reaches the head (tied: the embedding; untied: its own kernel).
    head = grads_c["embed"]["embedding"] if tie else grads_c["head"]["kernel"]
    assert float(jnp.abs(head[...]).max()) > 1e-3


def test_bf16_compute_matches_the_full_logits_to_bf16_rounding():
    model = model_of(True, seed=3)
    got = sequence_logprobs(
        nnx.merge(*_cast(model, jnp.bfloat16)), TOKENS, MASK, 0.8, chunk_tokens=4
    )
    want = full_logprobs(nnx.merge(*_cast(model, jnp.bfloat16)), TOKENS, MASK, 0.8)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-6)  # same bf16 logits, same float32 softmax
    _, grads_c = loss_and_grads(
        lambda m: sequence_logprobs(m, TOKENS, MASK, 0.8, 4), model, jnp.bfloat16
    )
    _, grads_f = loss_and_grads(lambda m: full_logprobs(m, TOKENS, MASK, 0.8), model, jnp.bfloat16)
    for g, w in zip(jax.tree.leaves(grads_c), jax.tree.leaves(grads_f), strict=True):
        # bf16 gradients are summed chunk by chunk: equal to a few bf16 ulps of the largest entry.
        scale = float(jnp.abs(w).max()) + 1e-6
        np.testing.assert_allclose(
            np.asarray(g, np.float32), np.asarray(w, np.float32), atol=0.03 * scale
        )


def _cast(model, dtype):
    graphdef, params = nnx.split(model)
    return graphdef, cast_floats(params, dtype)


def _largest_vocab_array(jaxpr) -> int:
    """Elements of the largest intermediate whose last dimension is V, in any nested jaxpr
    (the head's kernel [D, V] and its gradient aside)."""
    best = 0
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            shape = tuple(getattr(var.aval, "shape", ()))
            if shape and shape[-1] == V and shape != (CFG.embed_dim, V):
                best = max(best, int(np.prod(shape)))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            best = max(best, _largest_vocab_array(sub))
    return best


@pytest.mark.parametrize("chunk_tokens", [2, 6])
def test_the_gradient_never_builds_the_whole_batchs_logits(chunk_tokens):
    model = model_of(False)
    graphdef, params = nnx.split(model)

    def loss(p, fn):
        logp, entropy = fn(nnx.merge(graphdef, p))
        return jnp.sum(logp * WEIGHTS) + jnp.sum(entropy)

    def chunked(m):
        return sequence_logprobs(m, TOKENS, MASK, 1.0, chunk_tokens)

    def full(m):
        return full_logprobs(m, TOKENS, MASK, 1.0)

    rows_per_chunk = 3 * chunk_positions(3, 7, chunk_tokens)  # B x c
    got = _largest_vocab_array(jax.make_jaxpr(jax.grad(lambda p: loss(p, chunked)))(params).jaxpr)
    want = _largest_vocab_array(jax.make_jaxpr(jax.grad(lambda p: loss(p, full)))(params).jaxpr)
    assert want >= 3 * 7 * V  # the reference does build [B, T-1, V]
    assert got == rows_per_chunk * V  # one chunk's [B, c, V], never more


def test_chunk_positions_fit_the_budget_and_cover_short_sequences():
    assert chunk_positions(rows=64, positions=300, chunk_tokens=1024) == 16
    assert chunk_positions(rows=3, positions=7, chunk_tokens=1000) == 7  # one chunk
    assert chunk_positions(rows=4096, positions=10, chunk_tokens=1024) == 1  # at least one position
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunk_positions(rows=1, positions=1, chunk_tokens=0)


def test_a_single_token_sequence_has_no_predictions():
    logp, entropy = chunked_token_logprobs(
        lambda h: h, jnp.zeros((2, 1, 4)), jnp.zeros((2, 1), int)
    )
    assert logp.shape == entropy.shape == (2, 0)


@pytest.mark.parametrize("critic", [HeadCritic(), SeparateCritic()], ids=["head", "separate"])
def test_forward_with_values_chunked_equals_the_full_logits(critic):
    model = model_of(True, seed=1)
    module = critic.build(model, nnx.Rngs(0))
    logp, entropy, values = forward_with_values(
        model, critic, module, TOKENS, MASK, 0.9, chunk_tokens=4
    )
    want_logp, want_entropy = full_logprobs(model, TOKENS, MASK, 0.9)
    np.testing.assert_allclose(logp, want_logp, atol=1e-6)
    np.testing.assert_allclose(entropy, want_entropy, atol=1e-6)
    assert values.shape == (3, 7)
