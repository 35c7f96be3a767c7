"""The adapters rlax exports load with ``peft`` onto the transformers base, same logits.

peft, torch and transformers come from the ``hf`` extra; without them these
tests fail at import, never skip.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import peft
import pytest
import transformers
from flax import nnx

from rlax.core.models import lora
from rlax.core.models.hf import load_hf_model, save_hf_model
from rlax.core.models.lora_config import DEFAULT_TARGETS
from rlax.core.models.peft_export import save_peft_adapter

from .test_hf import _batch, _hf_model, _ours, _theirs


def _trained_adapters(params: lora.LoraParams, seed: int) -> lora.LoraParams:
    """Adapters as training leaves them: both matrices nonzero."""
    key = jax.random.key(seed)
    leaves, treedef = jax.tree.flatten(params.adapters)
    moved = [
        x + 0.05 * jax.random.normal(jax.random.fold_in(key, i), x.shape)
        for i, x in enumerate(leaves)
    ]
    return lora.joined(params, jax.tree.unflatten(treedef, moved))


@pytest.mark.parametrize(
    ("family", "targets"),
    [("llama", DEFAULT_TARGETS), ("qwen2", (r"blocks/1/attn/(q|v)$", r"mlp/up$"))],
)
def test_peft_loads_the_exported_adapters_with_our_merged_logits(tmp_path, family, targets):
    hf = _hf_model(family, seed=7)
    hf.save_pretrained(tmp_path / "base")
    ours = load_hf_model(tmp_path / "base")
    graphdef, state = nnx.split(ours)
    config = lora.LoraConfig(targets=targets, rank=4, alpha=8.0, dropout=0.05)
    params = _trained_adapters(lora.attach(state, config), seed=1)
    save_peft_adapter(tmp_path / "adapter", params, ours.cfg, base_model=str(tmp_path / "base"))
    written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (written["r"], written["lora_alpha"], written["peft_type"]) == (4, 8.0, "LORA")

    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").float().eval()
    theirs = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    tokens, mask = _batch()
    merged = nnx.merge(graphdef, lora.merged_state(params))
    ours_logits = _ours(merged, tokens, mask)
    diff = np.abs(ours_logits - _theirs(theirs, tokens, mask))[mask]
    assert diff.max() <= 1e-4, f"{family}: max abs logit difference {diff.max():.2e}"
    # The adapters moved the model: the test would catch adapters PEFT ignored.
    with theirs.disable_adapter():
        base_logits = _theirs(theirs, tokens, mask)
    assert np.abs(ours_logits - base_logits)[mask].max() > 1e-2


def test_merged_hf_export_equals_peft_merge_and_unload(tmp_path):
    hf = _hf_model("qwen2", seed=8)
    hf.save_pretrained(tmp_path / "base")
    ours = load_hf_model(tmp_path / "base")
    graphdef, state = nnx.split(ours)
    params = _trained_adapters(lora.attach(state, lora.LoraConfig(rank=2, alpha=4.0)), seed=2)
    merged = nnx.merge(graphdef, lora.merged_state(params))
    save_hf_model(tmp_path / "merged", merged)
    save_peft_adapter(tmp_path / "adapter", params, ours.cfg)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").float().eval()
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").float().eval()
    unloaded = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").merge_and_unload()
    tokens, mask = _batch()
    diff = np.abs(_theirs(reloaded, tokens, mask) - _theirs(unloaded, tokens, mask))[mask]
    assert diff.max() <= 1e-4
