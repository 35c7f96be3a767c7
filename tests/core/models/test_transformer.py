"""The decoder: cached decoding equals the full forward pass; RoPE is relative."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.rope import apply_rope
from rlax.core.models.transformer import (
    Transformer,
    abstract_transformer,
    causal_mask,
    init_cache,
    positions_from_mask,
)

CFG = TransformerConfig(
    vocab_size=11, num_layers=2, embed_dim=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=48
)


def test_positions_ignore_left_padding():
    mask = jnp.array([[False, False, True, True, True], [True, True, True, True, True]])
    np.testing.assert_array_equal(positions_from_mask(mask), [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]])


def test_rope_scores_depend_only_on_relative_position():
    q = jax.random.normal(jax.random.key(0), (1, 1, 1, 8))
    k = jax.random.normal(jax.random.key(1), (1, 1, 1, 8))

    def score(pq, pk):
        rq = apply_rope(q, jnp.array([[pq]]), 10_000.0)
        rk = apply_rope(k, jnp.array([[pk]]), 10_000.0)
        return float(jnp.sum(rq * rk))

    assert abs(score(5, 2) - score(13, 10)) < 1e-5
    assert abs(score(5, 2) - score(5, 3)) > 1e-3
    # A rotation keeps norms.
    np.testing.assert_allclose(
        jnp.linalg.norm(apply_rope(q, jnp.array([[7]]), 10_000.0)), jnp.linalg.norm(q), rtol=1e-6
    )


def test_cached_decoding_matches_full_forward():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    tokens = jnp.array([[0, 0, 3, 4, 5, 6, 7, 8], [3, 9, 4, 5, 6, 7, 8, 9]])
    mask = jnp.array([[False, False] + [True] * 6, [True] * 8])
    full, _ = model(tokens, positions_from_mask(mask), causal_mask(mask))

    p = 4  # prefill 4 slots, then decode the rest one at a time
    s = tokens.shape[1]
    cache = init_cache(CFG, 2, s)
    slots = jnp.arange(s)
    pre_mask = (slots[None, :] <= jnp.arange(p)[:, None])[None] & mask[:, None, :]
    pos = positions_from_mask(mask)
    logits, cache = model(tokens[:, :p], pos[:, :p], pre_mask, cache, 0)
    real = np.asarray(mask[:, :p])  # pad queries attend to nothing; their outputs are unused
    np.testing.assert_allclose(np.asarray(logits)[real], np.asarray(full[:, :p])[real], atol=1e-5)
    for t in range(p, s):
        step_mask = ((slots <= t)[None, :] & mask)[:, None, :]
        logits, cache = model(tokens[:, t : t + 1], pos[:, t : t + 1], step_mask, cache, t)
        np.testing.assert_allclose(logits[:, 0], full[:, t], atol=1e-5)


def test_left_padding_does_not_change_real_token_logits():
    model = Transformer(CFG, rngs=nnx.Rngs(1))
    real = jnp.array([[3, 4, 5, 6]])
    padded = jnp.array([[0, 0, 0, 3, 4, 5, 6]])
    mask_real = jnp.ones((1, 4), bool)
    mask_pad = jnp.array([[False] * 3 + [True] * 4])
    a, _ = model(real, positions_from_mask(mask_real), causal_mask(mask_real))
    b, _ = model(padded, positions_from_mask(mask_pad), causal_mask(mask_pad))
    np.testing.assert_allclose(a, b[:, 3:], atol=1e-5)
    assert np.all(np.isfinite(np.asarray(b)))  # fully-masked pad rows do not produce NaN


def test_config_validation():
    import pytest

    with pytest.raises(ValueError, match="multiple"):
        TransformerConfig(
            vocab_size=5,
            num_layers=1,
            embed_dim=8,
            num_heads=3,
            num_kv_heads=2,
            head_dim=4,
            mlp_dim=8,
        )
    with pytest.raises(ValueError, match="unknown"):
        TransformerConfig.from_dict({**CFG.to_dict(), "bogus": 1})
    assert TransformerConfig.from_dict(CFG.to_dict()) == CFG


def test_the_abstract_model_has_the_initialised_models_structure_shapes_and_dtypes():
    for cfg in (CFG, dataclasses.replace(CFG, num_layers=3, tie_embeddings=False)):
        real = Transformer(cfg, rngs=nnx.Rngs(0))
        abstract = abstract_transformer(cfg)
        assert nnx.graphdef(abstract) == nnx.graphdef(real)
        leaves = jax.tree.leaves(nnx.state(abstract))
        assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)  # no memory
        assert [(x.shape, x.dtype) for x in leaves] == [
            (x.shape, x.dtype) for x in jax.tree.leaves(nnx.state(real))
        ]
