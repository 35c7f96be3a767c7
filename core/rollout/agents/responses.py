"""A turn as the OpenAI API answers it: response bodies and server-sent chunks.

The shapes are the API's (``chat.completion``, ``chat.completion.chunk``,
``text_completion``), so an ``openai`` client reads them as it reads the
hosted API's. ``logprobs`` are the sampler's own, per sampled id, each
token its text and bytes (:func:`~rlax.core.rollout.agents.reply_text.token_pieces`).
A stream is the whole reply cut into chunks after it is sampled (the
:class:`~rlax.core.contracts.Sampler` contract returns finished replies):
the role, the content in pieces (in one piece carrying every logprob when
they are asked for), the tool calls, the finish reason, then the usage when
``stream_options.include_usage`` asks for it.
"""

from __future__ import annotations

import time
from typing import Any

from rlax.core.rollout.agents.turns import Turn

__all__ = ["chat_body", "chat_chunks", "text_body", "text_chunks"]

# Characters of content per streamed chunk.
PIECE = 16


def _usage(turn: Turn) -> dict[str, int]:
    n = len(turn.ids)
    return {
        "prompt_tokens": turn.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": turn.prompt_tokens + n,
    }


def _pieces(text: str) -> list[str]:
    return [text[i : i + PIECE] for i in range(0, len(text), PIECE)]


def _chat_logprobs(turn: Turn) -> dict[str, Any]:
    return {
        "content": [
            {"token": t, "logprob": float(lp), "bytes": b, "top_logprobs": []}
            for (t, b), lp in zip(turn.tokens, turn.logprobs)
        ],
        "refusal": None,
    }


def chat_body(ident: str, model: str, turn: Turn, *, logprobs: bool) -> dict[str, Any]:
    """A ``chat.completion`` with one choice."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.tool_calls:
        message["tool_calls"] = turn.tool_calls
    choice = {
        "index": 0,
        "message": message,
        "logprobs": _chat_logprobs(turn) if logprobs else None,
        "finish_reason": turn.finish_reason,
    }
    return {
        "id": ident,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(turn),
    }


def chat_chunks(
    ident: str, model: str, turn: Turn, *, logprobs: bool = False, usage: bool = False
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` s of a streamed reply, in order."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    pieces = [turn.content or ""] if logprobs else _pieces(turn.content or "")
    deltas += [{"content": piece} for piece in pieces]
    if turn.tool_calls:
        deltas.append({"tool_calls": [{"index": k, **c} for k, c in enumerate(turn.tool_calls)]})
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None, lp: Any = None) -> dict[str, Any]:
        return {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}],
        }

    out = [chunk(d, None) for d in deltas]
    if logprobs and len(out) > 1:
        out[1] = chunk(deltas[1], None, _chat_logprobs(turn))
    out.append(chunk({}, turn.finish_reason))
    if usage:  # the API's last chunk: no choices, the request's usage
        out.append({**chunk({}, None), "choices": [], "usage": _usage(turn)})
    return out


def _text_logprobs(turn: Turn) -> dict[str, Any]:
    offsets, seen = [], b""
    for _, raw in turn.tokens:  # each token's offset: characters of the text before it
        offsets.append(len(seen.decode("utf-8", errors="ignore")))
        seen += bytes(raw)
    return {
        "tokens": [t for t, _ in turn.tokens],
        "token_logprobs": [float(lp) for lp in turn.logprobs],
        "top_logprobs": None,
        "text_offset": offsets,
    }


def text_body(ident: str, model: str, turn: Turn, *, logprobs: bool) -> dict[str, Any]:
    """A ``text_completion`` with one choice."""
    choice = {
        "index": 0,
        "text": turn.text,
        "logprobs": _text_logprobs(turn) if logprobs else None,
        "finish_reason": turn.finish_reason,
    }
    return {
        "id": ident,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(turn),
    }


def text_chunks(
    ident: str, model: str, turn: Turn, *, logprobs: bool = False, usage: bool = False
) -> list[dict[str, Any]]:
    """The streamed ``text_completion`` chunks of a reply, in order."""
    created = int(time.time())
    pieces = ([turn.text] if logprobs else _pieces(turn.text)) or [""]
    out: list[dict[str, Any]] = [
        {
            "id": ident,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "text": piece,
                    "logprobs": _text_logprobs(turn) if logprobs else None,
                    "finish_reason": turn.finish_reason if k == len(pieces) - 1 else None,
                }
            ],
        }
        for k, piece in enumerate(pieces)
    ]
    if usage:
        out.append({**out[-1], "choices": [], "usage": _usage(turn)})
    return out
