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


SCORINGS = ("softmax", "sigmoid")
DISPATCHES = ("sorted", "dense")


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """The mixture-of-experts MLP of a decoder's sparse layers (hashable, jit-static).

    A router scores every expert for each token (``softmax`` over the experts,
    or an independent ``sigmoid`` each), the top ``experts_per_token`` are
    chosen, and the token's output is the sum of their SwiGLU MLPs weighted by
    their scores (renormalised to sum 1 when ``normalize_topk``, then times
    ``routed_scale``), plus an optional shared expert every token goes through.

    Attributes:
      num_experts: E, the routed experts of a sparse layer.
      experts_per_token: k, how many experts each token is routed to.
      expert_mlp_dim: F of one routed expert.
      scoring: ``"softmax"`` (Mixtral, Qwen-MoE, OLMoE) or ``"sigmoid"`` (DeepSeek-V3).
      normalize_topk: renormalise the k chosen scores to sum 1.
      routed_scale: a factor on the routed experts' sum (DeepSeek-V3's
        ``routed_scaling_factor``).
      shared_mlp_dim: F of the shared expert (0: none); Qwen2-MoE's
        ``shared_expert_intermediate_size``, DeepSeek's shared experts joined.
      shared_gate: the shared expert's output times sigmoid(x . w) (Qwen2-MoE).
      router_bias: DeepSeek-V3's balancing bias: added to the scores for the
        choice of experts only (never to their weights), and moved by
        :func:`rlax.core.models.moe.balance_bias`, not by gradients.
      aux_loss_coef: weight of the Switch/Mixtral load-balancing loss
        E * sum_e f_e * P_e (0: not computed into the loss).
      dense_layers: layers that keep the dense MLP of ``mlp_dim`` (Qwen's
        ``mlp_only_layers``, DeepSeek's first dense layers).
      dispatch: ``"sorted"`` (tokens sorted by expert, one grouped matmul per
        projection: ``jax.lax.ragged_dot``; work k tokens per token) or
        ``"dense"`` (every expert on every token, masked: E/k times the work,
        for tiny models and as the reference).
    """

    num_experts: int
    experts_per_token: int
    expert_mlp_dim: int
    scoring: str = "softmax"
    normalize_topk: bool = False
    routed_scale: float = 1.0
    shared_mlp_dim: int = 0
    shared_gate: bool = False
    router_bias: bool = False
    aux_loss_coef: float = 0.0
    dense_layers: tuple[int, ...] = ()
    dispatch: str = "sorted"

    def __post_init__(self) -> None:
        if self.num_experts <= 0 or self.expert_mlp_dim <= 0:
            raise ValueError("MoeConfig.num_experts and expert_mlp_dim must be positive")
        if not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError(
                f"MoeConfig.experts_per_token must be in 1..num_experts ({self.num_experts}), "
                f"got {self.experts_per_token}"
            )
        if self.scoring not in SCORINGS:
            raise ValueError(f"MoeConfig.scoring must be one of {SCORINGS}, got {self.scoring!r}")
        if self.dispatch not in DISPATCHES:
            raise ValueError(
                f"MoeConfig.dispatch must be one of {DISPATCHES}, got {self.dispatch!r}"
            )
        if self.shared_gate and not self.shared_mlp_dim:
            raise ValueError("MoeConfig.shared_gate needs a shared expert (shared_mlp_dim > 0)")
        if self.aux_loss_coef < 0 or self.shared_mlp_dim < 0:
            raise ValueError("MoeConfig.aux_loss_coef and shared_mlp_dim must be >= 0")
        object.__setattr__(self, "dense_layers", tuple(sorted(set(self.dense_layers))))


# Fields added after the first saved models: written by ``to_dict`` only when
# they differ from these defaults, so older model.json files stay byte-identical.
_LATER_FIELDS = {
    "qkv_bias": False,
    "o_bias": False,
    "qk_norm": False,
    "qk_norm_scope": "head",
    "rope_scaling": None,
    "moe": None,
}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Architecture of a decoder. Frozen: one value names one model shape.

    Attributes:
      qkv_bias: biases on the q, k and v projections (Qwen2; Llama's
        ``attention_bias`` sets this and ``o_bias``).
      o_bias: a bias on the attention output projection.
      qk_norm: RMSNorm on queries and keys before RoPE.
      qk_norm_scope: what that RMSNorm spans: ``"head"`` each head's dims, weights
        shared across heads (Qwen3), or ``"projection"`` the whole q (and the whole
        k) projection, one weight per dim (OLMoE).
      rope_scaling: optional RoPE frequency scaling.
      moe: the mixture-of-experts MLP of every layer not in its
        ``dense_layers`` (None: a dense model).
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
    qk_norm_scope: str = "head"
    rope_scaling: RopeScaling | None = None
    moe: MoeConfig | None = None

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
        if self.qk_norm_scope not in ("head", "projection"):
            raise ValueError(
                "TransformerConfig.qk_norm_scope must be 'head' or 'projection', "
                f"got {self.qk_norm_scope!r}"
            )
        if isinstance(self.rope_scaling, dict):  # from_dict / hand-written values
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if isinstance(self.moe, dict):
            object.__setattr__(self, "moe", MoeConfig(**self.moe))
        if self.moe is not None and any(
            not 0 <= i < self.num_layers for i in self.moe.dense_layers
        ):
            raise ValueError(
                f"MoeConfig.dense_layers {self.moe.dense_layers} must be layers of "
                f"0..{self.num_layers - 1}"
            )

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` has the mixture-of-experts MLP."""
        return self.moe is not None and layer not in self.moe.dense_layers

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """The sparse layers, in order (their routes are recorded in this order)."""
        return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

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
        if "moe" in values:
            values["moe"]["dense_layers"] = list(values["moe"]["dense_layers"])
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
        norms = (n + k) * h if self.qk_norm_scope == "projection" else 2 * h
        attn += (n + 2 * k) * h * self.qkv_bias + d * self.o_bias + norms * self.qk_norm
        layer = attn + 3 * d * f + 2 * d
        head = 0 if self.tie_embeddings else d * self.vocab_size
        total = self.vocab_size * d + self.num_layers * layer + d + head
        if self.moe is not None:  # a sparse layer's MoE replaces its dense MLP
            m = self.moe
            sparse = d * m.num_experts * (1 + 3 * m.expert_mlp_dim) + 3 * d * m.shared_mlp_dim
            sparse += d * m.shared_gate + m.num_experts * m.router_bias
            total += len(self.moe_layers) * (sparse - 3 * d * f)
        return total
