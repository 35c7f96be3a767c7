"""Training attention that computes only the blocks its mask reaches.

Dense training attention scores every query against every key of its row and
masks afterwards: a causal row wastes half its scores, a packed row every
score across its sequences, and a prefix-shared row (:mod:`rlax.core.trainer.prefix`)
every score between two branches of a tree. Here the row is cut into square
blocks of ``block`` positions; a (query block, key block) pair is *live* when
its piece of the mask holds any True, and only live pairs are computed, in a
loop over their list (its length is data, so the work follows the mask, not
the row's width).

The forward pass keeps the softmax online over a query block's live key
blocks (a running maximum and sum, as FlashAttention does) and saves the
output and its log-sum-exp; the backward pass recomputes each live block's
probabilities from them and accumulates the gradients of queries, keys and
values (FlashAttention-2's backward). Memory is O(T) beyond the inputs, never
a [T, T] score matrix.

Exactness: a query sees the same keys with the same scores as in the dense
path (masked scores are the same finite -1e9, so a live block's masked
entries weigh exp(-1e9 - max) = 0 beside any visible key); only the order of
the sums differs (float rounding). A query that sees no key at all (padding)
gets an output that is finite but not the dense path's (which averages every
key of the row); no loss reads it.

References:
  Dao et al., 2022, https://arxiv.org/abs/2205.14135 (FlashAttention: online softmax)
  Dao, 2023, https://arxiv.org/abs/2307.08691 (FlashAttention-2: the backward pass)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_MASKED = -1e9  # the dense path's masked score (layers._MASKED)


def live_pairs(mask: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """The live (row, query block, key block) triples of a [B, T, S] mask (T, S multiples of
    ``block``), as int32 [B * nq * nk, 3] (the live ones first, in row-major order) and
    their count."""
    b, t, s = mask.shape
    nq, nk = t // block, s // block
    live = mask.reshape(b, nq, block, nk, block).any(axis=(2, 4)).reshape(-1)
    (flat,) = jnp.nonzero(live, size=live.shape[0], fill_value=0)
    triples = jnp.stack(jnp.unravel_index(flat, (b, nq, nk)), axis=-1).astype(jnp.int32)
    return triples, live.sum(dtype=jnp.int32)


def _pad(x: jax.Array, axes: tuple[int, ...], to: int) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    for axis in axes:
        widths[axis] = (0, to - x.shape[axis])
    return jnp.pad(x, widths)


def block_attention(
    q: jax.Array,  # [B, T, K, G, H], scaled
    k: jax.Array,  # [B, T, K, H]
    v: jax.Array,  # [B, T, K, H]
    mask: jax.Array,  # [B, T, T] bool
    block: int,
) -> jax.Array:
    """Attention of ``q`` over ``k``/``v`` where ``mask`` allows, [B, T, K, G, H] in v's dtype,
    computing only the live blocks (see the module docstring)."""
    t = q.shape[1]
    padded = -(-t // block) * block
    qp, kp, vp = _pad(q, (1,), padded), _pad(k, (1,), padded), _pad(v, (1,), padded)
    maskp = _pad(mask, (1, 2), padded)
    triples, count = live_pairs(maskp, block)
    out = _attention(qp, kp, vp, maskp, triples, count, block)
    return out[:, :t].astype(v.dtype)


def _slices(block: int):
    def rows(x: jax.Array, b: jax.Array, i: jax.Array) -> jax.Array:
        start = (b, i * block) + (0,) * (x.ndim - 2)
        return jax.lax.dynamic_slice(x, start, (1, block, *x.shape[2:]))[0]

    def put(x: jax.Array, b: jax.Array, i: jax.Array, value: jax.Array) -> jax.Array:
        start = (b, i * block) + (0,) * (x.ndim - 2)
        return jax.lax.dynamic_update_slice(x, value[None], start)

    def scores(q, k, mask, b, qi, kj):
        """[blk, K, G, blk] f32 scores of a pair, masked like the dense path."""
        qb, kb = rows(q, b, qi), rows(k, b, kj)
        s = jnp.einsum("tkgh,skh->tkgs", qb, kb, preferred_element_type=jnp.float32)
        start = (b, qi * block, kj * block)
        mb = jax.lax.dynamic_slice(mask, start, (1, block, block))[0]
        return jnp.where(mb[:, None, None, :], s, _MASKED), mb

    return rows, put, scores


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attention(q, k, v, mask, triples, count, block):
    return _forward(q, k, v, mask, triples, count, block)[0]


def _forward(q, k, v, mask, triples, count, block):
    rows, put, scores = _slices(block)
    b, t, kv, g, h = q.shape
    m0 = jnp.full((b, t, kv, g), -jnp.inf, jnp.float32)
    l0 = jnp.zeros((b, t, kv, g), jnp.float32)
    acc0 = jnp.zeros((b, t, kv, g, h), jnp.float32)

    def body(n, carry):
        m, l, acc = carry
        row, qi, kj = triples[n, 0], triples[n, 1], triples[n, 2]
        s, _ = scores(q, k, mask, row, qi, kj)
        m_old, l_old, acc_old = rows(m, row, qi), rows(l, row, qi), rows(acc, row, qi)
        m_new = jnp.maximum(m_old, s.max(axis=-1))
        p = jnp.exp(s - m_new[..., None])
        scale = jnp.exp(m_old - m_new)
        vb = rows(v, row, kj).astype(jnp.float32)
        l_new = l_old * scale + p.sum(axis=-1)
        acc_new = acc_old * scale[..., None] + jnp.einsum("tkgs,skh->tkgh", p, vb)
        return put(m, row, qi, m_new), put(l, row, qi, l_new), put(acc, row, qi, acc_new)

    m, l, acc = jax.lax.fori_loop(0, count, body, (m0, l0, acc0))
    seen = l > 0
    out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
    return out, lse


def _attention_fwd(q, k, v, mask, triples, count, block):
    out, lse = _forward(q, k, v, mask, triples, count, block)
    return out, (q, k, v, mask, triples, count, out, lse)


def _attention_bwd(block, residuals, d_out):
    q, k, v, mask, triples, count, out, lse = residuals
    rows, put, scores = _slices(block)
    d_out = d_out.astype(jnp.float32)
    delta = (d_out * out).sum(axis=-1)  # [B, T, K, G]
    zeros = [jnp.zeros(x.shape, jnp.float32) for x in (q, k, v)]

    def body(n, carry):
        dq, dk, dv = carry
        row, qi, kj = triples[n, 0], triples[n, 1], triples[n, 2]
        s, mb = scores(q, k, mask, row, qi, kj)
        p = jnp.exp(s - rows(lse, row, qi)[..., None])  # [t, K, G, s]
        do = rows(d_out, row, qi)  # [t, K, G, H]
        qb = rows(q, row, qi).astype(jnp.float32)
        kb, vb = rows(k, row, kj).astype(jnp.float32), rows(v, row, kj).astype(jnp.float32)
        dp = jnp.einsum("tkgh,skh->tkgs", do, vb)
        ds = jnp.where(mb[:, None, None, :], p * (dp - rows(delta, row, qi)[..., None]), 0.0)
        dq = put(dq, row, qi, rows(dq, row, qi) + jnp.einsum("tkgs,skh->tkgh", ds, kb))
        dk = put(dk, row, kj, rows(dk, row, kj) + jnp.einsum("tkgs,tkgh->skh", ds, qb))
        dv = put(dv, row, kj, rows(dv, row, kj) + jnp.einsum("tkgs,tkgh->skh", p, do))
        return dq, dk, dv

    dq, dk, dv = jax.lax.fori_loop(0, count, body, tuple(zeros))
    return (
        dq.astype(q.dtype),
        dk.astype(k.dtype),
        dv.astype(v.dtype),
        None,
        None,
        None,
    )


_attention.defvjp(_attention_fwd, _attention_bwd)
