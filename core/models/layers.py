"""The decoder's layers: grouped-query attention with its KV cache, the SwiGLU MLP, a block.

A block is pre-RMSNorm attention then pre-RMSNorm MLP, each with a residual.
Attention writes this call's keys and values into the cache it is given
(prefill and decode) or attends within the call (training), and reads keys
through an explicit [B, T, S] mask, so left-padded prompts work everywhere.
Shapes as in :mod:`rlax.core.models.transformer`.

Context parallelism (the mesh's ``context`` axis, :func:`split_sequence`): in
training each device holds T / c of a row's queries; each layer all-gathers
the row's keys and values over the axis and scores its queries against all of
them, so the result is exactly the unsplit attention (GQA's keys and values are
K / N of the queries' size: the gather moves less than a ring would pass, and
every device scores T / c x T, so the causal mask leaves no device idle).

References:
  Vaswani et al., 2017, https://arxiv.org/abs/1706.03762 (the transformer)
  Ainslie et al., 2023, https://arxiv.org/abs/2305.13245 (grouped-query attention)
  Shazeer, 2020, https://arxiv.org/abs/2002.05202 (SwiGLU)
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlax.core.models.block_attention import block_attention
from rlax.core.models.config import TransformerConfig
from rlax.core.models.rope import rotate

# A large finite negative instead of -inf: a query whose keys are all masked
# (a left-pad position) gets a uniform softmax instead of NaNs.
_MASKED = -1e9


class Attention(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, n, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q = nnx.Linear(d, n * h, use_bias=cfg.qkv_bias, rngs=rngs)
        self.k = nnx.Linear(d, k * h, use_bias=cfg.qkv_bias, rngs=rngs)
        self.v = nnx.Linear(d, k * h, use_bias=cfg.qkv_bias, rngs=rngs)
        self.o = nnx.Linear(n * h, d, use_bias=cfg.o_bias, rngs=rngs)
        if cfg.qk_norm:  # over each head (Qwen3) or the whole projection (OLMoE)
            whole = cfg.qk_norm_scope == "projection"
            self.q_norm = nnx.RMSNorm(n * h if whole else h, epsilon=cfg.norm_eps, rngs=rngs)
            self.k_norm = nnx.RMSNorm(k * h if whole else h, epsilon=cfg.norm_eps, rngs=rngs)
        self.sequence_mesh: Mesh | None = None  # set by split_sequence
        self.sequence_rows: tuple[str, ...] = ()  # the mesh axes that split rows
        self.block = 0  # set by attend_in_blocks: training attention in blocks of this size

    def project(
        self,
        x: jax.Array,
        rope: tuple[jax.Array, jax.Array],  # x [B, T, D]
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Rotated, scaled queries [B, T, K, G, H] (the G query heads of each KV
        head together) and rotated keys and values [B, T, K, H]."""
        cfg = self.cfg
        b, t, d = x.shape
        # Projections on [B*T, D]: one plain matmul each (XLA:CPU runs a rank-3
        # dot and its weight gradient markedly slower than the flattened one). Not when
        # the sequence is split: rows x a split sequence do not flatten without a gather.
        if self.sequence_mesh is None:
            x = x.reshape(b * t, d)
        q, k = self.q(x), self.k(x)
        if cfg.qk_norm and cfg.qk_norm_scope == "projection":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.reshape(b, t, cfg.num_heads, cfg.head_dim)
        k = k.reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        v = self.v(x).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm and cfg.qk_norm_scope == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, rope), rotate(k, rope)
        groups = cfg.num_heads // cfg.num_kv_heads
        q = q.reshape(b, t, cfg.num_kv_heads, groups, cfg.head_dim) / math.sqrt(cfg.head_dim)
        return q, k, v

    def __call__(
        self,
        x: jax.Array,  # [B, T, D]
        rope: tuple[jax.Array, jax.Array],  # rope_tables of the positions
        attn_mask: jax.Array,  # [B, T, S] bool
        cache: dict[str, jax.Array] | None,
        cache_index: jax.Array | int | None,  # the first slot written; given with a cache
    ) -> tuple[jax.Array, dict[str, jax.Array] | None]:
        cfg = self.cfg
        b, t, d = x.shape
        q, k, v = self.project(x, rope)
        kv, groups = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads
        groups_t = groups * t
        if cache is None and self.sequence_mesh is not None:
            return self.o(self._split_attention(q, k, v, attn_mask).reshape(b, t, -1)), None
        if cache is None and self.block:
            out = block_attention(q, k, v, attn_mask, self.block)
            return self.o(out.reshape(b * t, -1)).reshape(b, t, d), None
        if cache is None:
            # The G query heads that share a KV head stacked as rows: one plain
            # [G*T, H] x [H, S] product per (sequence, KV head). XLA:CPU runs it
            # ~15% faster (forward and backward) than the 5-d einsum.
            q_rows = q.transpose(0, 2, 3, 1, 4).reshape(b, kv, groups_t, cfg.head_dim)
            v = v.transpose(0, 2, 1, 3)  # [B, K, S, H]
            scores = jnp.einsum("bkqh,bskh->bkqs", q_rows, k).reshape(b, kv, groups, t, -1)
        else:
            # The cache is kept in the layout the products read, so a decode step
            # never transposes it: keys [B,K,H,S], values [B,K,S,H].
            assert cache_index is not None, "a cache is written at a cache_index"
            k_t = k.transpose(0, 2, 3, 1).astype(cache["k"].dtype)
            v = v.transpose(0, 2, 1, 3).astype(cache["v"].dtype)
            cache = {
                "k": jax.lax.dynamic_update_slice(cache["k"], k_t, (0, 0, 0, cache_index)),
                "v": jax.lax.dynamic_update_slice(cache["v"], v, (0, 0, cache_index, 0)),
            }
            if t == 1:
                out = decode_attention(q[:, 0], cache["k"], cache["v"], attn_mask[:, 0])
                return self.o(out.reshape(b, -1)).reshape(b, t, d), cache
            scores = jnp.einsum("btkgh,bkhs->bkgts", q, cache["k"])
        scores = jnp.where(attn_mask[:, None, None, :, :], scores, _MASKED)
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
        if cache is None:
            out = jnp.einsum("bkqs,bksh->bkqh", probs.reshape(b, kv, groups_t, -1), v)
            out = out.reshape(b, kv, groups, t, cfg.head_dim).transpose(0, 3, 1, 2, 4)
        else:
            out = jnp.einsum("bkgts,bksh->btkgh", probs, cache["v"])
        out = out.reshape(b * t, -1)
        return self.o(out).reshape(b, t, d), cache

    def _split_attention(
        self, q: jax.Array, k: jax.Array, v: jax.Array, attn_mask: jax.Array
    ) -> jax.Array:
        """Training attention with the sequence split over the mesh's ``context`` axis:
        queries [B, T, K, G, H] stay split, keys and values [B, S, K, H] are gathered whole;
        the output [B, T, K, G, H] is split as the queries are."""
        mesh = self.sequence_mesh
        assert mesh is not None
        free = PartitionSpec.UNCONSTRAINED

        def put(x: jax.Array, *spec: Any) -> jax.Array:
            return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))

        rows = self.sequence_rows
        q = put(q, rows, "context", free, free, free)
        k, v = put(k, rows, None, free, free), put(v, rows, None, free, free)
        scores = put(jnp.einsum("btkgh,bskh->bkgts", q, k), rows, free, free, "context", None)
        mask = put(attn_mask, rows, "context", None)
        scores = jnp.where(mask[:, None, None, :, :], scores, _MASKED)
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
        return put(jnp.einsum("bkgts,bskh->btkgh", probs, v), rows, "context", free, free, free)


def split_sequence(module: nnx.Module, mesh: Mesh, rows: tuple[str, ...]) -> None:
    """Every attention layer of ``module`` attends with its sequence split over ``mesh``'s
    ``context`` axis (:meth:`Attention._split_attention`) and its rows over the ``rows``
    axes; a no-op on a context size of 1."""
    if dict(mesh.shape).get("context", 1) == 1:
        return
    for _, m in nnx.iter_modules(module):
        if isinstance(m, Attention):
            m.sequence_mesh, m.sequence_rows = mesh, rows
        elif isinstance(m, MLP):
            m.flatten = False


def attend_in_blocks(module: nnx.Module, block: int) -> None:
    """Every attention layer of ``module`` computes training attention (no cache) in
    ``block`` x ``block`` blocks, only those its mask reaches
    (:mod:`rlax.core.models.block_attention`); 0: dense. A split sequence
    (:func:`split_sequence`) keeps its own path."""
    for _, m in nnx.iter_modules(module):
        if isinstance(m, Attention):
            m.block = block


def decode_attention(
    q: jax.Array,  # [B, K, G, H], scaled
    keys: jax.Array,  # [B, K, H, S]
    values: jax.Array,  # [B, K, S, H]
    key_mask: jax.Array,  # [B, S] bool
) -> jax.Array:
    """One query per row against its cached keys and values: [B, K, G, H].

    A broadcast product and sum that reads each cached key and value once,
    instead of batches of tiny matmuls.
    """
    scores = jnp.sum(q[..., None] * keys[:, :, None], axis=3)  # [B, K, G, S]
    scores = jnp.where(key_mask[:, None, None, :], scores, _MASKED)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(values.dtype)
    return jnp.sum(probs[..., None] * values[:, :, None], axis=3)


class MLP(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.gate = nnx.Linear(cfg.embed_dim, cfg.mlp_dim, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(cfg.embed_dim, cfg.mlp_dim, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(cfg.mlp_dim, cfg.embed_dim, use_bias=False, rngs=rngs)
        self.flatten = True  # [B*T, D] matmuls; False with the sequence split (split_sequence)

    def __call__(self, x: jax.Array) -> jax.Array:
        shape = x.shape
        if self.flatten:
            x = x.reshape(-1, shape[-1])  # [B*T, D]: see Attention
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x)).reshape(shape)


class Block(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.attn_norm = nnx.RMSNorm(cfg.embed_dim, epsilon=cfg.norm_eps, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(cfg.embed_dim, epsilon=cfg.norm_eps, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, rope, attn_mask, cache, cache_index):
        h, cache = self.attn(self.attn_norm(x), rope, attn_mask, cache, cache_index)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), cache
