"""A chat template for a tokenizer that has none: what the agent endpoint renders messages with.

The endpoint's chat API renders each request's messages with the model's
chat template (:func:`rlax.core.rollout.agents.chat_ids.conversation_ids`). A tiny
model with a character tokenizer has none, and a model's own template may
not be the one its policy was taught on. :func:`with_chat_template` gives
a tokenizer the template a run names in gin (``samplers.agents.chat_template``):

- an :class:`~rlax.core.models.hf_tokenizer.HFTokenizer` gets a copy with
  the template in place of its own;
- any other tokenizer (``encode``, ``decode``, ``bos_id``, ``eos_id``) is
  wrapped in :class:`TemplatedTokenizer`, where the template writes
  ``{{ bos_token }}`` and ``{{ eos_token }}`` for the control ids (spelled
  :data:`BOS` and :data:`EOS` in the rendering; only the template's own
  framing makes control ids, never a message's text).

The multi-turn quickstart's policy plays higher/lower on raw ids (prompt
``bos ?``, each guess ending with the stop id, each hint one character);
configs/experiments/agents_quickstart.gin names the template that renders a
conversation to exactly those ids, so an agent playing the game through the
endpoint records the ids the ``guess`` environment would.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlax.core.models.hf_tokenizer import HFTokenizer

__all__ = ["BOS", "EOS", "TemplatedTokenizer", "with_chat_template"]

BOS, EOS = "<|bos|>", "<|eos|>"


class TemplatedTokenizer:
    """``base`` with a jinja chat template (see the module docstring).

    Args:
      base: a tokenizer with ``encode(text)``, ``decode(ids)``, ``bos_id`` and ``eos_id``.
      chat_template: jinja source; ``bos_token`` / ``eos_token`` stand for the control ids.
    """

    def __init__(self, base: Any, chat_template: str):
        self.base = base
        self.chat_template = chat_template
        self._template: Any = None
        self._specials = {BOS: base.bos_id, EOS: base.eos_id}
        self._pattern = re.compile("|".join(re.escape(s) for s in self._specials))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def token(self, token_id: int | None) -> str | None:
        """An id's text: the control ids' spellings, else the id decoded alone."""
        for spelling, known in self._specials.items():
            if token_id is not None and token_id == known:
                return spelling
        return None if token_id is None else self.base.decode([token_id])

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True
    ) -> str:
        """The conversation rendered, control ids spelled: to read, not to encode."""
        if self._template is None:
            from rlax.core.models.hf_tokenizer import _compile

            self._template = _compile(self.chat_template)
        return self._template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=BOS,
            eos_token=EOS,
        )

    def chat_parts(
        self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True
    ) -> list[str]:
        """[framing, text, framing, ..., text, framing], as :meth:`HFTokenizer.chat_parts`."""
        # HFTokenizer's method reads nothing of its instance but apply_chat_template.
        return HFTokenizer.chat_parts(
            self,  # type: ignore[arg-type]
            messages,
            add_generation_prompt=add_generation_prompt,
        )

    def encode_parts(self, parts: Sequence[str]) -> np.ndarray:
        """int32 [T]: control ids from the framing's spellings only; texts as plain text."""
        ids: list[int] = []
        for k, part in enumerate(parts):
            if k % 2:
                ids += np.asarray(self.base.encode(part), np.int32).tolist()
                continue
            start = 0
            for found in self._pattern.finditer(part):
                ids += np.asarray(self.base.encode(part[start : found.start()])).tolist()
                ids.append(self._specials[found.group(0)])
                start = found.end()
            ids += np.asarray(self.base.encode(part[start:]), np.int32).tolist()
        return np.asarray(ids, np.int32)

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True
    ) -> np.ndarray:
        """int32 [T]: the rendered conversation."""
        return self.encode_parts(
            self.chat_parts(messages, add_generation_prompt=add_generation_prompt)
        )


def with_chat_template(tokenizer: Any, chat_template: str | None) -> Any:
    """``tokenizer`` rendering chats with ``chat_template`` (None: unchanged)."""
    if chat_template is None:
        return tokenizer
    if isinstance(tokenizer, HFTokenizer):
        out = copy.copy(tokenizer)
        out.chat_template, out._template = chat_template, None
        return out
    return TemplatedTokenizer(tokenizer, chat_template)
