"""Observations in the chat template: appended ids equal the whole conversation's rendering."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from rlax.core.models.hf_tokenizer import HFTokenizer
from rlax.core.models.tokenizer import CharTokenizer
from rlax.plugins.environments.chat import observation_ids, observation_text

# ChatML, as SmolLM2 and Qwen render it (without a default system message).
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_tokenizer():
    """A byte-level tokenizer (no merges) with ChatML's two special tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    raw = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    eos = raw.token_to_id("<|im_end|>")
    return HFTokenizer(raw, bos_id=None, eos_id=eos, chat_template=CHATML)


def test_the_observation_text_is_what_the_template_adds_after_the_model_s_stop_token(
    chat_tokenizer,
):
    assert observation_text(chat_tokenizer, "too low") == (
        "\n<|im_start|>user\ntoo low<|im_end|>\n<|im_start|>assistant\n"
    )
    assert observation_text(chat_tokenizer, "42", role="tool").startswith("\n<|im_start|>tool\n")


def test_appending_ids_gives_the_ids_of_the_whole_conversation(chat_tokenizer):
    tok = chat_tokenizer
    prompt = tok.encode("What is 6*7?", bos=True)  # the templated user turn
    turn = np.append(tok.encode("Let me check."), tok.eos_id)  # as the sampler returns it
    appended = np.r_[prompt, turn, observation_ids(tok, "42")].tolist()
    messages = [
        {"role": "user", "content": "What is 6*7?"},
        {"role": "assistant", "content": "Let me check."},
        {"role": "user", "content": "42"},
    ]
    assert appended == tok.encode_chat(messages).tolist()
    # ... which, for text without special spellings, is the whole rendering read with its specials.
    whole = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert appended == tok.tokenizer.encode(whole, add_special_tokens=False).ids
    assert tok.eos_id in appended and appended.count(tok.eos_id) == 3


def test_a_tokenizer_without_a_template_gets_the_text_as_it_is():
    tok = CharTokenizer("<>0123456789")
    assert observation_text(tok, "<") == "<"
    assert observation_ids(tok, "<").tolist() == tok.encode("<").tolist()
