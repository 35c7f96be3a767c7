"""HF ``config.json`` <-> :class:`TransformerConfig` for the Llama, Qwen2 and Qwen3 families
and the mixture-of-experts ones of :mod:`rlax.core.models.hf_moe` (Mixtral, Qwen2-MoE, Qwen3-MoE).

Reading accepts both spellings transformers has used for RoPE: top-level
``rope_theta`` / ``rope_scaling`` (transformers 4) and ``rope_parameters``
(transformers 5). A setting this decoder cannot honour (another activation,
sliding-window attention, an MLP bias, an unknown RoPE type) is an error that
names the file and the key — a silently different model would be worse.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from rlax.core.models.config import RopeScaling, TransformerConfig
from rlax.core.models.hf_moe import MOE_FAMILIES, moe_from_hf, moe_to_hf
from rlax.core.models.hf_moe import UNSUPPORTED as UNSUPPORTED_MOE

__all__ = ["HFConfigError", "config_from_hf", "config_to_hf", "read_hf_config"]

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


class HFConfigError(ValueError):
    """A config.json that is missing, malformed, or describes an unsupported model."""


def read_hf_config(path: str | pathlib.Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a model directory (or the file itself)."""
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        values = json.loads(path.read_text())
    except FileNotFoundError:
        raise HFConfigError(
            f"{path}: no such file (an HF model directory has config.json)"
        ) from None
    except json.JSONDecodeError as err:
        raise HFConfigError(f"{path}: not valid JSON: {err}") from None
    if not isinstance(values, dict):
        raise HFConfigError(f"{path}: expected a JSON object, got {type(values).__name__}")
    values.setdefault("_source", str(path))
    return values


def _rope(values: dict[str, Any], where: str) -> tuple[float, RopeScaling | None]:
    params = dict(values.get("rope_parameters") or {})
    legacy = values.get("rope_scaling") or {}
    params = {**legacy, **params}
    theta = float(params.get("rope_theta", values.get("rope_theta", 10_000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    try:
        if kind == "linear":
            return theta, RopeScaling("linear", float(params["factor"]))
        if kind == "llama3":
            return theta, RopeScaling(
                "llama3",
                float(params["factor"]),
                float(params["low_freq_factor"]),
                float(params["high_freq_factor"]),
                int(params["original_max_position_embeddings"]),
            )
    except KeyError as err:
        raise HFConfigError(f"{where}: rope scaling {kind!r} lacks {err.args[0]!r}") from None
    raise HFConfigError(
        f"{where}: rope type {kind!r} is not supported (default, linear and llama3 are)"
    )


def _require(values: dict[str, Any], key: str, where: str) -> Any:
    if key not in values:
        raise HFConfigError(f"{where}: missing required key {key!r}")
    return values[key]


def config_from_hf(config: str | pathlib.Path | dict[str, Any]) -> TransformerConfig:
    """Maps an HF config (path, directory or dict) to a :class:`TransformerConfig`.

    Raises:
      HFConfigError: naming the file and the offending key.
    """
    values = read_hf_config(config) if not isinstance(config, dict) else dict(config)
    where = values.get("_source", "config.json")
    family = values.get("model_type")
    if family in UNSUPPORTED_MOE:
        raise HFConfigError(
            f"{where}: model_type {family!r} is not supported: {UNSUPPORTED_MOE[family]}"
        )
    moe_family = family if family in MOE_FAMILIES else None
    family = MOE_FAMILIES.get(str(family), family)  # the attention of a MoE family is its base's
    if family not in FAMILIES:
        supported = ", ".join(FAMILIES + tuple(MOE_FAMILIES))
        raise HFConfigError(
            f"{where}: model_type {values.get('model_type')!r} is not supported "
            f"(supported: {supported})"
        )
    if values.get("hidden_act", "silu") != "silu":
        raise HFConfigError(f"{where}: hidden_act {values['hidden_act']!r}; only 'silu' (SwiGLU)")
    if values.get("use_sliding_window") or (family == "mistral" and values.get("sliding_window")):
        raise HFConfigError(f"{where}: sliding-window attention is not supported")
    if values.get("mlp_bias"):
        raise HFConfigError(f"{where}: mlp_bias = true is not supported")
    req = {
        k: _require(values, k, where)
        for k in (
            "vocab_size",
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "intermediate_size",
        )
    }
    heads = int(req["num_attention_heads"])
    theta, scaling = _rope(values, where)
    attention_bias = bool(values.get("attention_bias", False))
    try:
        layers = int(req["num_hidden_layers"])
        moe = None if moe_family is None else moe_from_hf(values, moe_family, layers)
    except KeyError as err:
        raise HFConfigError(f"{where}: missing required key {err.args[0]!r}") from None
    except (TypeError, ValueError) as err:
        raise HFConfigError(f"{where}: {err}") from None
    try:
        return TransformerConfig(
            vocab_size=int(req["vocab_size"]),
            num_layers=int(req["num_hidden_layers"]),
            embed_dim=int(req["hidden_size"]),
            num_heads=heads,
            num_kv_heads=int(values.get("num_key_value_heads") or heads),
            head_dim=int(values.get("head_dim") or req["hidden_size"] // heads),
            mlp_dim=int(req["intermediate_size"]),
            rope_theta=theta,
            norm_eps=float(values.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(values.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or attention_bias,
            o_bias=family != "qwen2" and attention_bias,
            qk_norm=family == "qwen3" or moe_family == "olmoe",
            qk_norm_scope="projection" if moe_family == "olmoe" else "head",
            rope_scaling=scaling,
            moe=moe,
        )
    except (TypeError, ValueError) as err:
        raise HFConfigError(f"{where}: {err}") from None


def config_to_hf(cfg: TransformerConfig, **extra: Any) -> dict[str, Any]:
    """An HF config dict that transformers loads as the same architecture.

    The family is the narrowest that expresses ``cfg``: q/k norm -> qwen3,
    q/k/v bias without an output bias -> qwen2, otherwise llama.

    Raises:
      ValueError: no HF family has this combination of biases.
    """
    if cfg.qk_norm and cfg.qk_norm_scope == "projection" and cfg.moe is None:
        raise ValueError("no dense HF family here has a q/k norm over the whole projection")
    if cfg.qk_norm:
        family = "qwen3"
    elif cfg.qkv_bias and not cfg.o_bias:
        family = "qwen2"
    else:
        family = "llama"
    if family != "qwen2" and cfg.qkv_bias != cfg.o_bias:
        raise ValueError(
            f"no HF family has qkv_bias={cfg.qkv_bias} with o_bias={cfg.o_bias}"
            + (" and q/k norm" if cfg.qk_norm else "")
        )
    rope: dict[str, Any] = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
    max_positions = 32768
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        rope.update(rope_type=s.kind, factor=s.factor)
        if s.kind == "llama3":
            rope.update(
                low_freq_factor=s.low_freq_factor,
                high_freq_factor=s.high_freq_factor,
                original_max_position_embeddings=s.original_max_position,
            )
            max_positions = max(max_positions, int(s.original_max_position * s.factor))
    values: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[family]],
        "model_type": family,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.embed_dim,
        "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        # Both spellings, so transformers 4 and 5 read the same RoPE.
        "rope_theta": cfg.rope_theta,
        "rope_parameters": rope,
        "rope_scaling": None if cfg.rope_scaling is None else dict(rope),
        "torch_dtype": "float32",
    }
    if family != "qwen2":
        values["attention_bias"] = cfg.qkv_bias
    if family == "llama":
        values["mlp_bias"] = False
    else:
        values["use_sliding_window"] = False
    if cfg.moe is not None:
        values.update(moe_to_hf(cfg))
        if values["model_type"] == "mixtral":
            del values["mlp_bias"], values["attention_bias"]
        if values["model_type"] == "olmoe":  # Llama's keys, not Qwen3's
            del values["use_sliding_window"], values["head_dim"]
    values.update(extra)
    return values
