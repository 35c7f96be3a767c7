"""A decoder-only transformer in flax nnx, with an explicit KV cache.

The layer stack is the Llama recipe: pre-RMSNorm, rotary position embeddings,
grouped-query attention, SwiGLU MLP, tied or untied output head. Two switches
cover the Qwen families: ``qkv_bias`` (Qwen2: biases on the q/k/v projections)
and ``qk_norm`` (Qwen3: an RMSNorm over each head's query and key before RoPE).
RoPE takes the config's theta and optional scaling (``linear`` or ``llama3``). The same
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
  Qwen Team, 2024, https://arxiv.org/abs/2407.10671 (Qwen2: q/k/v bias)
  Qwen Team, 2025, https://arxiv.org/abs/2505.09388 (Qwen3: q/k RMSNorm)
  Meta, 2024, https://arxiv.org/abs/2407.21783 (Llama 3: RoPE frequency scaling)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

# A large finite negative instead of -inf: a query whose keys are all masked
# (a left-pad position) gets a uniform softmax instead of NaNs.
_MASKED = -1e9

KVCache = list[dict[str, jax.Array]]  # per layer: {"k": [B,K,H,S], "v": [B,K,S,H]}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (hashable, so a config stays a jit-static value).

    ``kind`` is ``"linear"`` (every frequency divided by ``factor``) or
    ``"llama3"`` (low frequencies divided by ``factor``, high ones kept, a
    smooth blend between; the band edges are ``original_max_position /
    low_freq_factor`` and ``original_max_position / high_freq_factor`` in
    wavelength).
    """

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "llama3"):
            raise ValueError(f"RopeScaling.kind must be 'linear' or 'llama3', got {self.kind!r}")
        if self.factor <= 0:
            raise ValueError(f"RopeScaling.factor must be positive, got {self.factor}")
        if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError(
                "RopeScaling (llama3): need high_freq_factor > low_freq_factor > 0, got "
                f"{self.high_freq_factor} and {self.low_freq_factor}"
            )


# Fields added after the first saved models: written by ``to_dict`` only when
# they differ from these defaults, so older model.json files stay byte-identical.
_LATER_FIELDS = {"qkv_bias": False, "o_bias": False, "qk_norm": False, "rope_scaling": None}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Architecture of a decoder. Frozen: one value names one model shape.

    Attributes:
      qkv_bias: biases on the q, k and v projections (Qwen2; Llama's
        ``attention_bias`` sets this and ``o_bias``).
      o_bias: a bias on the attention output projection.
      qk_norm: RMSNorm (over the head dim, weights shared across heads) on
        queries and keys before RoPE (Qwen3).
      rope_scaling: optional RoPE frequency scaling.
    """

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
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    rope_scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        for field in ("vocab_size", "num_layers", "embed_dim", "num_heads", "head_dim", "mlp_dim"):
            if getattr(self, field) <= 0:
                raise ValueError(f"TransformerConfig.{field} must be positive")
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"TransformerConfig.head_dim must be even for RoPE, got {self.head_dim}"
            )
        if isinstance(self.rope_scaling, dict):  # from_dict / hand-written values
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))

    # -- presets ----------------------------------------------------------------

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

    @classmethod
    def qwen2_small(cls, vocab_size: int = 1024) -> TransformerConfig:
        """A small Qwen2-style model (q/k/v bias, untied head) for benchmarks: ~4M parameters."""
        return cls(
            vocab_size=vocab_size, num_layers=4, embed_dim=256, num_heads=4, num_kv_heads=2,
            head_dim=64, mlp_dim=1024, rope_theta=1_000_000.0, tie_embeddings=False,
            qkv_bias=True,
        )  # fmt: skip

    @classmethod
    def smollm2_135m(cls) -> TransformerConfig:
        """HuggingFaceTB/SmolLM2-135M(-Instruct): Llama, 30 layers, tied head."""
        return cls(
            vocab_size=49152, num_layers=30, embed_dim=576, num_heads=9, num_kv_heads=3,
            head_dim=64, mlp_dim=1536, rope_theta=100_000.0, norm_eps=1e-5,
        )  # fmt: skip

    @classmethod
    def qwen2_5_0_5b(cls) -> TransformerConfig:
        """Qwen/Qwen2.5-0.5B(-Instruct): q/k/v bias, tied head."""
        return cls(
            vocab_size=151936, num_layers=24, embed_dim=896, num_heads=14, num_kv_heads=2,
            head_dim=64, mlp_dim=4864, rope_theta=1_000_000.0, qkv_bias=True,
        )  # fmt: skip

    @classmethod
    def qwen3_0_6b(cls) -> TransformerConfig:
        """Qwen/Qwen3-0.6B: q/k RMSNorm, head dim 128 (wider than embed / heads), tied head."""
        return cls(
            vocab_size=151936, num_layers=28, embed_dim=1024, num_heads=16, num_kv_heads=8,
            head_dim=128, mlp_dim=3072, rope_theta=1_000_000.0, qk_norm=True,
        )  # fmt: skip

    @classmethod
    def llama3_2_1b(cls) -> TransformerConfig:
        """meta-llama/Llama-3.2-1B: llama3 RoPE scaling (factor 32), tied head."""
        return cls(
            vocab_size=128256, num_layers=16, embed_dim=2048, num_heads=32, num_kv_heads=8,
            head_dim=64, mlp_dim=8192, rope_theta=500_000.0, norm_eps=1e-5,
            rope_scaling=RopeScaling("llama3", 32.0, 1.0, 4.0, 8192),
        )  # fmt: skip

    @classmethod
    def from_hf(cls, config: Any) -> TransformerConfig:
        """From an HF ``config.json`` (a path, a model directory or the parsed dict)."""
        from rlax.core.models.hf_config import config_from_hf

        return config_from_hf(config)

    # -- plain-dict round trip --------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        for name, default in _LATER_FIELDS.items():
            if values[name] == default:
                del values[name]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TransformerConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown TransformerConfig fields: {sorted(unknown)}")
        return cls(**values)

    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        d, n, k, h, f = (
            self.embed_dim,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.mlp_dim,
        )
        attn = d * (n + 2 * k) * h + n * h * d
        attn += (n + 2 * k) * h * self.qkv_bias + d * self.o_bias + 2 * h * self.qk_norm
        layer = attn + 3 * d * f + 2 * d
        head = 0 if self.tie_embeddings else d * self.vocab_size
        return self.vocab_size * d + self.num_layers * layer + d + head


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> jax.Array:
    """Angular frequency of each rotated pair, [H/2]: theta^(-2i/H), then scaled.

    The llama3 rule follows Meta's reference code for Llama 3.1 (wavelength
    bands set by ``original_max_position / {low,high}_freq_factor``).
    """
    half = head_dim // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    if scaling is None:
        return freq
    if scaling.kind == "linear":
        return freq / scaling.factor
    wavelen = 2 * math.pi / freq
    low_wavelen = scaling.original_max_position / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position / scaling.high_freq_factor
    smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * freq / scaling.factor + smooth * freq
    return jnp.where(
        wavelen > low_wavelen,
        freq / scaling.factor,
        jnp.where(wavelen < high_wavelen, freq, blended),
    )


def rope_tables(
    positions: jax.Array, head_dim: int, theta: float, scaling: RopeScaling | None = None
) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) of angle position * frequency_i, each [B, T, 1, H/2], for :func:`rotate`.

    A forward pass computes them once for all its layers, as arrays of their
    own: otherwise XLA recomputes the sines and cosines inside every fusion
    that rotates q or k, forward and backward, once per output element
    (measured: ~71 ms of the ~1.1 s benchmark train step).

    Args:
      positions: [B, T] integer positions.
      head_dim: H, the size of each rotated head.
      theta: the RoPE base.
      scaling: optional frequency scaling (:func:`rope_frequencies`).
    """
    freq = rope_frequencies(head_dim, theta, scaling)  # [H/2]
    angle = positions[..., None].astype(jnp.float32) * freq  # [B, T, H/2]
    tables = jnp.stack([jnp.cos(angle), jnp.sin(angle)])[:, :, :, None, :]
    # An exact no-op on float32 that XLA does not fuse into the tables' consumers:
    # without it every rotation recomputes the sines and cosines for each of its
    # output elements (measured: 4 ms of each rotation's 5 on the benchmark step).
    tables = jax.lax.reduce_precision(tables, exponent_bits=8, mantissa_bits=23)
    return tables[0], tables[1]


def rotate(x: jax.Array, tables: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Rotates feature pairs (i, i + H/2) of x [B, T, heads, H] by the angles of ``tables``.

    This is the "rotate half" layout of HF checkpoints; llama.cpp's GGUF
    files store q/k rows interleaved instead (see ``gguf.py``).
    """
    cos, sin = tables
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def apply_rope(
    x: jax.Array, positions: jax.Array, theta: float, scaling: RopeScaling | None = None
) -> jax.Array:
    """RoPE of x [B, T, heads, H] at ``positions`` [B, T]: :func:`rotate` by :func:`rope_tables`."""
    return rotate(x, rope_tables(positions, x.shape[-1], theta, scaling))


class Attention(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, n, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q = nnx.Linear(d, n * h, use_bias=cfg.qkv_bias, rngs=rngs)
        self.k = nnx.Linear(d, k * h, use_bias=cfg.qkv_bias, rngs=rngs)
        self.v = nnx.Linear(d, k * h, use_bias=cfg.qkv_bias, rngs=rngs)
        self.o = nnx.Linear(n * h, d, use_bias=cfg.o_bias, rngs=rngs)
        if cfg.qk_norm:
            self.q_norm = nnx.RMSNorm(h, epsilon=cfg.norm_eps, rngs=rngs)
            self.k_norm = nnx.RMSNorm(h, epsilon=cfg.norm_eps, rngs=rngs)

    def __call__(
        self,
        x: jax.Array,  # [B, T, D]
        rope: tuple[jax.Array, jax.Array],  # rope_tables of the positions
        attn_mask: jax.Array,  # [B, T, S] bool
        cache: dict[str, jax.Array] | None,
        cache_index: jax.Array | None,
    ) -> tuple[jax.Array, dict[str, jax.Array] | None]:
        cfg = self.cfg
        b, t, d = x.shape
        # Projections on [B*T, D]: one plain matmul each (XLA:CPU runs a rank-3
        # dot and its weight gradient markedly slower than the flattened one).
        x = x.reshape(b * t, d)
        q = self.q(x).reshape(b, t, cfg.num_heads, cfg.head_dim)
        k = self.k(x).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        v = self.v(x).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, rope), rotate(k, rope)
        groups = cfg.num_heads // cfg.num_kv_heads
        q = q.reshape(b, t, cfg.num_kv_heads, groups, cfg.head_dim) / math.sqrt(cfg.head_dim)
        kv, groups_t = cfg.num_kv_heads, groups * t
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
            k_t = k.transpose(0, 2, 3, 1).astype(cache["k"].dtype)
            v = v.transpose(0, 2, 1, 3).astype(cache["v"].dtype)
            cache = {
                "k": jax.lax.dynamic_update_slice(cache["k"], k_t, (0, 0, 0, cache_index)),
                "v": jax.lax.dynamic_update_slice(cache["v"], v, (0, 0, cache_index, 0)),
            }
            if t == 1:  # decode: a broadcast product and sum that reads each cached key once
                q1 = q[:, 0, :, :, :, None]  # [B,K,G,H,1]
                scores = jnp.sum(q1 * cache["k"][:, :, None], axis=3)[:, :, :, None]
            else:
                scores = jnp.einsum("btkgh,bkhs->bkgts", q, cache["k"])
        scores = jnp.where(attn_mask[:, None, None, :, :], scores, _MASKED)
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
        if cache is None:
            out = jnp.einsum("bkqs,bksh->bkqh", probs.reshape(b, kv, groups_t, -1), v)
            out = out.reshape(b, kv, groups, t, cfg.head_dim).transpose(0, 3, 1, 2, 4)
        elif t == 1:
            p1 = probs[:, :, :, 0, :, None]  # [B,K,G,S,1]
            out = jnp.sum(p1 * cache["v"][:, :, None], axis=3)[:, None]  # [B,1,K,G,H]
        else:
            out = jnp.einsum("bkgts,bksh->btkgh", probs, cache["v"])
        out = out.reshape(b * t, -1)
        return self.o(out).reshape(b, t, d), cache


class MLP(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.gate = nnx.Linear(cfg.embed_dim, cfg.mlp_dim, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(cfg.embed_dim, cfg.mlp_dim, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(cfg.mlp_dim, cfg.embed_dim, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        shape = x.shape
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
        x, new_cache = self.hidden_states(tokens, positions, attn_mask, cache, cache_index)
        return self.logits(x), new_cache

    def hidden_states(
        self,
        tokens: jax.Array,  # [B, T]
        positions: jax.Array,  # [B, T]
        attn_mask: jax.Array,  # [B, T, S] bool
        cache: KVCache | None = None,
        cache_index: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """The final-normed hidden states [B, T, D] (and the cache): ``__call__`` without the head.

        A sampler's prefill needs logits at the last position only; on a large
        vocabulary the head over every prompt position is a tenth of its work.
        """
        x = self.embed(tokens)
        cfg = self.cfg
        rope = rope_tables(positions, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        new_cache: KVCache | None = [] if cache is not None else None
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(
                x, rope, attn_mask, None if cache is None else cache[i], cache_index
            )
            if new_cache is not None:
                new_cache.append(layer_cache)
        return self.final_norm(x), new_cache

    def logits(self, x: jax.Array) -> jax.Array:
        """The output head on hidden states [..., D] -> float32 logits [..., V]."""
        flat = x.reshape(-1, x.shape[-1])  # [*, D]: see Attention
        if self.cfg.tie_embeddings:
            logits = self.embed.attend(flat)
        else:
            logits = self.head(flat)
        return logits.reshape(*x.shape[:-1], -1).astype(jnp.float32)


def init_cache(cfg: TransformerConfig, batch: int, length: int, dtype=jnp.float32) -> KVCache:
    """Zeroed per-layer keys [B, K, H, S] and values [B, K, S, H] (S = ``length`` slots)."""
    k, h = cfg.num_kv_heads, cfg.head_dim
    return [
        {"k": jnp.zeros((batch, k, h, length), dtype), "v": jnp.zeros((batch, k, length, h), dtype)}
        for _ in range(cfg.num_layers)
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
