"""A ChatML tokenizer small enough to read (imported by tests as ``chatml_case``): byte-level
ids (no merges) plus ChatML's two special tokens, 258 ids, with a ChatML chat template."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

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
