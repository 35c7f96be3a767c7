"""Requests to the OpenAI-compatible endpoint, validated, and errors in the API's own shape.

Every request body is checked here before it reaches a sampler: its size
(``EndpointLimits.max_body_bytes``, 413), that it is a JSON object, the
model's name (404), the messages' roles and contents, the tools' schemas,
``n`` in range and ``max_tokens`` a positive integer (400; one above the
sampler's budget is clamped to it). A refusal is an :class:`ApiError`,
answered as ``{"error": {"message", "type", "param", "code"}}`` with its
HTTP status, as the OpenAI API answers, so an ``openai`` client raises its
own exception for it (``BadRequestError``, ``AuthenticationError``, ...).

Fields the endpoint does not act on are accepted and ignored (clients send
many). ``temperature`` and ``top_p`` are among them: the policy samples at
its own temperature, the one the trainer recomputes logprobs at.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Annotated, Any

from rlax.core.constraints import AtLeast

__all__ = ["ApiError", "ChatRequest", "EndpointLimits", "TextRequest", "chat_request"]

ROLES = ("system", "developer", "user", "assistant", "tool")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ApiError(Exception):
    """A refused request: its HTTP status and the OpenAI error object's fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclasses.dataclass(frozen=True)
class EndpointLimits:
    """What one request may hold.

    Attributes:
      max_body_bytes: the request body's size.
      max_messages: messages in one chat request.
      max_tools: tools in one chat request.
      max_n: choices per request (1: an episode records one reply per turn).
    """

    max_body_bytes: Annotated[int, AtLeast(1)] = 1 << 20
    max_messages: Annotated[int, AtLeast(1)] = 256
    max_tools: Annotated[int, AtLeast(0)] = 64
    max_n: Annotated[int, AtLeast(1)] = 1


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A valid ``POST /v1/chat/completions``: contents are text, tool calls' arguments JSON."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    max_tokens: int
    n: int
    stream: bool
    logprobs: bool
    seed: int | None
    tool_choice: str


@dataclasses.dataclass(frozen=True)
class TextRequest:
    """A valid ``POST /v1/completions``."""

    model: str
    prompt: str
    max_tokens: int
    n: int
    stream: bool
    logprobs: bool
    seed: int | None


def parse_body(raw: bytes, limits: EndpointLimits) -> dict[str, Any]:
    """The JSON object of a request body (413 past the size limit, 400 for anything else)."""
    if len(raw) > limits.max_body_bytes:
        raise too_large(limits)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the request body is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def too_large(limits: EndpointLimits) -> ApiError:
    return ApiError(
        413,
        f"the request body is over {limits.max_body_bytes} bytes",
        code="request_too_large",
    )


def _integer(body: dict, name: str, default: int, low: int, high: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(
            400, f"{name} must be an integer in [{low}, {high}], got {value!r}", param=name
        )
    return value


def _budget(value: Any, param: str, max_new_tokens: int) -> int:
    """A positive integer, clamped to the sampler's budget (the reply then says "length")."""
    if value is None:
        return max_new_tokens
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(400, f"{param} must be a positive integer, got {value!r}", param=param)
    return min(value, max_new_tokens)


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false, got {value!r}", param=name)
    return value


def _common(body: dict, model: str, max_new_tokens: int, limits: EndpointLimits) -> dict:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "model is required: a string", param="model")
    if name != model:
        raise ApiError(
            404,
            f"the model {name!r} does not exist; this endpoint serves {model!r}",
            param="model",
            code="model_not_found",
        )
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ApiError(400, f"seed must be an integer, got {seed!r}", param="seed")
    return {
        "model": name,
        "max_tokens": _budget(limit, param, max_new_tokens),
        "n": _integer(body, "n", 1, 1, limits.max_n),
        "stream": _flag(body, "stream"),
        "seed": seed,
    }


def text_content(content: Any, where: str) -> str | None:
    """A message's content as text: a string, a list of text parts, or None."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise ApiError(400, f"{where}: only text content parts are served", param=where)
            if not isinstance(part.get("text"), str):
                raise ApiError(400, f"{where}: a text part needs a string text", param=where)
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(400, f"{where}: content must be a string or a list of parts", param=where)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list) or not calls:
        raise ApiError(400, f"{where}.tool_calls must be a non-empty list", param=where)
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(400, f"{where}.tool_calls[{k}] needs a function name", param=where)
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            raise ApiError(400, f"{where}.tool_calls[{k}]: arguments must be a JSON string")
    return calls


def _message(message: Any, k: int) -> dict[str, Any]:
    where = f"messages[{k}]"
    if not isinstance(message, dict):
        raise ApiError(400, f"{where} must be an object", param=where)
    role = message.get("role")
    if role not in ROLES:
        raise ApiError(
            400, f"{where}: role {role!r} is not one of {list(ROLES)}", param=f"{where}.role"
        )
    out: dict[str, Any] = {"role": role, "content": text_content(message.get("content"), where)}
    if role == "assistant" and message.get("tool_calls") is not None:
        out["tool_calls"] = _tool_calls(message["tool_calls"], where)
    elif out["content"] is None:
        raise ApiError(400, f"{where}: a {role} message needs content", param=where)
    if role == "tool":
        if not isinstance(message.get("tool_call_id"), str):
            raise ApiError(400, f"{where}: a tool message needs its tool_call_id", param=where)
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _tools(tools: Any, limits: EndpointLimits) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list) or len(tools) > limits.max_tools:
        raise ApiError(400, f"tools must be a list of at most {limits.max_tools}", param="tools")
    for k, tool in enumerate(tools):
        where = f"tools[{k}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ApiError(400, f'{where}: type must be "function"', param=where)
        function = tool.get("function")
        if not isinstance(function, dict) or not _TOOL_NAME.match(str(function.get("name", ""))):
            raise ApiError(
                400, f"{where}: function.name must match {_TOOL_NAME.pattern}", param=where
            )
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise ApiError(
                400, f"{where}: function.parameters must be a JSON schema of an object", param=where
            )
    return tools


def chat_request(
    body: dict[str, Any], *, model: str, max_new_tokens: int, limits: EndpointLimits
) -> ChatRequest:
    """A checked chat request (ApiError: what is wrong, and where)."""
    common = _common(body, model, max_new_tokens, limits)
    messages = body.get("messages")
    if not isinstance(messages, list) or not 1 <= len(messages) <= limits.max_messages:
        raise ApiError(
            400, f"messages must be a list of 1 to {limits.max_messages}", param="messages"
        )
    choice = body.get("tool_choice", "auto")
    if choice not in ("auto", "none"):
        raise ApiError(400, 'tool_choice: only "auto" and "none" are served', param="tool_choice")
    if body.get("top_logprobs"):
        raise ApiError(400, "top_logprobs are not served", param="top_logprobs")
    return ChatRequest(
        messages=[_message(m, k) for k, m in enumerate(messages)],
        tools=_tools(body.get("tools"), limits),
        logprobs=_flag(body, "logprobs"),
        tool_choice=choice,
        **common,
    )


def text_request(
    body: dict[str, Any], *, model: str, max_new_tokens: int, limits: EndpointLimits
) -> TextRequest:
    """A checked completions request: one prompt string (ApiError: what is wrong)."""
    common = _common(body, model, max_new_tokens, limits)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "prompt must be one non-empty string", param="prompt")
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0, 1) or isinstance(logprobs, bool):
        raise ApiError(400, "logprobs: 0 or 1 (top alternatives are not served)", param="logprobs")
    if body.get("echo"):
        raise ApiError(400, "echo is not served", param="echo")
    return TextRequest(prompt=prompt, logprobs=logprobs is not None, **common)
