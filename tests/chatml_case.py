"""A ChatML tokenizer small enough to read (imported by tests as ``chatml_case``): byte-level
ids (no merges) plus ChatML's two special tokens, 258 ids, with a ChatML chat template; and
the one-layer model config the tests that sample through it build."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from rlax.core.models.config import TransformerConfig
from rlax.core.models.hf_tokenizer import HFTokenizer

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml_tokenizer() -> HFTokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    raw = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return HFTokenizer(raw, bos_id=None, eos_id=raw.token_to_id("<|im_end|>"), chat_template=CHATML)


def tiny_config(vocab_size: int) -> TransformerConfig:
    """One layer, 32 wide: fast to build and sample on CPU."""
    return TransformerConfig(
        vocab_size=vocab_size,
        num_layers=1,
        embed_dim=32,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        mlp_dim=64,
    )
