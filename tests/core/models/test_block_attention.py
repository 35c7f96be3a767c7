"""Block-skipping attention equals the dense path, value and gradients, on the masks training
makes (causal, packed segments, prefix-shared trees, padding), and skips what it should."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax.core.models.block_attention import block_attention, live_pairs
from rlax.core.models.transformer import causal_mask, tree_ids

B, T, K, G, H = 2, 45, 2, 2, 8


def dense(q, k, v, mask):
    """The dense training path of ``layers.Attention`` (scores, -1e9 where masked, softmax)."""
    s = jnp.einsum("btkgh,bskh->bkgts", q, k)
    s = jnp.where(mask[:, None, None], s, -1e9)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bkgts,bskh->btkgh", p, v)


def masks() -> dict[str, jax.Array]:
    valid = np.ones((B, T), bool)
    valid[1, :7] = False  # a left-padded row
    segments = np.zeros((B, T), np.int32)
    segments[0, :20], segments[0, 20:41] = 1, 2  # two sequences, 4 padding
    segments[1, :T] = 3
    # Trees: a shared piece (segment 1) and branches (2, 3) that see it; another tree after.
    seg = np.zeros((B, T), np.int32)
    par = np.zeros((B, T), np.int32)
    seg[0, :17], seg[0, 17:26], seg[0, 26:40] = 1, 2, 3
    par[0, 17:40] = 1
    seg[1, :9], seg[1, 9:30], seg[1, 30:44] = 4, 5, 6
    par[1, 9:44] = 4
    return {
        "causal": causal_mask(jnp.asarray(valid)),
        "packed": causal_mask(jnp.asarray(segments)),
        "tree": causal_mask(tree_ids(jnp.asarray(seg), jnp.asarray(par))),
    }


def inputs(seed: int = 0):
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (B, T, K, G, H)) / np.sqrt(H)
    k = jax.random.normal(keys[1], (B, T, K, H))
    v = jax.random.normal(keys[2], (B, T, K, H))
    w = jax.random.normal(keys[3], (B, T, K, G, H))
    return q, k, v, w


@pytest.mark.parametrize("block", [8, 16, 64])
@pytest.mark.parametrize("kind", ["causal", "packed", "tree"])
def test_values_and_gradients_equal_the_dense_path(kind, block):
    mask = masks()[kind]
    q, k, v, w = inputs()
    seen = np.asarray(mask.any(-1))  # queries that see a key: the ones any loss reads
    w = w * seen[:, :, None, None, None]

    def loss(fn):
        return lambda q, k, v: (fn(q, k, v) * w).sum()

    got = jax.jit(lambda q, k, v: block_attention(q, k, v, mask, block))(q, k, v)
    want = dense(q, k, v, mask)
    np.testing.assert_allclose(np.asarray(got)[seen], np.asarray(want)[seen], atol=1e-5)
    assert np.isfinite(np.asarray(got)).all()  # padding queries too
    grads = jax.grad(loss(lambda q, k, v: block_attention(q, k, v, mask, block)), (0, 1, 2))
    dense_grads = jax.grad(loss(lambda q, k, v: dense(q, k, v, mask)), (0, 1, 2))
    for a, b in zip(jax.jit(grads)(q, k, v), dense_grads(q, k, v)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_only_blocks_the_mask_reaches_are_live():
    """By hand: a causal row of 4 blocks has 10 live pairs of 16; a packed row of two
    sequences of 2 blocks each 6; a tree of a 2-block prefix and two 1-block branches
    3 (the prefix) + 2 x (2 + 1) = 9."""
    t, blk = 32, 8
    causal = causal_mask(jnp.ones((1, t), bool))
    packed = causal_mask(jnp.asarray(np.repeat([1, 2], 16)[None]))
    seg = np.asarray([1] * 16 + [2] * 8 + [3] * 8)[None]
    par = np.asarray([0] * 16 + [1] * 16)[None]
    tree = causal_mask(tree_ids(jnp.asarray(seg), jnp.asarray(par)))
    for mask, want in ((causal, 10), (packed, 6), (tree, 9)):
        triples, count = live_pairs(mask, blk)
        assert int(count) == want
        live = {tuple(x) for x in np.asarray(triples)[: int(count)].tolist()}
        blocks = np.asarray(mask).reshape(4, blk, 4, blk).any(axis=(1, 3))
        assert live == {(0, i, j) for i, j in zip(*np.nonzero(blocks))}


def test_one_program_serves_every_mask_of_a_shape():
    """The live list's length is data: new masks of the same shape never recompile."""
    q, k, v, _ = inputs()
    traced = []

    @jax.jit
    def run(q, k, v, mask):
        traced.append(1)
        return block_attention(q, k, v, mask, 16)

    for mask in masks().values():
        run(q, k, v, mask)
    assert len(traced) == 1
