"""SmolLM2-135M-Instruct from GGUF: tokenizer ids, chat template and logits against transformers;
export to HF and reload in transformers; bad files are named."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from rlax.core.models.bundle import ModelBundle, load_model, save_model
from rlax.core.models.gguf import GGUFError, GGUFFile, unpermute_qk
from rlax.core.models.transformer import causal_mask, positions_from_mask

# Unicode (accents, CJK, emoji), digits in runs and after words, and spacing
# (leading, doubled, tabs, newlines), plus the control tokens themselves.
TEXTS = [
    "What is 2+3?",
    "12345 + 678 = 13023",
    "héllo wörld, 你好, Привет 🤖🚀",
    " leading space and trailing  ",
    "tabs\tand\n\nnewlines\r\n end",
    "x1 = y22 * z333 / 4.5e-10",
    "It's we'll they've I'm",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "<jupyter_code>print(1)<jupyter_output>",
    "naïve café — “quotes” … ∑ ≠ ∞",
]


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_gguf):
    return transformers.AutoTokenizer.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name
    )


@pytest.fixture(scope="module")
def hf_model(smollm2_gguf):
    return transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32
    ).eval()


def _logits(model, ids):
    t = jnp.asarray(ids)
    m = jnp.ones_like(t, dtype=bool)
    return np.asarray(model(t, positions_from_mask(m), causal_mask(m))[0])


def test_config_read_off_the_file(smollm2):
    model, tok = smollm2
    cfg = model.cfg
    assert (cfg.num_layers, cfg.embed_dim, cfg.mlp_dim, cfg.num_heads, cfg.num_kv_heads) == (
        30,
        576,
        1536,
        9,
        3,
    )
    assert (cfg.head_dim, cfg.vocab_size, cfg.rope_theta, cfg.tie_embeddings) == (
        64,
        49152,
        100_000.0,
        True,
    )
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 2)


def test_token_ids_match_transformers(smollm2, hf_tokenizer):
    """Text is plain text (special spellings split, as transformers' ``split_special_tokens``);
    the ``tokenizers`` object the template's framing is read with parses them as transformers."""
    _, tok = smollm2
    for text in TEXTS:
        plain = hf_tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        assert tok.encode(text).tolist() == plain, text
        assert tok.decode(tok.encode(text)) == text  # special spellings are text: kept
        parsed = tok.tokenizer.encode(text, add_special_tokens=False).ids
        assert parsed == hf_tokenizer.encode(text, add_special_tokens=False), text
        if "<" not in text:
            assert parsed == plain


def test_every_control_token_is_special(smollm2):
    """Each control token is one id in the template's framing, and never from text."""
    _, tok = smollm2
    for i in range(17):
        piece = tok.token(i)
        assert tok.tokenizer.encode(f"a{piece}b").ids[1] == i, piece
        assert tok.encode_parts([f"a{piece}b"]).tolist()[1] == i, piece
        assert i in tok.control_ids
        assert not tok.control_ids & set(tok.encode(f"a{piece}b").tolist()), piece


def test_digits_are_split_before_byte_level(smollm2):
    # The "smollm" pre-tokenizer isolates each digit first (as llama.cpp does),
    # so a whitespace run before a digit stays one token. transformers' GGUF
    # converter skips that step and splits "  3" as " ", " 3"->" ", "3".
    _, tok = smollm2
    space2 = tok.tokenizer.token_to_id("ĠĠ")
    assert tok.encode("a  3").tolist() == [tok.tokenizer.token_to_id("a"), space2, 35]


def test_chat_template_matches_transformers(smollm2, hf_tokenizer):
    _, tok = smollm2
    messages = [{"role": "user", "content": "What is 2+3?"}]
    want = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tok.apply_chat_template(messages) == want
    assert "You are a helpful AI assistant named SmolLM" in want  # the default system prompt
    # A task's prompt (bos=True) is the user turn of the template.
    assert tok.encode("What is 2+3?", bos=True).tolist() == hf_tokenizer.encode(
        want, add_special_tokens=False
    )


def test_logits_match_transformers(smollm2, hf_model):
    model, tok = smollm2
    ids = np.array([tok.encode("What is 2+3? Think: 12 apples, héllo 你好", bos=True)])
    with torch.no_grad():
        want = hf_model(torch.tensor(ids)).logits.numpy()
    diff = np.abs(_logits(model, ids) - want).max()
    assert diff <= 1e-3, f"max abs logit difference {diff:.2e}"


def test_unpermute_inverts_llama_cpp_permutation():
    # llama.cpp's converter: w.reshape(heads, 2, H/2, in).swapaxes(1, 2).reshape(w.shape)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3 * 8, 5))
    permuted = w.reshape(3, 2, 4, 5).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(unpermute_qk(permuted, 3), w)
    assert not np.array_equal(permuted, w)


def test_export_to_hf_reloads_in_transformers(smollm2, tmp_path):
    model, tok = smollm2
    path = save_model(tmp_path / "ckpt", ModelBundle(model, tok, {"step": 3}))
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = tok.encode("What is 2+3?", bos=True)
    assert hf_tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, tokenize=False
    ) == tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}])
    assert (
        hf_tok.encode("héllo 12  3", add_special_tokens=False) == tok.encode("héllo 12  3").tolist()
    )
    with torch.no_grad():
        want = hf(torch.tensor(ids[None])).logits.numpy()
    assert np.abs(_logits(model, ids[None]) - want).max() <= 1e-3  # 30 fp32 layers
    again = load_model(path)
    assert again.info == {"step": 3} and again.config == model.cfg
    for text in TEXTS:  # the tokenizer.json written out reads back to the same ids
        assert again.tokenizer.encode(text).tolist() == tok.encode(text).tolist()
    assert again.tokenizer.encode("What is 2+3?", bos=True).tolist() == ids.tolist()
    assert (again.tokenizer.bos_id, again.tokenizer.eos_id, again.tokenizer.pad_id) == (1, 2, 2)
    np.testing.assert_array_equal(
        np.asarray(again.model.embed.embedding[...]), np.asarray(model.embed.embedding[...])
    )


def test_corrupt_and_missing_gguf_are_named(tmp_path, smollm2_gguf):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(GGUFError, match="broken.gguf: not a readable GGUF file"):
        GGUFFile(bad)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(smollm2_gguf.read_bytes()[: 1 << 20])
    with pytest.raises(GGUFError, match="truncated.gguf"):
        GGUFFile(truncated).model()
    with pytest.raises(FileNotFoundError, match="nothing.gguf: no such model"):
        load_model(tmp_path / "nothing.gguf")


def test_architecture_only_load_reads_config_and_tokenizer_off_the_file(smollm2, smollm2_gguf):
    """What a worker loads (its weights come by pull): no arrays, the same shapes and ids."""
    model, tok = smollm2
    bare = load_model(smollm2_gguf, weights=False)
    assert bare.config == model.cfg
    leaves = jax.tree.leaves(nnx.state(bare.model))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert [x.shape for x in leaves] == [x.shape for x in jax.tree.leaves(nnx.state(model))]
    for text in TEXTS:
        assert bare.tokenizer.encode(text).tolist() == tok.encode(text).tolist()
    assert bare.tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3?"}]) == (
        tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}])
    )
