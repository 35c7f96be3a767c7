"""Observations in the model's chat format, as ids to append after a model turn.

A chat model's turn ends with the stop id it sampled (``<|im_end|>`` for
ChatML); what follows is the rest of the template: the end of the message
line, the observation's message, and the header of the next assistant
message. That framing is found by rendering the model's own jinja template
for a conversation with and without the observation and keeping what the
second adds after the assistant's message (less the stop token the model
already produced). Earlier ids are never encoded again. A tokenizer without
a template (the toy character tokenizer) gets the observation's text alone.

Tool text is text. An observation's text (a tool's output, an environment's
feedback, anything quoting the model or the outside world) is untrusted: it
is encoded by :func:`text_ids`, as plain text, so the spelling of a special
token (``<|im_end|>``, ``<|im_start|>``) becomes the ordinary tokens of those
characters and can never end a message or open a turn. Only the template's
framing around it, which the model's own template renders, is encoded with
its special tokens. :func:`observation_ids` puts the two together; every
built-in environment goes through it, and the episode runner holds every
environment to the rule with :class:`ControlTokens`: an observation whose
control ids are not exactly those of its chat framing (or none) ends its
episode with reward 0.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from rlax.core.models.hf_tokenizer import HFTokenizer

_MARK = "\x00rlax-turn\x00"
_SLOT = "\x00rlax-observation\x00"
# Roles an environment may send an observation as (those a template refuses are skipped).
_ROLES = ("user", "tool", "system", "ipython", "environment")
_PLAIN: weakref.WeakKeyDictionary[HFTokenizer, Any] = weakref.WeakKeyDictionary()


def special_ids(tokenizer: Any) -> frozenset[int]:
    """The control ids of ``tokenizer``: ids that text must never produce.

    An :class:`HFTokenizer`: every added token registered as special (for a
    GGUF model, every control token) and its bos, eos and pad ids. The
    character tokenizer: pad, bos and eos. Another kind: its pad, bos and eos ids.
    """
    ids = {getattr(tokenizer, name, None) for name in ("pad_id", "bos_id", "eos_id")}
    if isinstance(tokenizer, HFTokenizer):
        added = tokenizer.tokenizer.get_added_tokens_decoder()
        ids |= {i for i, token in added.items() if token.special}
    return frozenset(int(i) for i in ids if i is not None)


def _plain(tokenizer: HFTokenizer) -> Any:
    """A copy of the ``tokenizers`` object that reads special tokens' spellings as text."""
    plain = _PLAIN.get(tokenizer)
    if plain is None:
        from tokenizers import Tokenizer

        plain = Tokenizer.from_str(tokenizer.tokenizer.to_str())
        plain.encode_special_tokens = True
        _PLAIN[tokenizer] = plain
    return plain


def text_ids(tokenizer: Any, text: str) -> np.ndarray:
    """int32 [T]: untrusted ``text`` encoded as plain text, never as a control id.

    Raises:
      ValueError: the tokenizer cannot encode ``text`` without a control id (a
        kind that parses special tokens and offers no way not to), or the
        character tokenizer has no id for one of its characters.
    """
    if isinstance(tokenizer, HFTokenizer):
        ids = np.asarray(_plain(tokenizer).encode(text, add_special_tokens=False).ids, np.int32)
    else:  # the character tokenizer maps characters only; another kind is checked below
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


def _after_turn(tokenizer: Any, content: str, role: str) -> str:
    """What the template adds after the model's turn (its stop token left out) for ``content``."""
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK}]
    full = tokenizer.apply_chat_template(
        [*messages, {"role": role, "content": content}], add_generation_prompt=True
    )
    suffix = full.split(_MARK, 1)[1]
    eos = tokenizer.token(tokenizer.eos_id) or ""
    return suffix[len(eos) :] if eos and suffix.startswith(eos) else suffix


def observation_text(tokenizer: Any, text: str, *, role: str = "user") -> str:
    """The text to append after a model turn (its stop id included) for an observation."""
    return _after_turn(tokenizer, text, role) if _has_template(tokenizer) else text


def observation_parts(tokenizer: Any, text: str, *, role: str = "user") -> tuple[str, str, str]:
    """(framing before, the observation as the template renders it, framing after).

    Raises:
      ValueError: the template frames this text differently from any other (its
        framing depends on the text), so the framing cannot be told from the text.
    """
    if not _has_template(tokenizer):
        return "", text, ""
    before, slot, after = _after_turn(tokenizer, _SLOT, role).partition(_SLOT)
    if not slot:
        raise ValueError(f"the chat template does not show a {role!r} message's content")
    full = _after_turn(tokenizer, text, role)
    if not (full.startswith(before) and full.endswith(after)) or len(full) < len(before + after):
        raise ValueError(f"the chat template's framing of a {role!r} message depends on its text")
    return before, full[len(before) : len(full) - len(after)], after


def observation_ids(tokenizer: Any, text: str, *, role: str = "user") -> np.ndarray:
    """int32 [O]: the template's framing with its special tokens, ``text`` as plain text.

    The framing's text next to the observation (``user\\n`` after ``<|im_start|>``)
    is encoded with it, as plain text, so for text without special spellings the
    ids are those of the whole rendering: special tokens split it there anyway.
    """
    before, content, after = observation_parts(tokenizer, text, role=role)
    getter = getattr(tokenizer, "token", None)
    spellings = [getter(i) for i in special_ids(tokenizer)] if getter else []
    spellings = [s for s in spellings if s]
    cut = max((before.rfind(s) + len(s) for s in spellings if s in before), default=0)
    end = min((after.find(s) for s in spellings if s in after), default=len(after))
    return np.concatenate(
        [
            np.asarray(tokenizer.encode(before[:cut]), np.int32),
            text_ids(tokenizer, before[cut:] + content + after[:end]),
            np.asarray(tokenizer.encode(after[end:]), np.int32),
        ]
    ).astype(np.int32)


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
