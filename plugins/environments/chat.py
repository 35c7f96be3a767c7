"""Observations in the model's chat format, as ids to append after a model turn.

A chat model's turn ends with the stop id it sampled (``<|im_end|>`` for
ChatML); what follows is the rest of the template: the end of the message
line, the observation's message, and the header of the next assistant
message. The text is found by rendering the model's own jinja template for a
conversation with and without the observation and keeping what the second
adds after the assistant's message (less the stop token the model already
produced), and only that text is encoded: earlier ids are never encoded
again. A tokenizer without a template (the toy character tokenizer) gets the
observation's text as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_MARK = "\x00rlax-turn\x00"


def observation_text(tokenizer: Any, text: str, *, role: str = "user") -> str:
    """The text to append after a model turn (its stop id included) for an observation."""
    if not (getattr(tokenizer, "use_chat_template", False) and tokenizer.chat_template):
        return text
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK}]
    full = tokenizer.apply_chat_template(
        [*messages, {"role": role, "content": text}], add_generation_prompt=True
    )
    suffix = full.split(_MARK, 1)[1]
    eos = tokenizer.token(tokenizer.eos_id) or ""
    return suffix[len(eos) :] if eos and suffix.startswith(eos) else suffix


def observation_ids(tokenizer: Any, text: str, *, role: str = "user") -> np.ndarray:
    """int32 [O]: :func:`observation_text` encoded on its own (special tokens as written)."""
    return np.asarray(tokenizer.encode(observation_text(tokenizer, text, role=role)), np.int32)
