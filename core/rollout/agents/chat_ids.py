"""An agent's conversation as prompt ids, with the sampled ids in place of the replies given.

A request to the endpoint carries the whole conversation as text: the
replies the endpoint gave come back as assistant messages. Encoding their
text again need not give the ids the sampler produced (a model may sample a
non-canonical split of a word, or bytes that are not valid UTF-8 on their
own), so the rendering never encodes them: each assistant message the
endpoint recognises as one of its replies (:class:`ReplyBook`, by content
and tool calls) is rendered by the model's chat template with the model's
raw text as its content, and that content's place in the ids is taken by the
sampled ids themselves. The template's framing after it starts with the
stop token; when the reply's ids end with that stop token (the model
sampled it) the framing's copy is left out. Everything else (system, user,
tool messages, assistant messages the endpoint did not write) is encoded as
the template frames it, text as plain text
(:meth:`~rlax.core.models.hf_tokenizer.HFTokenizer.chat_parts`).

So a request that only adds messages after the last reply renders to the
recorded ids plus new ones, and :class:`~rlax.core.rollout.agents.transcript.Transcript`
appends only those.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlax.core.models.tokenizer import control_ids

__all__ = ["Reply", "ReplyBook", "conversation_ids", "reply_key"]


@dataclasses.dataclass(frozen=True)
class Reply:
    """A reply the endpoint gave.

    Attributes:
      raw: the model's text (stop token excluded), tool-call markup included.
      ids: int32 [C], the sampled ids (the stop id last when the model sampled it).
      stopped: whether ``ids`` end with the stop id.
    """

    raw: str
    ids: np.ndarray
    stopped: bool


def reply_key(content: str | None, calls: Sequence[tuple[str, Any]]) -> str:
    """The key of an assistant message: its content and its calls (name, arguments as values)."""
    return json.dumps([content or "", [[n, a] for n, a in calls]], sort_keys=True)


def message_key(message: dict[str, Any]) -> str:
    """:func:`reply_key` of an OpenAI assistant message (arguments given as JSON text)."""
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            pass  # not one of ours: ours are JSON; the key then matches nothing
        calls.append((function.get("name"), arguments))
    return reply_key(message.get("content"), calls)


class ReplyBook:
    """The replies given in one episode, found again by their message.

    Replies with the same message (the model said "ok" twice, with different
    ids) are told apart by order: the k-th such message of a conversation is
    the k-th such reply given.
    """

    def __init__(self) -> None:
        self._by_key: dict[str, list[Reply]] = {}

    def add(self, key: str, reply: Reply) -> None:
        self._by_key.setdefault(key, []).append(reply)

    def find(self, message: dict[str, Any], seen: int = 0) -> Reply | None:
        """The reply ``message`` is, when it is the ``seen``-th earlier one with its key."""
        if message.get("role") != "assistant":
            return None
        replies = self._by_key.get(message_key(message), [])
        return replies[seen] if seen < len(replies) else None

    def __len__(self) -> int:
        return sum(len(r) for r in self._by_key.values())


def conversation_ids(tokenizer: Any, messages: Sequence[dict[str, Any]], book: ReplyBook):
    """int32 [P]: ``messages`` rendered by the chat template, ready for the assistant's turn.

    Args:
      tokenizer: an :class:`~rlax.core.models.hf_tokenizer.HFTokenizer` with a chat template.
      messages: OpenAI messages, contents already text (or None).
      book: the episode's replies; each one found is rendered as its sampled ids.

    Raises:
      ValueError: the template cannot render the conversation (the message says why).
    """
    known: dict[int, Reply] = {}
    shown = []
    seen: dict[str, int] = {}  # assistant messages so far, by key
    for k, message in enumerate(messages):
        reply = None
        if message.get("role") == "assistant":
            key = message_key(message)
            reply = book.find(message, seen.get(key, 0))
            seen[key] = seen.get(key, 0) + 1
        if reply is None:
            shown.append(dict(message))
            continue
        known[k] = reply
        shown.append({"role": "assistant", "content": reply.raw})
    parts = tokenizer.chat_parts(shown, add_generation_prompt=True)
    _check_fields_are_text(tokenizer, shown, parts)
    texts = [k for k, m in enumerate(shown) if isinstance(m.get("content"), str)]
    eos = tokenizer.token(tokenizer.eos_id) or ""
    ids: list[np.ndarray] = []
    start = 0  # the first part not yet encoded (always a framing part)
    for n, k in enumerate(texts):
        reply = known.get(k)
        if reply is None:
            continue
        slot = 2 * n + 1
        ids.append(tokenizer.encode_parts(parts[start:slot]))
        ids.append(np.asarray(reply.ids, np.int32))
        after = parts[slot + 1]
        if reply.stopped and eos and after.startswith(eos):
            parts[slot + 1] = after[len(eos) :]
        start = slot + 1
    ids.append(tokenizer.encode_parts(parts[start:]))
    return np.concatenate(ids).astype(np.int32)


def _neutral(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with the text of its fields other than role and content made neutral:
    tool calls' ids and names ``x``, their arguments ``{}``, ``tool_call_id`` and
    ``refusal`` ``x``."""
    out = dict(message)
    for field in ("tool_call_id", "refusal", "name"):
        if isinstance(out.get(field), str):
            out[field] = "x"
    calls = []
    for call in out.get("tool_calls") or ():
        call = dict(call)
        if isinstance(call.get("id"), str):
            call["id"] = "x"
        function = dict(call.get("function") or {})
        function.update(name="x", arguments="{}")
        call["function"] = function
        calls.append(call)
    if calls:
        out["tool_calls"] = calls
    return out


def _controls(tokenizer: Any, parts: Sequence[str]) -> list[int]:
    named = control_ids(tokenizer)
    return [i for i in tokenizer.encode_parts(parts).tolist() if i in named]


def _check_fields_are_text(tokenizer: Any, shown: list[dict[str, Any]], parts: list[str]):
    """ValueError when a field other than a content (a tool call's name or arguments, a
    ``tool_call_id``) that the template renders into its framing brings control ids there:
    the framing's control ids must be those of the same conversation with those fields
    neutral. Text is text wherever a template puts it."""
    if not any(set(m) - {"role", "content"} for m in shown):
        return
    neutral = tokenizer.chat_parts([_neutral(m) for m in shown], add_generation_prompt=True)
    if _controls(tokenizer, parts) != _controls(tokenizer, neutral):
        raise ValueError(
            "a message field other than its content (a tool call's name or arguments, "
            "a tool_call_id) spells the tokenizer's control tokens where the template "
            "renders it"
        )
