"""Observations in the model's chat format, as ids to append after a model turn.

A chat model's turn ends with the stop id it sampled (``<|im_end|>`` for
ChatML); what follows is the rest of the template: the end of the message
line, the observation's message, and the header of the next assistant
message. That framing is found by rendering the model's own jinja template
for a conversation that ends with the observation and keeping what follows
the assistant's message (less the stop token the model already produced).
Earlier ids are never encoded again. A tokenizer without a template (the toy
character tokenizer) gets the observation's text alone.

Tool text is text. An observation's text (a tool's output, an environment's
feedback, anything quoting the model or the outside world) is untrusted, and
the tokenizer encodes it as plain text: the spelling of a special token
(``<|im_end|>``, ``<|im_start|>``) becomes the ordinary tokens of those
characters and can never end a message or open a turn. The rule lives in the
core (:class:`~rlax.core.models.hf_tokenizer.HFTokenizer`: ``encode``,
``chat_parts``, ``encode_parts``; task prompts follow it too); this module
only cuts the framing after a model turn out of the template's. Every built-in
environment goes through :func:`observation_ids`, and the episode runner holds
every environment to the rule with :class:`ControlTokens`: an observation
whose control ids are not exactly those of its chat framing (or none) ends
its episode with reward 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Roles an environment may send an observation as (those a template refuses are skipped).
_ROLES = ("user", "tool", "system", "ipython", "environment")


def special_ids(tokenizer: Any) -> frozenset[int]:
    """The control ids of ``tokenizer``: ids that text must never produce.

    A tokenizer that names them (``control_ids``: an :class:`HFTokenizer`'s
    special tokens, bos, eos and pad) gives its own; any other kind (the
    character tokenizer) its pad, bos and eos ids.
    """
    named = getattr(tokenizer, "control_ids", None)
    if named is not None:
        return frozenset(int(i) for i in named)
    ids = {getattr(tokenizer, name, None) for name in ("pad_id", "bos_id", "eos_id")}
    return frozenset(int(i) for i in ids if i is not None)


def text_ids(tokenizer: Any, text: str) -> np.ndarray:
    """int32 [T]: untrusted ``text`` encoded as plain text, never as a control id.

    Raises:
      ValueError: the tokenizer encoded ``text`` to a control id (a kind that
        parses special tokens in text), or the character tokenizer has no id for
        one of its characters.
    """
    ids = np.asarray(tokenizer.encode(text), np.int32)
    found = sorted(special_ids(tokenizer).intersection(ids.tolist()))
    if found:
        raise ValueError(
            f"{type(tokenizer).__name__} encodes observation text to control id(s) {found}; "
            "an observation's text must be encoded as plain text"
        )
    return ids


def _has_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "use_chat_template", False) and tokenizer.chat_template)


def observation_parts(tokenizer: Any, text: str, *, role: str = "user") -> tuple[str, str, str]:
    """(framing before, the observation as the template renders it, framing after).

    The framing is what the template adds after the model's turn (its stop
    token left out), rendered around a placeholder for the observation
    (``HFTokenizer.chat_parts``).

    Raises:
      ValueError: the template frames this text differently from a placeholder
        (its framing depends on the text), so the framing cannot be told from the text.
    """
    if not _has_template(tokenizer):
        return "", text, ""
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": role, "content": text},
    ]
    before, content, after = tokenizer.chat_parts(messages, add_generation_prompt=True)[4:]
    eos = tokenizer.token(tokenizer.eos_id) or ""
    before = before[len(eos) :] if eos and before.startswith(eos) else before
    return before, content, after


def observation_text(tokenizer: Any, text: str, *, role: str = "user") -> str:
    """The text to append after a model turn (its stop id included) for an observation."""
    return "".join(observation_parts(tokenizer, text, role=role))


def observation_ids(tokenizer: Any, text: str, *, role: str = "user") -> np.ndarray:
    """int32 [O]: the template's framing with its special tokens, ``text`` as plain text.

    The framing's text next to the observation (``user\\n`` after ``<|im_start|>``)
    is encoded with it, as plain text, so for text without special spellings the
    ids are those of the whole rendering: special tokens split it there anyway.
    """
    if not _has_template(tokenizer):
        return text_ids(tokenizer, text)
    parts = observation_parts(tokenizer, text, role=role)
    return np.asarray(tokenizer.encode_parts(parts), np.int32)


class ControlTokens:
    """The control ids an observation may hold for one tokenizer: its framing's, or none.

    An observation built by :func:`observation_ids` holds the control ids of
    its chat framing, in order, and no other; one with no framing holds none.
    :meth:`refusal` says why any other observation is refused: its text put
    control tokens into the model's context.
    """

    def __init__(self, tokenizer: Any):
        self.special = special_ids(tokenizer)
        self.allowed: set[tuple[int, ...]] = {()}
        if _has_template(tokenizer):
            for role in _ROLES:
                try:
                    ids = observation_ids(tokenizer, "", role=role)
                except Exception:  # noqa: BLE001, S112 -- a template may refuse a role
                    continue
                self.allowed.add(self._control(ids))

    def _control(self, ids: np.ndarray) -> tuple[int, ...]:
        return tuple(i for i in np.asarray(ids).tolist() if i in self.special)

    def refusal(self, ids: np.ndarray) -> str | None:
        """None for an observation whose control ids are its framing's; else the reason."""
        found = self._control(ids)
        if found in self.allowed:
            return None
        return (
            f"the observation holds control token id(s) {list(found)} beyond its chat framing: "
            "observation text must be encoded as plain text (environments.chat.observation_ids)"
        )
