"""Parity with transformers: tiny random Llama / Qwen2 / Qwen3 checkpoints, import and export.

torch and transformers come from the ``hf`` extra (``.ci/run`` installs it);
without them these tests fail at import, never skip.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from rlax.core.models.config import RopeScaling, TransformerConfig
from rlax.core.models.hf import (
    WeightsError,
    load_hf_model,
    read_safetensors,
    save_hf_model,
    tensors_from_params,
)
from rlax.core.models.hf_config import HFConfigError, config_from_hf, config_to_hf
from rlax.core.models.rope import rope_frequencies
from rlax.core.models.transformer import causal_mask, positions_from_mask

from .conftest import tiny_hf_model

COMMON = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 112,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256,
}
FAMILIES = {
    "llama": (transformers.LlamaConfig, {"rope_theta": 10_000.0, "tie_word_embeddings": True}),
    "llama3-scaled": (
        transformers.LlamaConfig,
        {
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500_000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "qwen2": (transformers.Qwen2Config, {"rope_theta": 1_000_000.0, "tie_word_embeddings": False}),
    "qwen3": (
        transformers.Qwen3Config,
        {"head_dim": 24, "rope_theta": 1_000_000.0, "tie_word_embeddings": True},
    ),
}


def _hf_model(family: str, seed: int = 0):
    config_cls, extra = FAMILIES[family]
    return tiny_hf_model(config_cls(**COMMON, **extra), seed)


def _batch():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, COMMON["vocab_size"], size=(2, 20))
    mask = np.ones((2, 20), bool)
    mask[1, :5] = False  # left padding in the second row
    return tokens, mask


def _ours(model, tokens, mask):
    t, m = jnp.asarray(tokens), jnp.asarray(mask)
    logits, _ = model(t, positions_from_mask(m), causal_mask(m))
    return np.asarray(logits)


def _theirs(model, tokens, mask):
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            position_ids=torch.tensor(np.asarray(positions_from_mask(jnp.asarray(mask)))),
        )
    return out.logits.numpy()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_import_matches_transformers_logits(tmp_path, family):
    hf = _hf_model(family)
    hf.save_pretrained(tmp_path)
    ours = load_hf_model(tmp_path)
    tokens, mask = _batch()
    diff = np.abs(_ours(ours, tokens, mask) - _theirs(hf, tokens, mask))[mask]
    assert diff.max() <= 1e-4, f"{family}: max abs logit difference {diff.max():.2e}"


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_export_reloads_in_transformers(tmp_path, family):
    hf = _hf_model(family, seed=3)
    hf.save_pretrained(tmp_path / "in")
    ours = load_hf_model(tmp_path / "in")
    # Move the weights so the export is not just a copy of what came in.
    state = nnx.state(ours)
    params = nnx.to_pure_dict(state)
    params["final_norm"]["scale"] = params["final_norm"]["scale"] * 1.5
    save_hf_model(tmp_path / "out", ours, params=params, max_shard_bytes=40_000)
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()  # sharded
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").float().eval()
    nnx.replace_by_pure_dict(state, params)
    nnx.update(ours, state)
    tokens, mask = _batch()
    diff = np.abs(_ours(ours, tokens, mask) - _theirs(reloaded, tokens, mask))[mask]
    assert diff.max() <= 1e-4
    # The files hold exactly the arrays tensors_from_params gives (HF names, [out, in]).
    written, want = read_safetensors(tmp_path / "out"), tensors_from_params(params, ours.cfg)
    assert written.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_array_equal(written[name], value)
    # And our loader reads the sharded export back to the same parameters.
    again = load_hf_model(tmp_path / "out")
    np.testing.assert_array_equal(
        np.asarray(again.final_norm.scale[...]), np.asarray(ours.final_norm.scale[...])
    )


def test_bfloat16_checkpoint_loads_as_float32(tmp_path):
    hf = _hf_model("qwen2", seed=5).to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    ours = load_hf_model(tmp_path)
    assert ours.embed.embedding[...].dtype == jnp.float32
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    tokens, mask = _batch()
    assert np.abs(_ours(ours, tokens, mask) - _theirs(ref, tokens, mask))[mask].max() <= 1e-4


def test_config_round_trip_through_hf_dict():
    cfgs = [
        TransformerConfig.smollm2_135m(),
        TransformerConfig.qwen2_5_0_5b(),
        TransformerConfig.qwen3_0_6b(),
        TransformerConfig.llama3_2_1b(),
        TransformerConfig.qwen2_small(),
    ]
    for cfg in cfgs:
        assert config_from_hf(config_to_hf(cfg)) == cfg
        assert TransformerConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_llama3_frequencies_by_hand():
    s = RopeScaling(
        "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=64
    )
    base = 10_000.0 ** (-np.arange(8) / 8)
    got = np.asarray(rope_frequencies(16, 10_000.0, s))
    wavelen = 2 * np.pi / base
    # wavelength < 64/4 = 16: kept; > 64: divided by 8; between: blended.
    np.testing.assert_allclose(got[wavelen < 16], base[wavelen < 16], rtol=1e-6)
    np.testing.assert_allclose(got[wavelen > 64], base[wavelen > 64] / 8, rtol=1e-6)
    mid = (wavelen >= 16) & (wavelen <= 64)
    smooth = (64 / wavelen[mid] - 1) / 3
    np.testing.assert_allclose(
        got[mid], (1 - smooth) * base[mid] / 8 + smooth * base[mid], rtol=1e-5
    )


def test_bad_config_names_file_and_key(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(HFConfigError, match="config.json: not valid JSON"):
        config_from_hf(tmp_path)
    good = config_to_hf(TransformerConfig.qwen2_small())
    (tmp_path / "config.json").write_text(json.dumps({**good, "hidden_act": "gelu"}))
    with pytest.raises(HFConfigError, match="hidden_act 'gelu'"):
        config_from_hf(tmp_path)
    del good["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(good))
    with pytest.raises(HFConfigError, match="missing required key 'num_hidden_layers'"):
        config_from_hf(tmp_path)
    with pytest.raises(HFConfigError, match="model_type 'gpt2' is not supported"):
        config_from_hf({"model_type": "gpt2"})


def test_missing_and_misshapen_tensors_are_named(tmp_path):
    hf = _hf_model("qwen2")
    hf.save_pretrained(tmp_path)
    from safetensors.numpy import save_file

    tensors = read_safetensors(tmp_path)
    bad = dict(tensors)
    del bad["model.layers.1.self_attn.k_proj.bias"]
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        WeightsError, match=r"missing tensor\(s\) model.layers.1.self_attn.k_proj.bias"
    ):
        load_hf_model(tmp_path)
    bad = dict(tensors, **{"model.norm.weight": np.ones(3, np.float32)})
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        WeightsError, match=r"'model.norm.weight' has shape \(3,\), the config needs \(64,\)"
    ):
        load_hf_model(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(WeightsError, match="unreadable safetensors"):
        load_hf_model(tmp_path)
