"""LoRA adapters in PEFT's on-disk layout, so ``peft`` loads what rlax trained.

``save_peft_adapter(DIR, params, cfg)`` writes ``DIR/adapter_config.json``
and ``DIR/adapter_model.safetensors``; then, on the transformers model of the
same base::

    model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), DIR)

gives the logits of rlax's merged model. PEFT's linear layer computes
``x Wᵀ + s · B A x`` with ``lora_A.weight`` [r, I] and ``lora_B.weight`` [O, r];
rlax's adapters are ``a`` [I, r] and ``b`` [r, O] on the [in, out] kernel
(:mod:`rlax.core.models.lora`), so ``lora_A = aᵀ`` and ``lora_B = bᵀ``.
Module names follow :func:`rlax.core.models.hf.hf_names`
(``blocks/3/attn/q`` is ``model.layers.3.self_attn.q_proj``), prefixed by
PEFT's ``base_model.model.``.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import numpy as np

from rlax.core.models.config import TransformerConfig
from rlax.core.models.hf import hf_names
from rlax.core.models.lora import LoraParams, adapter_pairs

__all__ = ["peft_module_names", "peft_tensors", "save_peft_adapter"]

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


def peft_module_names(cfg: TransformerConfig) -> dict[str, str]:
    """rlax module name (``blocks/0/attn/q``) -> HF module name, for every linear layer."""
    out = {}
    for hf_name, path, transposed in hf_names(cfg):
        if transposed and path[-1] == "kernel":
            out["/".join(str(p) for p in path[:-1])] = hf_name.removesuffix(".weight")
    return out


def peft_tensors(params: LoraParams, cfg: TransformerConfig) -> dict[str, np.ndarray]:
    """PEFT-named float32 tensors of ``params``' adapters."""
    names = peft_module_names(cfg)
    out = {}
    for name, (a, b) in adapter_pairs(jax.device_get(params.adapters)).items():
        module = f"base_model.model.{names[name]}"
        out[f"{module}.lora_A.weight"] = np.ascontiguousarray(np.asarray(a, np.float32).T)
        out[f"{module}.lora_B.weight"] = np.ascontiguousarray(np.asarray(b, np.float32).T)
    return out


def save_peft_adapter(
    path: str | pathlib.Path, params: LoraParams, cfg: TransformerConfig, *, base_model: str = ""
) -> pathlib.Path:
    """Writes ``params``' adapters as a PEFT LoRA adapter directory; returns it.

    ``base_model`` fills ``base_model_name_or_path`` (where PEFT would fetch the base).
    """
    from safetensors.numpy import save_file

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    names = peft_module_names(cfg)
    modules = sorted(names[n] for n in adapter_pairs(params.adapters))
    config = params.config
    peft_config: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model or None,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
    }
    save_file(peft_tensors(params, cfg), str(path / WEIGHTS), metadata={"format": "pt"})
    (path / CONFIG).write_text(json.dumps(peft_config, indent=2) + "\n")
    return path
