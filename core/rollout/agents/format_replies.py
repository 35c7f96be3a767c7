"""A turn as the Responses and Messages APIs answer it: bodies and server-sent events.

The shapes are the APIs' own (a ``response`` object and its ``response.*``
events; an Anthropic ``message`` and its ``message_start`` ...
``message_stop`` events), so the ``openai`` client's ``responses`` and the
``anthropic`` client's ``messages`` read them as they read the hosted
APIs'. A streamed reply is sampled whole first (the Sampler contract), then
sent as the API's events in order. Errors of ``/v1/messages`` take the
Messages API's error shape (:func:`anthropic_error`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from rlax.core.rollout.agents.errors import ApiError
from rlax.core.rollout.agents.turns import Turn

__all__ = [
    "anthropic_error",
    "message_body",
    "message_events",
    "response_body",
    "response_events",
]


def _uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# -- Responses ------------------------------------------------------------------------------


def _output(turn: Turn, done: bool = True) -> list[dict[str, Any]]:
    status = "completed" if done else "in_progress"
    if turn.tool_calls:
        return [
            {
                "type": "function_call",
                "id": _uid("fc"),
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": status,
            }
            for call in turn.tool_calls
        ]
    part = {"type": "output_text", "text": turn.content or "", "annotations": [], "logprobs": []}
    return [
        {
            "type": "message",
            "id": _uid("msg"),
            "status": status,
            "role": "assistant",
            "content": [part],
        }
    ]


def response_body(ident: str, model: str, turn: Turn, body: dict[str, Any]) -> dict[str, Any]:
    """A ``response`` object of one turn (``body``: the request, for the fields it echoes)."""
    cut = turn.finish_reason == "length"
    n = len(turn.ids)
    return {
        "id": ident,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": model,
        "instructions": body.get("instructions"),
        "output": _output(turn),
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "store": False,
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": turn.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": n,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": turn.prompt_tokens + n,
        },
    }


def response_events(ident: str, model: str, turn: Turn, body: dict[str, Any]) -> Iterator[str]:
    """The ``response.*`` server-sent events of a streamed reply, in order."""
    final = response_body(ident, model, turn, body)
    seq = iter(range(1 << 30))

    def event(kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": next(seq), **fields}
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    start = {**final, "status": "in_progress", "output": [], "incomplete_details": None}
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    for k, item in enumerate(final["output"]):
        yield event(
            "response.output_item.added",
            output_index=k,
            item={
                **item,
                "status": "in_progress",
                **({"content": []} if item["type"] == "message" else {"arguments": ""}),
            },
        )
        if item["type"] == "message":
            part = item["content"][0]
            at = {"item_id": item["id"], "output_index": k, "content_index": 0}
            yield event("response.content_part.added", **at, part={**part, "text": ""})
            if part["text"]:
                yield event("response.output_text.delta", **at, delta=part["text"], logprobs=[])
            yield event("response.output_text.done", **at, text=part["text"], logprobs=[])
            yield event("response.content_part.done", **at, part=part)
        else:
            at = {"item_id": item["id"], "output_index": k}
            yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield event(
                "response.function_call_arguments.done",
                **at,
                arguments=item["arguments"],
                name=item["name"],
            )
        yield event("response.output_item.done", output_index=k, item=item)
    kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield event(kind, response=final)


# -- Messages -------------------------------------------------------------------------------

_STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _blocks(turn: Turn) -> list[dict[str, Any]]:
    if turn.tool_calls:
        return [
            {
                "type": "tool_use",
                "id": call["id"].replace("call_", "toolu_", 1),
                "name": call["function"]["name"],
                "input": json.loads(call["function"]["arguments"]),
            }
            for call in turn.tool_calls
        ]
    return [{"type": "text", "text": turn.content or ""}]


def message_body(ident: str, model: str, turn: Turn) -> dict[str, Any]:
    """An Anthropic ``message`` of one turn."""
    reason = "stop_sequence" if turn.stop is not None else _STOP_REASON[turn.finish_reason]
    return {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _blocks(turn),
        "stop_reason": reason,
        "stop_sequence": turn.stop,
        "usage": {"input_tokens": turn.prompt_tokens, "output_tokens": len(turn.ids)},
    }


def message_events(ident: str, model: str, turn: Turn) -> Iterator[str]:
    """The Messages stream's events of a reply, in order."""
    final = message_body(ident, model, turn)

    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"

    usage = {"input_tokens": turn.prompt_tokens, "output_tokens": 0}
    start = {**final, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
    yield event("message_start", message=start)
    for k, block in enumerate(final["content"]):
        if block["type"] == "text":
            yield event("content_block_start", index=k, content_block={"type": "text", "text": ""})
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            yield event("content_block_start", index=k, content_block={**block, "input": {}})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield event("content_block_delta", index=k, delta=delta)
        yield event("content_block_stop", index=k)
    stop = {"stop_reason": final["stop_reason"], "stop_sequence": final["stop_sequence"]}
    yield event("message_delta", delta=stop, usage={"output_tokens": len(turn.ids)})
    yield event("message_stop")


def anthropic_error(err: ApiError) -> dict[str, Any]:
    """An error in the Messages API's shape (the field it names in its message)."""
    kinds = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large"}
    kind = "api_error" if err.status >= 500 else kinds.get(err.status, "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}
