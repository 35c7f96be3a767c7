"""A decoder-only transformer in flax nnx, with an explicit KV cache.

The layer stack is the Llama recipe: pre-RMSNorm, rotary position embeddings,
grouped-query attention, SwiGLU MLP, tied or untied output head. The same
forward pass serves training (no cache), prefill (fills the cache) and decode
(one token at a time against the cache); callers pass positions and a key
mask explicitly, so left-padded prompts work everywhere.

Shape legend: B batch, T query length, S cache length (key slots), N query
heads, K key/value heads, H head dim, D embed dim, F mlp dim, V vocabulary.

References:
  Vaswani et al., 2017, https://arxiv.org/abs/1706.03762 (the transformer)
  Su et al., 2021, https://arxiv.org/abs/2104.09864 (RoPE)
  Ainslie et al., 2023, https://arxiv.org/abs/2305.13245 (grouped-query attention)
  Shazeer, 2020, https://arxiv.org/abs/2002.05202 (SwiGLU)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

# A large finite negative instead of -inf: a query whose keys are all masked
# (a left-pad position) gets a uniform softmax instead of NaNs.
_MASKED = -1e9

KVCache = list[dict[str, jax.Array]]  # per layer: {"k": [B,S,K,H], "v": [B,S,K,H]}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Architecture of a decoder. Frozen: one value names one model shape."""

    vocab_size: int
    num_layers: int
    embed_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for field in ("vocab_size", "num_layers", "embed_dim", "num_heads", "head_dim", "mlp_dim"):
            if getattr(self, field) <= 0:
                raise ValueError(f"TransformerConfig.{field} must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    @classmethod
    def tiny(cls, vocab_size: int) -> TransformerConfig:
        """The quickstart's model: ~0.4M parameters, trains on two CPU cores."""
        return cls(
            vocab_size=vocab_size,
            num_layers=4,
            embed_dim=128,
            num_heads=4,
            num_kv_heads=2,
            head_dim=32,
            mlp_dim=384,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TransformerConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown TransformerConfig fields: {sorted(unknown)}")
        return cls(**values)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotates feature pairs (i, i + H/2) by angle position / theta^(2i/H).

    Args:
      x: [B, T, heads, H]
      positions: [B, T] integer positions.
      theta: the RoPE base.
    """
    half = x.shape[-1] // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)  # [H/2]
    angle = positions[..., None].astype(jnp.float32) * freq  # [B, T, H/2]
    sin = jnp.sin(angle)[:, :, None, :]
    cos = jnp.cos(angle)[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, n, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q = nnx.Linear(d, n * h, use_bias=False, rngs=rngs)
        self.k = nnx.Linear(d, k * h, use_bias=False, rngs=rngs)
        self.v = nnx.Linear(d, k * h, use_bias=False, rngs=rngs)
        self.o = nnx.Linear(n * h, d, use_bias=False, rngs=rngs)

    def __call__(
        self,
        x: jax.Array,  # [B, T, D]
        positions: jax.Array,  # [B, T]
        attn_mask: jax.Array,  # [B, T, S] bool
        cache: dict[str, jax.Array] | None,
        cache_index: jax.Array | None,
    ) -> tuple[jax.Array, dict[str, jax.Array] | None]:
        cfg = self.cfg
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, cfg.num_heads, cfg.head_dim)
        k = self.k(x).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        v = self.v(x).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        q = apply_rope(q, positions, cfg.rope_theta)
        k = apply_rope(k, positions, cfg.rope_theta)
        if cache is not None:
            start = (0, cache_index, 0, 0)
            k = jax.lax.dynamic_update_slice(cache["k"], k.astype(cache["k"].dtype), start)
            v = jax.lax.dynamic_update_slice(cache["v"], v.astype(cache["v"].dtype), start)
            cache = {"k": k, "v": v}
        groups = cfg.num_heads // cfg.num_kv_heads
        q = q.reshape(b, t, cfg.num_kv_heads, groups, cfg.head_dim)
        scores = jnp.einsum("btkgh,bskh->bkgts", q, k) / jnp.sqrt(cfg.head_dim).astype(q.dtype)
        scores = jnp.where(attn_mask[:, None, None, :, :], scores, _MASKED)
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgts,bskh->btkgh", probs, v).reshape(b, t, -1)
        return self.o(out), cache


class MLP(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.gate = nnx.Linear(cfg.embed_dim, cfg.mlp_dim, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(cfg.embed_dim, cfg.mlp_dim, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(cfg.mlp_dim, cfg.embed_dim, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class Block(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.attn_norm = nnx.RMSNorm(cfg.embed_dim, epsilon=cfg.norm_eps, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(cfg.embed_dim, epsilon=cfg.norm_eps, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, positions, attn_mask, cache, cache_index):
        h, cache = self.attn(self.attn_norm(x), positions, attn_mask, cache, cache_index)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), cache


class Transformer(nnx.Module):
    """Decoder-only language model.

    ``model(tokens, positions, attn_mask)`` returns logits [B, T, V]; with a
    ``cache`` it also writes this call's keys and values at ``cache_index`` and
    returns the updated cache.
    """

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.embed_dim, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = nnx.RMSNorm(cfg.embed_dim, epsilon=cfg.norm_eps, rngs=rngs)
        if not cfg.tie_embeddings:
            self.head = nnx.Linear(cfg.embed_dim, cfg.vocab_size, use_bias=False, rngs=rngs)

    def __call__(
        self,
        tokens: jax.Array,  # [B, T]
        positions: jax.Array,  # [B, T]
        attn_mask: jax.Array,  # [B, T, S] bool
        cache: KVCache | None = None,
        cache_index: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        x = self.embed(tokens)
        new_cache: KVCache | None = [] if cache is not None else None
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(
                x, positions, attn_mask, None if cache is None else cache[i], cache_index
            )
            if new_cache is not None:
                new_cache.append(layer_cache)
        x = self.final_norm(x)
        if self.cfg.tie_embeddings:
            logits = self.embed.attend(x)
        else:
            logits = self.head(x)
        return logits.astype(jnp.float32), new_cache


def init_cache(cfg: TransformerConfig, batch: int, length: int, dtype=jnp.float32) -> KVCache:
    shape = (batch, length, cfg.num_kv_heads, cfg.head_dim)
    return [
        {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)} for _ in range(cfg.num_layers)
    ]


def causal_mask(attention_mask: jax.Array) -> jax.Array:
    """[B, T] key validity -> [B, T, T] mask: query t sees valid keys s <= t."""
    t = attention_mask.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    return causal[None] & attention_mask[:, None, :]


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
    """Position of each token counting only real tokens (left padding ignored)."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def token_logprobs(
    logits: jax.Array,  # [B, T, V]
    tokens: jax.Array,  # [B, T]
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Log-probability of ``tokens[:, t+1]`` under ``logits[:, t]`` and the entropy.

    Returns:
      logprobs [B, T-1] and entropy [B, T-1] of the (tempered) distributions.
    """
    logp = jax.nn.log_softmax(logits[:, :-1] / temperature, axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return picked, entropy


def sequence_logprobs(
    model: Transformer,
    tokens: jax.Array,  # [B, T]
    attention_mask: jax.Array,  # [B, T]
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Full forward pass: per-token logprobs and entropies, both [B, T-1]."""
    logits, _ = model(tokens, positions_from_mask(attention_mask), causal_mask(attention_mask))
    return token_logprobs(logits, tokens, temperature)
