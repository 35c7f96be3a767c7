"""GGUF files (llama.cpp) -> rlax model and tokenizer.

Weights are dequantised to float32 with the ``gguf`` package, renamed to HF
names and then loaded by the same code as an HF checkpoint
(:func:`rlax.core.models.hf.params_from_tensors`).

One trap: llama.cpp's converter reorders the rows of Q and K within each head
for the ``llama`` architecture, so that its RoPE can rotate adjacent pairs
(x[2i], x[2i+1]); HF checkpoints and this decoder rotate (x[i], x[i + H/2]).
The converter views each head's H rows as (2, H/2) and swaps the axes; we undo
it by viewing them as (H/2, 2) and swapping back. Skipping this still gives
English-like text, but wrong logits. Qwen2/Qwen3 GGUFs use the "neox" RoPE
layout and are not permuted.

The tokenizer is rebuilt from the metadata: a byte-level BPE (``gpt2`` model)
with the file's vocabulary and merges, the pre-tokenizer named by
``tokenizer.ggml.pre``, every control token registered as special and every
user-defined token as an added token that is not special.
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Any

import numpy as np

from rlax.core.models.config import RopeScaling, TransformerConfig
from rlax.core.models.hf_tokenizer import HFTokenizer

if TYPE_CHECKING:  # a file's metadata (config, tokenizer) is read without JAX
    from rlax.core.models.transformer import Transformer

__all__ = ["GGUFError", "GGUFFile", "load_gguf_model", "unpermute_qk"]

_ARCHS = ("llama", "qwen2", "qwen3")
_CONTROL = 3  # llama.cpp's token type of control (special) tokens
_USER_DEFINED = 4  # llama.cpp's token type of added tokens that are not special
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Pre-tokenizer split patterns by ``tokenizer.ggml.pre`` (the published regexes of
# each model family's tokenizer.json; None: GPT-2's own, built into ByteLevel).
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS: dict[str, str | None] = {
    "default": None,
    "gpt2": None,
    "smollm": None,  # plus individual digits, below
    "llama3": _LLAMA3,
    "llama-bpe": _LLAMA3,
    "qwen2": _QWEN2,
}


class GGUFError(ValueError):
    """A GGUF file that is unreadable or describes an unsupported model."""


def unpermute_qk(w: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's per-head row reordering of a Q or K weight/bias ([heads * H, ...])."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFFile:
    """An opened GGUF file: metadata values and tensors by name."""

    def __init__(self, path: str | pathlib.Path):
        from gguf import GGUFReader

        self.path = pathlib.Path(path)
        if not self.path.is_file():
            raise GGUFError(f"{self.path}: no such GGUF file")
        try:
            self.reader = GGUFReader(str(self.path))
        except Exception as err:  # noqa: BLE001 -- ValueError, struct.error, IndexError ...
            raise GGUFError(f"{self.path}: not a readable GGUF file ({err})") from None
        self.arch = self.get("general.architecture")
        if self.arch not in _ARCHS:
            raise GGUFError(
                f"{self.path}: architecture {self.arch!r} is not supported ({', '.join(_ARCHS)})"
            )

    def get(self, key: str, default: Any = ...) -> Any:
        field = self.reader.fields.get(key)
        if field is None:
            if default is ...:
                raise GGUFError(f"{self.path}: metadata key {key!r} is missing")
            return default
        return field.contents()

    def arch_get(self, key: str, default: Any = ...) -> Any:
        return self.get(f"{self.arch}.{key}", default)

    # -- the model ---------------------------------------------------------------

    def config(self) -> TransformerConfig:
        heads = int(self.arch_get("attention.head_count"))
        embed = int(self.arch_get("embedding_length"))
        names = {t.name for t in self.reader.tensors}
        vocab = self.arch_get("vocab_size", None)
        if vocab is None:
            vocab = len(self.reader.fields["tokenizer.ggml.tokens"].data)
        scaling = None
        if self.arch_get("rope.scaling.type", "none") == "linear":
            scaling = RopeScaling("linear", float(self.arch_get("rope.scaling.factor")))
        elif self.arch_get("rope.scaling.type", "none") not in ("none",):
            raise GGUFError(f"{self.path}: rope scaling {self.arch_get('rope.scaling.type')!r}")
        try:
            return TransformerConfig(
                vocab_size=int(vocab),
                num_layers=int(self.arch_get("block_count")),
                embed_dim=embed,
                num_heads=heads,
                num_kv_heads=int(self.arch_get("attention.head_count_kv", heads)),
                head_dim=int(self.arch_get("attention.key_length", embed // heads)),
                mlp_dim=int(self.arch_get("feed_forward_length")),
                rope_theta=float(self.arch_get("rope.freq_base", 10_000.0)),
                norm_eps=float(self.arch_get("attention.layer_norm_rms_epsilon")),
                tie_embeddings="output.weight" not in names,
                qkv_bias="blk.0.attn_q.bias" in names,
                o_bias="blk.0.attn_output.bias" in names,
                qk_norm="blk.0.attn_q_norm.weight" in names,
                rope_scaling=scaling,
            )
        except ValueError as err:
            raise GGUFError(f"{self.path}: {err}") from None

    def tensors(self, cfg: TransformerConfig) -> dict[str, np.ndarray]:
        """Every tensor dequantised to float32 [out, in], under its HF name, Q/K unpermuted."""
        from gguf.quants import dequantize

        out = {}
        for t in self.reader.tensors:
            name = _hf_name(t.name)
            if name is None:
                continue
            try:
                value = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
            except Exception as err:  # noqa: BLE001 -- any failure is a corrupt tensor
                raise GGUFError(
                    f"{self.path}: tensor {t.name!r} cannot be dequantised ({err})"
                ) from None
            want = tuple(int(n) for n in reversed(t.shape))
            if value.shape != want:
                value = value.reshape(want)
            if self.arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
                value = unpermute_qk(value, cfg.num_heads)
            elif self.arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
                value = unpermute_qk(value, cfg.num_kv_heads)
            out[name] = value
        return out

    def model(self) -> Transformer:
        from rlax.core.models.hf import hf_names, model_from_params, params_from_tensors

        cfg = self.config()
        tensors = self.tensors(cfg)
        missing = [_gguf_name(name) for name, _, _ in hf_names(cfg) if name not in tensors]
        if missing:  # named as in the file, not by their HF names
            shown = ", ".join(missing[:5]) + (
                f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            )
            raise GGUFError(f"{self.path}: missing tensor(s) {shown}")
        params = params_from_tensors(tensors, cfg, where=str(self.path))
        del tensors  # params holds the only references: each goes once copied to JAX
        return model_from_params(cfg, params)

    # -- the tokenizer -------------------------------------------------------------

    def tokenizer(self) -> HFTokenizer:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        kind = self.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise GGUFError(f"{self.path}: tokenizer model {kind!r} is not supported (gpt2 BPE is)")
        pre = self.get("tokenizer.ggml.pre", "default")
        if pre not in _PRE_SPLITS:
            raise GGUFError(
                f"{self.path}: pre-tokenizer {pre!r} is not supported ({sorted(_PRE_SPLITS)})"
            )
        tokens = self.get("tokenizer.ggml.tokens")
        types = self.get("tokenizer.ggml.token_type", [1] * len(tokens))
        merges = [tuple(m.split(" ", 1)) for m in self.get("tokenizer.ggml.merges")]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        split = _PRE_SPLITS[pre]
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
        steps: list[pre_tokenizers.PreTokenizer] = []
        if pre == "smollm":
            steps.append(pre_tokenizers.Digits(individual_digits=True))
        elif split is not None:
            from tokenizers import Regex

            steps.append(pre_tokenizers.Split(Regex(split), behavior="isolated"))
        tok.pre_tokenizer = pre_tokenizers.Sequence([*steps, byte_level])
        tok.decoder = decoders.ByteLevel()
        specials = [
            AddedToken(tokens[i], special=True, normalized=False)
            for i, t in enumerate(types)
            if t == _CONTROL
        ]
        tok.add_special_tokens(specials)
        # user-defined tokens (<think>, <tool_call> in Qwen's files): added, not special;
        # HFTokenizer matches them in a chat template's framing only, never in text
        tok.add_tokens(
            [
                AddedToken(tokens[i], special=False, normalized=False)
                for i, t in enumerate(types)
                if t == _USER_DEFINED
            ]
        )
        eos = self.get("tokenizer.ggml.eos_token_id")
        return HFTokenizer(
            tok,
            bos_id=self.get("tokenizer.ggml.bos_token_id", None),
            eos_id=int(eos),
            pad_id=self.get("tokenizer.ggml.padding_token_id", None),
            chat_template=self.get("tokenizer.chat_template", None),
            add_bos=bool(self.get("tokenizer.ggml.add_bos_token", False)),
        )


def _hf_name(name: str) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    if name.startswith("blk."):
        _, layer, rest = name.split(".", 2)
        if rest in _LAYER_NAMES:
            return f"model.layers.{layer}.{_LAYER_NAMES[rest]}"
    return None  # e.g. rope_freqs: recomputed from the config


def _gguf_name(hf: str) -> str:
    for gguf_name, name in _GLOBAL_NAMES.items():
        if name == hf:
            return gguf_name
    _, _, layer, rest = hf.split(".", 3)  # model.layers.{i}.{rest}
    return f"blk.{layer}." + next(g for g, name in _LAYER_NAMES.items() if name == rest)


def load_gguf_model(path: str | pathlib.Path) -> tuple[Transformer, HFTokenizer]:
    """The model and tokenizer of a GGUF file."""
    f = GGUFFile(path)
    return f.model(), f.tokenizer()
