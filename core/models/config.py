"""A decoder's architecture: :class:`TransformerConfig`, its presets, and RoPE scaling.

One frozen value names one model shape (hashable, so it can be a jit-static
argument); the presets are the architectures rlax ships configs for, and
``to_dict`` / ``from_dict`` are the ``model.json`` round trip of a bundle.
The model built from it is :class:`rlax.core.models.transformer.Transformer`.

References:
  Qwen Team, 2024, https://arxiv.org/abs/2407.10671 (Qwen2: q/k/v bias)
  Qwen Team, 2025, https://arxiv.org/abs/2505.09388 (Qwen3: q/k RMSNorm)
  Meta, 2024, https://arxiv.org/abs/2407.21783 (Llama 3: RoPE frequency scaling)
"""

from __future__ import annotations

import dataclasses
from typing import Any


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
            vocab_size=vocab_size,
            num_layers=4,
            embed_dim=256,
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
            mlp_dim=1024,
            rope_theta=1_000_000.0,
            tie_embeddings=False,
            qkv_bias=True,
        )

    @classmethod
    def smollm2_135m(cls) -> TransformerConfig:
        """HuggingFaceTB/SmolLM2-135M(-Instruct): Llama, 30 layers, tied head."""
        return cls(
            vocab_size=49152,
            num_layers=30,
            embed_dim=576,
            num_heads=9,
            num_kv_heads=3,
            head_dim=64,
            mlp_dim=1536,
            rope_theta=100_000.0,
            norm_eps=1e-5,
        )

    @classmethod
    def qwen2_5_0_5b(cls) -> TransformerConfig:
        """Qwen/Qwen2.5-0.5B(-Instruct): q/k/v bias, tied head."""
        return cls(
            vocab_size=151936,
            num_layers=24,
            embed_dim=896,
            num_heads=14,
            num_kv_heads=2,
            head_dim=64,
            mlp_dim=4864,
            rope_theta=1_000_000.0,
            qkv_bias=True,
        )

    @classmethod
    def qwen3_0_6b(cls) -> TransformerConfig:
        """Qwen/Qwen3-0.6B: q/k RMSNorm, head dim 128 (wider than embed / heads), tied head."""
        return cls(
            vocab_size=151936,
            num_layers=28,
            embed_dim=1024,
            num_heads=16,
            num_kv_heads=8,
            head_dim=128,
            mlp_dim=3072,
            rope_theta=1_000_000.0,
            qk_norm=True,
        )

    @classmethod
    def llama3_2_1b(cls) -> TransformerConfig:
        """meta-llama/Llama-3.2-1B: llama3 RoPE scaling (factor 32), tied head."""
        return cls(
            vocab_size=128256,
            num_layers=16,
            embed_dim=2048,
            num_heads=32,
            num_kv_heads=8,
            head_dim=64,
            mlp_dim=8192,
            rope_theta=500_000.0,
            norm_eps=1e-5,
            rope_scaling=RopeScaling("llama3", 32.0, 1.0, 4.0, 8192),
        )

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
