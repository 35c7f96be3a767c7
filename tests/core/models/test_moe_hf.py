"""Mixture-of-experts checkpoints: the tiny asset, import -> export -> import, transformers parity."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from rlax.core.models.hf import load_hf_model, model_from_params, read_safetensors, save_hf_model
from rlax.core.models.hf_config import HFConfigError, config_from_hf, config_to_hf
from rlax.core.models.transformer import causal_mask, positions_from_mask

ROOT = pathlib.Path(__file__).parents[3]
ASSET = ROOT / "assets" / "tiny-moe"
sys.path.insert(0, str(ROOT / "scripts"))
from build_tiny_moe import CONFIG, random_params

FAMILIES = {
    "qwen3_moe": CONFIG,  # q/k norm, a dense first layer, top-k renormalised
    "qwen2_moe": dataclasses.replace(
        CONFIG,
        qk_norm=False,
        qkv_bias=True,
        moe=dataclasses.replace(
            CONFIG.moe, normalize_topk=False, shared_mlp_dim=24, shared_gate=True
        ),
    ),
    "mixtral": dataclasses.replace(
        CONFIG, qk_norm=False, mlp_dim=16, moe=dataclasses.replace(CONFIG.moe, dense_layers=())
    ),
    "olmoe": dataclasses.replace(  # q/k norm over the whole projection, top-k not renormalised
        CONFIG,
        qk_norm_scope="projection",
        mlp_dim=16,
        moe=dataclasses.replace(CONFIG.moe, dense_layers=(), normalize_topk=False),
    ),
}
TOKENS = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (2, 11))


def logits(model) -> np.ndarray:
    mask = jnp.ones(TOKENS.shape, bool)
    return np.asarray(model(jnp.asarray(TOKENS), positions_from_mask(mask), causal_mask(mask))[0])


def test_the_asset_is_what_the_script_writes(tmp_path):
    save_hf_model(tmp_path, model_from_params(CONFIG, random_params(CONFIG, 0)))
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / name).read_bytes() == (ASSET / name).read_bytes(), name
    assert sum(f.stat().st_size for f in ASSET.iterdir()) < 1 << 20
    assert config_from_hf(ASSET) == CONFIG


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_import_export_import_is_identity(family, tmp_path):
    cfg = FAMILIES[family]
    save_hf_model(tmp_path / "a", model_from_params(cfg, random_params(cfg, 1)))
    first = load_hf_model(tmp_path / "a")
    save_hf_model(tmp_path / "b", first)
    second = load_hf_model(tmp_path / "b")
    assert json.loads((tmp_path / "a" / "config.json").read_text())["model_type"] == family
    assert first.cfg == second.cfg == cfg
    a, b = read_safetensors(tmp_path / "a"), read_safetensors(tmp_path / "b")
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    np.testing.assert_array_equal(logits(first), logits(second))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_equal_transformers(family, tmp_path):
    import torch  # a test dependency: the suite never skips this
    import transformers

    cfg = FAMILIES[family]
    save_hf_model(tmp_path, model_from_params(cfg, random_params(cfg, 2)))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert type(theirs).__name__.lower().startswith(family.replace("_", ""))
    with torch.no_grad():
        want = theirs.eval()(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(logits(load_hf_model(tmp_path)), want, atol=1e-5, rtol=0)


def test_families_no_hf_model_has_are_refused():
    sigmoid = dataclasses.replace(CONFIG, moe=dataclasses.replace(CONFIG.moe, scoring="sigmoid"))
    with pytest.raises(ValueError, match="no HF MoE family has this model: sigmoid scoring"):
        config_to_hf(sigmoid)
    deepseek = {**config_to_hf(CONFIG), "model_type": "deepseek_v3", "_source": "x/config.json"}
    with pytest.raises(
        HFConfigError, match="x/config.json: model_type 'deepseek_v3' is not supported: its multi"
    ):
        config_from_hf(deepseek)
    clipped = {**config_to_hf(FAMILIES["olmoe"]), "clip_qkv": 8.0, "_source": "z/config.json"}
    with pytest.raises(HFConfigError, match="z/config.json: clip_qkv = 8.0 is not supported"):
        config_from_hf(clipped)
    olmoe = FAMILIES["olmoe"]
    for bad, what in (
        (dataclasses.replace(olmoe, mlp_dim=48), "olmoe's one intermediate_size"),
        (dataclasses.replace(olmoe, head_dim=16), "olmoe's head_dim is hidden_size"),
        (
            dataclasses.replace(olmoe, moe=dataclasses.replace(olmoe.moe, dense_layers=(0,))),
            "olmoe has no shared expert or dense layer",
        ),
    ):
        with pytest.raises(ValueError, match=what):
            config_to_hf(bad)
    dense = dataclasses.replace(olmoe, moe=None)
    with pytest.raises(ValueError, match="no dense HF family here has a q/k norm over the whole"):
        config_to_hf(dense)
    broken = {**config_to_hf(CONFIG), "_source": "y/config.json"}
    del broken["moe_intermediate_size"]
    with pytest.raises(HFConfigError, match="y/config.json: missing required key"):
        config_from_hf(broken)
