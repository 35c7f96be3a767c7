"""The Responses and Messages APIs' requests, read as the chat request they stand for.

``POST /v1/responses`` (the OpenAI Responses API: Codex-style harnesses) and
``POST /v1/messages`` (the Anthropic Messages API: claude-code-style ones)
carry a conversation in their own items; each is checked field by field
(:mod:`.fields`: honoured or a 400 naming it) and turned into the
:class:`~rlax.core.rollout.agents.requests.ChatRequest` of the same
conversation, so a turn of either is a chat turn on the same recording
(:func:`~rlax.core.rollout.agents.turns.chat_turn`): the same ids, the
replies given put back as their sampled ids.

- Responses: ``instructions`` is the system message; ``input`` a string (one
  user message) or items: messages (``input_text`` / ``output_text`` parts),
  ``function_call`` items (one assistant message per run of them, as the
  chat reply that made them) and ``function_call_output`` items (tool
  messages). State kept by the server (``previous_response_id``,
  ``store``) is refused: an agent sends its whole conversation.
- Messages: ``system`` is the system message; ``text`` blocks are content,
  an assistant's ``tool_use`` blocks its tool calls (``input`` as JSON
  arguments), a user's ``tool_result`` blocks tool messages (in order,
  before the rest of its text). ``max_tokens`` is required, as the API says;
  ``stop_sequences`` are stop strings.
"""

from __future__ import annotations

import json
from typing import Any

from rlax.core.rollout.agents.errors import ApiError
from rlax.core.rollout.agents.fields import (
    READ,
    Check,
    Policy,
    boolean,
    check_fields,
    neutral,
    policy_value,
    refused,
    string_map,
    text,
)
from rlax.core.rollout.agents.requests import (
    ChatRequest,
    EndpointLimits,
    _budget,
    _message,
    _stops,
    _tools,
)

__all__ = ["MESSAGES", "RESPONSES", "messages_request", "responses_request"]

# POST /v1/responses, every field of the API's request schema.
RESPONSES: dict[str, Check] = {
    "model": READ,
    "input": READ,
    "instructions": READ,
    "tools": READ,
    "tool_choice": READ,
    "max_output_tokens": READ,
    "stream": boolean,
    "stream_options": READ,
    "temperature": policy_value("temperature"),
    "top_p": policy_value("top_p"),
    "top_logprobs": neutral(0, why="top alternatives are not served"),
    "parallel_tool_calls": neutral(True, why="every call the model writes is returned"),
    "metadata": string_map,
    "user": text(),
    "prompt_cache_key": text(),
    "safety_identifier": text(),
    "service_tier": neutral("auto", "default", why="one tier"),
    "store": neutral(False, why="nothing is stored: send the whole conversation"),
    "background": neutral(False, why="answered in the request"),
    "truncation": neutral("disabled", why="the conversation is never cut"),
    "include": neutral([], why="no extra outputs"),
    "text": neutral({"format": {"type": "text"}}, why="no JSON modes"),
    "reasoning": refused("not a reasoning model's endpoint"),
    "previous_response_id": refused("nothing is stored: send the whole conversation"),
    "conversation": refused("nothing is stored: send the whole conversation"),
    "prompt": refused("no stored prompts"),
    "max_tool_calls": refused("every call the model writes is returned"),
}

# POST /v1/messages, every field of the API's request schema.
MESSAGES: dict[str, Check] = {
    "model": READ,
    "max_tokens": READ,
    "messages": READ,
    "system": READ,
    "tools": READ,
    "tool_choice": READ,
    "stop_sequences": READ,
    "stream": boolean,
    "temperature": policy_value("temperature"),
    "top_p": policy_value("top_p"),
    "top_k": policy_value("top_k"),
    "metadata": READ,
    "service_tier": neutral("auto", "standard_only", why="one tier"),
    "thinking": neutral({"type": "disabled"}, why="not a reasoning model's endpoint"),
    "container": refused("no code execution"),
    "mcp_servers": refused("no MCP servers"),
    "context_management": refused("the conversation is never edited"),
}


def _model(body: dict[str, Any], policy: Policy) -> str:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "model is required: a string", param="model")
    if name != policy.model:
        raise ApiError(
            404,
            f"the model {name[:80]!r} does not exist; this endpoint serves {policy.model!r}",
            param="model",
            code="model_not_found",
        )
    return name


def _parts_text(content: Any, where: str, kinds: tuple[str, ...]) -> str:
    """A content given as a string or text parts of ``kinds``, as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}: content must be a string or a list of parts", param=where)
    texts = []
    for k, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") in kinds):
            raise ApiError(400, f"{where}[{k}]: only {list(kinds)} parts are served", param=where)
        if not isinstance(part.get("text"), str):
            raise ApiError(400, f"{where}[{k}]: a text part needs a string text", param=where)
        texts.append(part["text"])
    return "".join(texts)


def _chat(
    body: dict[str, Any],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    choice: str,
    max_tokens: int,
    stop: tuple[str, ...],
    limits: EndpointLimits,
    policy: Policy,
) -> ChatRequest:
    if not 1 <= len(messages) <= limits.max_messages:
        raise ApiError(400, f"the conversation must hold 1 to {limits.max_messages} messages")
    checked = [_message(m, k) for k, m in enumerate(messages)]
    return ChatRequest(
        model=policy.model,
        messages=checked,
        tools=_tools(tools or None, limits),
        max_tokens=max_tokens,
        n=1,
        stream=bool(body.get("stream", False)),
        logprobs=False,
        seed=None,
        tool_choice=choice,
        stop=stop,
    )


# -- Responses ------------------------------------------------------------------------------


def _response_items(items: Any) -> list[dict[str, Any]]:
    """The chat messages of a Responses ``input``."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ApiError(400, "input must be a string or a list of items", param="input")
    out: list[dict[str, Any]] = []
    for k, item in enumerate(items):
        where = f"input[{k}]"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where} must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            content = _parts_text(item.get("content"), where, ("input_text", "output_text"))
            out.append({"role": role, "content": content})
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
            if not all(isinstance(v, str) for v in (call_id, name, args)):
                raise ApiError(400, f"{where}: call_id, name and arguments strings", param="input")
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
            last = out[-1] if out else {}
            if last.get("role") == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)  # parallel calls: one reply
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str) or not isinstance(output, str):
                raise ApiError(400, f"{where}: call_id and output strings", param="input")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        else:
            raise ApiError(
                400, f"{where}: items of type {str(kind)[:40]!r} are not served", param="input"
            )
    return out


def _response_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ApiError(400, "tools must be a list", param="tools")
    out = []
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ApiError(
                400, f'tools[{k}]: only "function" tools are served', param=f"tools[{k}]"
            )
        function = {f: tool[f] for f in tool if f != "type"}
        out.append({"type": "function", "function": function})
    return out


def responses_request(
    body: dict[str, Any], *, policy: Policy, limits: EndpointLimits
) -> ChatRequest:
    """A checked Responses request as its chat request (ApiError: what is wrong, and where)."""
    check_fields(body, RESPONSES, policy)
    _model(body, policy)
    messages = _response_items(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ApiError(400, "instructions must be a string", param="instructions")
        messages = [{"role": "system", "content": instructions}, *messages]
    choice = body.get("tool_choice") or "auto"
    if choice not in ("auto", "none"):
        raise ApiError(400, 'tool_choice: only "auto" and "none" are served', param="tool_choice")
    options = body.get("stream_options")
    if options is not None and not (
        body.get("stream") is True
        and isinstance(options, dict)
        and all(k == "include_obfuscation" and isinstance(v, bool) for k, v in options.items())
    ):
        raise ApiError(
            400, "stream_options: only include_obfuscation, with stream", param="stream_options"
        )
    budget = _budget(body.get("max_output_tokens"), "max_output_tokens", policy.max_new_tokens)
    tools = _response_tools(body.get("tools"))
    return _chat(body, messages, tools, choice, budget, (), limits, policy)


# -- Messages -------------------------------------------------------------------------------

BLOCK_TEXT = ("text",)


def _anthropic_message(message: Any, k: int) -> list[dict[str, Any]]:
    """The chat messages one Messages message stands for."""
    where = f"messages[{k}]"
    if not isinstance(message, dict) or set(message) - {"role", "content"}:
        raise ApiError(400, f"{where}: an object of role and content", param=where)
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise ApiError(400, f"{where}: role must be user or assistant", param=f"{where}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list) or not content:
        raise ApiError(400, f"{where}: content must be a string or a list of blocks", param=where)
    texts, calls, results = [], [], []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            if not (isinstance(block.get("id"), str) and isinstance(block.get("name"), str)):
                raise ApiError(400, f"{at}: a tool_use needs its id and name", param=at)
            if not isinstance(block.get("input"), dict):
                raise ApiError(400, f"{at}: a tool_use's input is an object", param=at)
            arguments = json.dumps(block["input"])
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": block["name"], "arguments": arguments},
                }
            )
        elif kind == "tool_result" and role == "user":
            if block.get("is_error") not in (None, False, True):
                raise ApiError(400, f"{at}: is_error must be true or false", param=at)
            result = block.get("content", "")
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id"),
                    "content": _parts_text(result, at, BLOCK_TEXT),
                }
            )
        else:
            raise ApiError(
                400, f"{at}: blocks of type {str(kind)[:40]!r} are not served here", param=at
            )
    if role == "assistant":
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
        if calls:
            msg["tool_calls"] = calls
        return [msg]
    return [*results, *([{"role": "user", "content": "".join(texts)}] if texts else [])]


def _anthropic_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ApiError(400, "tools must be a list", param="tools")
    out = []
    for k, tool in enumerate(tools):
        where = f"tools[{k}]"
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            raise ApiError(400, f"{where}: only custom tools are served", param=where)
        extra = set(tool) - {"type", "name", "description", "input_schema", "cache_control"}
        if extra:
            raise ApiError(400, f"{where}: {min(extra)[:40]} is not served", param=where)
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
        if "description" in tool:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _anthropic_choice(choice: Any) -> str:
    if choice is None:
        return "auto"
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "none") or choice.get("disable_parallel_tool_use"):
        raise ApiError(
            400,
            'tool_choice: only {"type": "auto"} and {"type": "none"} are served',
            param="tool_choice",
        )
    return kind


def messages_request(
    body: dict[str, Any], *, policy: Policy, limits: EndpointLimits
) -> ChatRequest:
    """A checked Messages request as its chat request (ApiError: what is wrong, and where)."""
    check_fields(body, MESSAGES, policy)
    _model(body, policy)
    if body.get("max_tokens") is None:
        raise ApiError(400, "max_tokens: required", param="max_tokens")
    budget = _budget(body["max_tokens"], "max_tokens", policy.max_new_tokens)
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict)
        and set(metadata) <= {"user_id"}
        and isinstance(metadata.get("user_id", ""), (str, type(None)))
    ):
        raise ApiError(400, "metadata: only user_id, a string", param="metadata")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw or len(raw) > limits.max_messages:
        raise ApiError(
            400, f"messages must be a list of 1 to {limits.max_messages}", param="messages"
        )
    messages = [m for k, message in enumerate(raw) for m in _anthropic_message(message, k)]
    system = body.get("system")
    if system is not None:
        messages = [
            {"role": "system", "content": _parts_text(system, "system", BLOCK_TEXT)},
            *messages,
        ]
    stops = _stops(body.get("stop_sequences"), "stop_sequences", most=16)
    tools = _anthropic_tools(body.get("tools"))
    return _chat(
        body,
        messages,
        tools,
        _anthropic_choice(body.get("tool_choice")),
        budget,
        stops,
        limits,
        policy,
    )
