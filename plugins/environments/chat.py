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
environment goes through :func:`observation_ids` (or :func:`results_parts`), and
the episode runner holds every environment to the rule with :class:`ControlTokens`:
an observation whose control ids are not exactly those of its chat framing (or
none) ends its episode with reward 0.

A tool-call format's frame around a result (Hermes' ``<tool_response>``) is
framing too: Qwen-style vocabularies hold its spellings as added tokens, and a
model saw tool results between those ids, never between the characters of their
spellings. :func:`results_parts` places the frame as framing (its added tokens as
ids) and each result as text; an environment that does so declares the frame
(``result_framing``) and the runner allows exactly its control ids besides the
template's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlax.core.models.tokenizer import control_ids

# Roles an environment may send an observation as (those a template refuses are skipped).
_ROLES = ("user", "tool", "system", "ipython", "environment")


def special_ids(tokenizer: Any) -> frozenset[int]:
    """The control ids of ``tokenizer``: ids that text must never produce
    (:func:`rlax.core.models.tokenizer.control_ids`)."""
    return control_ids(tokenizer)


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


def _after_turn(tokenizer: Any, texts: Sequence[str], role: str) -> list[str]:
    """[framing, text, framing, ..., text, framing] after a model turn: one message of
    ``role`` per text, as the template renders them (``HFTokenizer.chat_parts``), the
    stop token the model sampled left out of the first framing."""
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        *({"role": role, "content": text} for text in texts),
    ]
    parts = tokenizer.chat_parts(messages, add_generation_prompt=True)[4:]
    eos = tokenizer.token(tokenizer.eos_id) or ""
    if eos and parts[0].startswith(eos):
        parts[0] = parts[0][len(eos) :]
    return parts


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
    before, content, after = _after_turn(tokenizer, [text], role)
    return before, content, after


def observation_text(tokenizer: Any, text: str, *, role: str = "user") -> str:
    """The text to append after a model turn (its stop id included) for an observation."""
    return "".join(observation_parts(tokenizer, text, role=role))


def parts_ids(tokenizer: Any, parts: Sequence[str]) -> np.ndarray:
    """int32 [O]: [framing, text, ..., framing]: the framing's spellings of added tokens
    as their ids, the texts as plain text (a tokenizer without added tokens, the
    character tokenizer, encodes all of it as plain text)."""
    encode_parts = getattr(tokenizer, "encode_parts", None)
    if encode_parts is None:
        return text_ids(tokenizer, "".join(parts))
    return np.asarray(encode_parts(list(parts)), np.int32)


def observation_ids(tokenizer: Any, text: str, *, role: str = "user") -> np.ndarray:
    """int32 [O]: the template's framing with its special tokens, ``text`` as plain text.

    The framing's text next to the observation (``user\\n`` after ``<|im_start|>``)
    is encoded with it, as plain text, so for text without special spellings the
    ids are those of the whole rendering: special tokens split it there anyway.
    """
    if not _has_template(tokenizer):
        return text_ids(tokenizer, text)
    return parts_ids(tokenizer, observation_parts(tokenizer, text, role=role))


def messages_ids(tokenizer: Any, texts: Sequence[str], *, role: str = "tool") -> np.ndarray:
    """int32 [O]: one ``role`` message per text after a model turn (tool results sent as
    an agent's client sends them: a ``tool`` message each), as the chat template renders a
    conversation that goes on with them: its framing's control ids, each text as plain
    text. A tokenizer without a template gets the texts joined by newlines.

    Raises:
      ValueError: as :func:`observation_parts` (a template whose framing depends on the text).
    """
    if not _has_template(tokenizer):
        return text_ids(tokenizer, "\n".join(texts))
    return parts_ids(tokenizer, _after_turn(tokenizer, list(texts), role))


def _frames_itself(tokenizer: Any, framing: tuple[str, str], role: str) -> bool:
    """Whether the template already puts ``framing`` around a ``role`` message (Qwen2.5's
    template frames a ``tool`` message in ``<tool_response>``)."""
    before, _, after = observation_parts(tokenizer, "x", role=role)
    opening, closing = (f.strip() for f in framing)
    return (
        bool(opening) and before.rstrip().endswith(opening) and after.lstrip().startswith(closing)
    )


def results_parts(
    tokenizer: Any, results: Sequence[str], framing: tuple[str, str], *, role: str = "user"
) -> list[str]:
    """[framing, result, framing, ..., result, framing]: tool ``results`` in a tool-call
    format's ``framing`` (before, after each result), after a model turn.

    The format's frame is framing, as the chat template's is: its spellings of the
    tokenizer's added tokens (``<tool_response>`` in Qwen-style vocabularies) become
    their ids, which is how the model saw tool results in training, while each result
    stays plain text (a result that spells ``</tool_response>`` cannot close its frame).
    A template that frames the role's messages itself with the same spellings (Qwen2.5
    with ``role="tool"``) gets each result as its own message and frames them once. A
    template that changes the text it is given (trims it) gets the whole, frames
    included, as text: no frame is placed where the template did not put it.
    """
    if _has_template(tokenizer) and _frames_itself(tokenizer, framing, role):
        return _after_turn(tokenizer, results, role)
    opening, closing = framing
    inner = [opening]
    for k, result in enumerate(results):
        inner += [result, closing + ("\n" + opening if k + 1 < len(results) else "")]
    if not _has_template(tokenizer):
        return inner
    joined = "".join(inner)
    before, content, after = observation_parts(tokenizer, joined, role=role)
    if content != joined:
        return [before, content, after]
    return [before + inner[0], *inner[1:-1], inner[-1] + after]


Shape = tuple[tuple[int, ...], tuple[int, ...] | None, tuple[int, ...]]


class ControlTokens:
    """The control ids an observation may hold for one tokenizer: its framing's, or none.

    An observation built by :func:`observation_ids` or :func:`results_parts` holds the
    control ids of its framing, in order, and no other: the chat template's (before
    the first message, between messages of one role, after the last) and, for an
    environment that declares one, its tool-call format's frame around each result
    (``framing``). One with no framing holds none. :meth:`refusal` says why any other
    observation is refused: its text put control tokens into the model's context.

    Args:
      tokenizer: the policy's tokenizer.
      framing: the (before, after) frame the environment's tool-call format puts
        around each result (``result_framing``), or None.
    """

    def __init__(self, tokenizer: Any, framing: tuple[str, str] | None = None):
        self.tokenizer, self.special = tokenizer, special_ids(tokenizer)
        self.shapes: set[Shape] = {((), None, ())}
        layouts = [lambda texts, role: _after_turn(tokenizer, texts, role)]
        if framing is not None:
            layouts.append(lambda texts, role: results_parts(tokenizer, texts, framing, role=role))
        for role in _ROLES if _has_template(tokenizer) else ("user",):
            for layout in layouts:
                try:
                    self.shapes.add(self._shape(layout([""], role), layout(["", ""], role)))
                except Exception:  # noqa: BLE001, S112 -- a template may refuse a role
                    continue

    def _control(self, ids: np.ndarray) -> tuple[int, ...]:
        return tuple(i for i in np.asarray(ids).tolist() if i in self.special)

    def _framing(self, part: str) -> tuple[int, ...]:
        return self._control(parts_ids(self.tokenizer, [part])) if part else ()

    def _shape(self, one: list[str], two: list[str]) -> Shape:
        """(before, between, after): the control ids of one message's (or result's)
        framing and of what comes between two (None: they cannot repeat)."""
        between = self._framing(two[2]) if len(two) == 5 else None
        return self._framing(one[0]), between, self._framing(one[-1])

    @staticmethod
    def _fits(found: tuple[int, ...], shape: Shape) -> bool:
        before, between, after = shape
        middle = found[len(before) : len(found) - len(after)]
        if len(found) < len(before) + len(after) or found[: len(before)] != before:
            return False
        if found[len(found) - len(after) :] != after:
            return False
        if not middle:
            return True
        if not between:
            return False
        return len(middle) % len(between) == 0 and middle == between * (len(middle) // len(between))

    def refusal(self, ids: np.ndarray) -> str | None:
        """None for an observation whose control ids are its framing's; else the reason."""
        found = self._control(ids)
        if any(self._fits(found, shape) for shape in self.shapes):
            return None
        return (
            f"the observation holds control token id(s) {list(found)} beyond its chat framing: "
            "observation text must be encoded as plain text (environments.chat.observation_ids)"
        )
