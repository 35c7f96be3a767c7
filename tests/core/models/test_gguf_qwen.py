"""Qwen2 / Qwen3 from GGUF: tiny random transformers models written as llama.cpp's converter
would (F32, llama.cpp tensor names, "neox" RoPE so Q/K rows not permuted), read back by
rlax, logits compared with transformers'. Also: a llama-arch file of the same weights is
un-permuted (wrong) unless it was permuted, and a misnamed tensor is named."""

from __future__ import annotations

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from rlax.core.models.gguf import GGUFError, GGUFFile
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
FAMILIES = {  # qwen2: q/k/v biases, untied head; qwen3: q/k norms, head_dim != 64 / 4, tied
    "qwen2": (transformers.Qwen2Config, {"rope_theta": 1_000_000.0, "tie_word_embeddings": False}),
    "qwen3": (
        transformers.Qwen3Config,
        {"head_dim": 24, "rope_theta": 1_000_000.0, "tie_word_embeddings": True},
    ),
}
# HF name -> llama.cpp name, written out here independently of core/models/gguf.py.
GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _hf_model(family: str, seed: int = 0):
    config_cls, extra = FAMILIES[family]
    return tiny_hf_model(config_cls(**COMMON, **extra), seed)


def _gguf_name(hf_name: str) -> str:
    if hf_name in GLOBAL:
        return GLOBAL[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER[module]}.{kind}"


def _permute(w: np.ndarray, heads: int) -> np.ndarray:  # llama.cpp's converter, llama arch only
    h = w.shape[0] // heads
    return w.reshape(heads, 2, h // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(path, hf, arch: str, permute: bool = False, rename: dict | None = None):
    c = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if head_dim != c.hidden_size // c.num_attention_heads:  # as the converter: only if not implied
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_tokenizer_model("gpt2")  # the vocabulary size is read off the token list
    w.add_token_list([f"<t{i}>" for i in range(c.vocab_size)])
    for name, value in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        value = value.numpy().astype(np.float32)  # [out, in]: GGUF stores the dims reversed
        if permute and ".q_proj." in name:
            value = _permute(value, c.num_attention_heads)
        elif permute and ".k_proj." in name:
            value = _permute(value, c.num_key_value_heads)
        w.add_tensor((rename or {}).get(_gguf_name(name), _gguf_name(name)), value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _diff(model, hf):
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, COMMON["vocab_size"], size=(2, 20))
    mask = np.ones((2, 20), bool)
    mask[1, :5] = False  # left padding in the second row
    t, m = jnp.asarray(tokens), jnp.asarray(mask)
    pos = positions_from_mask(m)
    ours = np.asarray(model(t, pos, causal_mask(m))[0])
    with torch.no_grad():
        theirs = hf(
            input_ids=torch.tensor(tokens),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            position_ids=torch.tensor(np.asarray(pos)),
        ).logits.numpy()
    return np.abs(ours - theirs)[mask].max()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_qwen_gguf_matches_transformers_logits(tmp_path, family):
    hf = _hf_model(family)
    f = GGUFFile(_write_gguf(tmp_path / f"{family}.gguf", hf, family))
    cfg = f.config()
    head_dim = 24 if family == "qwen3" else 16  # qwen3's from key_length, qwen2's implied
    assert (cfg.vocab_size, cfg.head_dim, cfg.rope_theta) == (96, head_dim, 1e6)
    assert (cfg.qkv_bias, cfg.qk_norm, cfg.o_bias) == (family == "qwen2", family == "qwen3", False)
    assert cfg.tie_embeddings == hf.config.tie_word_embeddings
    diff = _diff(f.model(), hf)
    assert diff <= 1e-4, f"{family}: max abs logit difference {diff:.2e}"


def test_llama_arch_unpermutes_q_and_k(tmp_path):
    # The same Qwen2 weights labelled llama: un-permuted on load, so they only match
    # transformers if the file holds them permuted as llama.cpp writes llama.
    hf = _hf_model("qwen2", seed=2)
    plain = GGUFFile(_write_gguf(tmp_path / "plain.gguf", hf, "llama"))
    assert _diff(plain.model(), hf) > 1e-2
    permuted = GGUFFile(_write_gguf(tmp_path / "permuted.gguf", hf, "llama", permute=True))
    assert _diff(permuted.model(), hf) <= 1e-4


def test_misnamed_tensor_is_named(tmp_path):
    hf = _hf_model("qwen3")
    path = _write_gguf(
        tmp_path / "bad.gguf",
        hf,
        "qwen3",
        rename={"blk.1.attn_k_norm.weight": "blk.1.attn_knorm.weight"},
    )
    with pytest.raises(GGUFError, match=r"bad\.gguf: .*blk\.1\.attn_k_norm\.weight"):
        GGUFFile(path).model()
