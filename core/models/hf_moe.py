"""HF ``config.json`` keys and tensor names of the mixture-of-experts families.

Families: ``mixtral`` (Mistral attention, softmax top-k renormalised),
``qwen2_moe`` (Qwen2 attention, a sigmoid-gated shared expert, top-k
renormalised or not), ``qwen3_moe`` (Qwen3 attention, no shared expert) and
``olmoe`` (Llama attention whose q/k RMSNorm spans the whole projection,
``qk_norm_scope = "projection"``; top-k renormalised or not, one
``intermediate_size``, the experts').
A sparse layer's tensors (``L`` a layer, ``j`` an expert), HF -> rlax path::

    mixtral:   model.layers.L.block_sparse_moe.gate.weight        blocks/L/mlp/router/kernel
               model.layers.L.block_sparse_moe.experts.j.w1/w3/w2 blocks/L/mlp/experts/gate|up|down[j]
    qwen*_moe, olmoe:
               model.layers.L.mlp.gate.weight                     blocks/L/mlp/router/kernel
               model.layers.L.mlp.experts.j.{gate,up,down}_proj   blocks/L/mlp/experts/...[j]
    qwen2_moe: model.layers.L.mlp.shared_expert.{gate,up,down}_proj  blocks/L/mlp/shared/.../kernel
               model.layers.L.mlp.shared_expert_gate.weight       blocks/L/mlp/shared/out_gate/kernel

DeepSeek-V3 is refused: its multi-head latent attention is not built here.
OLMoE's ``clip_qkv`` (null in the released models) is refused when set.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlax.core.models.config import MoeConfig, TransformerConfig

# A MoE family -> the dense family whose attention it has (olmoe: Llama's with
# the whole-projection q/k norm, set by config_from_hf).
MOE_FAMILIES = {"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3", "olmoe": "llama"}
ARCHITECTURES = {
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
}

UNSUPPORTED = {
    "deepseek_v3": "its multi-head latent attention is not built here",
}

# A tensor: (HF name, rlax path, transposed, expert index or None).
Name = tuple[str, tuple[Any, ...], bool, "int | None"]


def moe_from_hf(values: dict[str, Any], family: str, layers: int) -> MoeConfig:
    """The :class:`MoeConfig` of an HF config of a family in :data:`MOE_FAMILIES`.

    Raises:
      KeyError: a required key is missing (the caller names the file).
    """
    aux = (
        float(values.get("router_aux_loss_coef", 0.0))
        if values.get("output_router_logits")
        else 0.0
    )
    if family == "mixtral":
        return MoeConfig(
            num_experts=int(values["num_local_experts"]),
            experts_per_token=int(values["num_experts_per_tok"]),
            expert_mlp_dim=int(values["intermediate_size"]),
            normalize_topk=True,
            aux_loss_coef=aux,
        )
    if family == "olmoe":
        if values.get("clip_qkv") is not None:
            raise ValueError(f"clip_qkv = {values['clip_qkv']} is not supported (only null)")
        return MoeConfig(
            num_experts=int(values["num_experts"]),
            experts_per_token=int(values["num_experts_per_tok"]),
            expert_mlp_dim=int(values["intermediate_size"]),
            normalize_topk=bool(values.get("norm_topk_prob", False)),
            aux_loss_coef=aux,
        )
    step = int(values.get("decoder_sparse_step", 1) or 1)
    only = {int(i) for i in values.get("mlp_only_layers") or ()}
    dense = tuple(i for i in range(layers) if i in only or (i + 1) % step)
    shared = int(values.get("shared_expert_intermediate_size", 0) or 0)
    if family == "qwen3_moe":
        shared = 0
    return MoeConfig(
        num_experts=int(values["num_experts"]),
        experts_per_token=int(values["num_experts_per_tok"]),
        expert_mlp_dim=int(values["moe_intermediate_size"]),
        normalize_topk=bool(values.get("norm_topk_prob", False)),
        shared_mlp_dim=shared,
        shared_gate=shared > 0,
        aux_loss_coef=aux,
        dense_layers=dense,
    )


def moe_name_family(cfg: TransformerConfig) -> str:
    """The family whose tensor names a MoE config's weights take (its attention decides)."""
    if cfg.qk_norm:
        return "olmoe" if cfg.qk_norm_scope == "projection" else "qwen3_moe"
    return "qwen2_moe" if cfg.qkv_bias else "mixtral"


def moe_family(cfg: TransformerConfig) -> str:
    """The HF family that expresses ``cfg``'s MoE exactly.

    Raises:
      ValueError: none does (sigmoid scoring, a balancing bias, a routed scale,
        an ungated shared expert...), naming what.
    """
    m = cfg.moe
    assert m is not None
    family = moe_name_family(cfg)
    problems = []
    if m.scoring != "softmax" or m.router_bias or m.routed_scale != 1.0:
        problems.append("sigmoid scoring, a router bias or a routed scale (DeepSeek-V3's)")
    if family == "mixtral" and (not m.normalize_topk or m.shared_mlp_dim or m.dense_layers):
        problems.append("mixtral renormalises top-k and has no shared expert or dense layer")
    if family in ("mixtral", "olmoe") and cfg.mlp_dim != m.expert_mlp_dim:
        problems.append(f"{family}'s one intermediate_size is the experts' (mlp_dim must equal it)")
    if family == "olmoe" and (m.shared_mlp_dim or m.dense_layers):
        problems.append("olmoe has no shared expert or dense layer")
    if family == "olmoe" and cfg.head_dim * cfg.num_heads != cfg.embed_dim:
        problems.append("olmoe's head_dim is hidden_size / num_attention_heads")
    if family == "olmoe" and cfg.qkv_bias != cfg.o_bias:
        problems.append("olmoe's attention_bias is on q, k, v and o alike")
    if family == "qwen3_moe" and m.shared_mlp_dim:
        problems.append("qwen3_moe has no shared expert")
    if family == "qwen2_moe" and bool(m.shared_mlp_dim) != m.shared_gate:
        problems.append("qwen2_moe's shared expert is always gated")
    if problems:
        raise ValueError(f"no HF MoE family has this model: {'; '.join(problems)}")
    return family


def moe_to_hf(cfg: TransformerConfig) -> dict[str, Any]:
    """The MoE keys of ``cfg``'s HF config (model_type and architectures included)."""
    m = cfg.moe
    assert m is not None
    family = moe_family(cfg)
    values: dict[str, Any] = {
        "architectures": [ARCHITECTURES[family]],
        "model_type": family,
        "num_experts_per_tok": m.experts_per_token,
        "router_aux_loss_coef": m.aux_loss_coef,
        "output_router_logits": m.aux_loss_coef > 0,
    }
    if family == "mixtral":
        values.update(num_local_experts=m.num_experts, intermediate_size=m.expert_mlp_dim)
        values["sliding_window"] = None
        return values
    if family == "olmoe":
        values.update(
            num_experts=m.num_experts,
            intermediate_size=m.expert_mlp_dim,
            norm_topk_prob=m.normalize_topk,
            clip_qkv=None,
        )
        return values
    values.update(
        num_experts=m.num_experts,
        moe_intermediate_size=m.expert_mlp_dim,
        norm_topk_prob=m.normalize_topk,
        decoder_sparse_step=1,
        mlp_only_layers=list(m.dense_layers),
    )
    if family == "qwen2_moe":
        values["shared_expert_intermediate_size"] = m.shared_mlp_dim
    return values


def moe_names(cfg: TransformerConfig, family: str, layer: int) -> Iterator[Name]:
    """The tensors of sparse layer ``layer``: one per expert and projection."""
    m = cfg.moe
    assert m is not None
    mlp = ("blocks", layer, "mlp")
    if family == "mixtral":
        pre = f"model.layers.{layer}.block_sparse_moe."
        projections = {"gate": "w1", "up": "w3", "down": "w2"}
    else:
        pre = f"model.layers.{layer}.mlp."
        projections = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
    yield pre + "gate.weight", (*mlp, "router", "kernel"), True, None
    for j in range(m.num_experts):
        for ours, theirs in projections.items():
            yield f"{pre}experts.{j}.{theirs}.weight", (*mlp, "experts", ours), True, j
    if m.shared_mlp_dim:
        for name in ("gate", "up", "down"):
            path = (*mlp, "shared", name, "kernel")
            yield f"{pre}shared_expert.{name}_proj.weight", path, True, None
        if m.shared_gate:
            path = (*mlp, "shared", "out_gate", "kernel")
            yield pre + "shared_expert_gate.weight", path, True, None
