"""Requests to the OpenAI-compatible endpoint, validated, and errors in the API's own shape.

Every request body is checked here before it reaches a sampler: its size
(``EndpointLimits.max_body_bytes``, 413), that it is a JSON object, the
model's name (404), the messages' roles and contents, the tools' schemas,
``n`` in range and ``max_tokens`` a positive integer (400; one above the
sampler's budget is clamped to it). A refusal is an :class:`ApiError`,
answered as ``{"error": {"message", "type", "param", "code"}}`` with its
HTTP status, as the OpenAI API answers, so an ``openai`` client raises its
own exception for it (``BadRequestError``, ``AuthenticationError``, ...).

Every other field is checked by :mod:`.fields`: honoured (its effect given)
or refused (400 naming it); a field in no API table is refused as the
OpenAI API refuses an unrecognized argument. ``temperature`` and ``top_p``
are honoured when they are the policy's own (the trainer recomputes
logprobs under them) and refused otherwise. ``stop`` (up to 4 strings) cuts
the reply where a stop string first ends (:mod:`.stops`). Tool schemas are
checked whole as JSON Schema (``jsonschema``, draft 2020-12). No value
raises anything but :class:`ApiError`: a client never gets a 5xx for what
it sent.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Annotated, Any

from rlax.core.constraints import AtLeast
from rlax.core.rollout.agents.errors import ApiError
from rlax.core.rollout.agents.fields import CHAT, TEXT, Policy, check_fields

__all__ = [
    "ApiError",
    "ChatRequest",
    "EndpointLimits",
    "Policy",
    "TextRequest",
    "chat_request",
    "text_request",
]

ROLES = ("system", "developer", "user", "assistant", "tool")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


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
    stop: tuple[str, ...] = ()
    include_usage: bool = False


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
    stop: tuple[str, ...] = ()
    include_usage: bool = False


def parse_body(raw: bytes, limits: EndpointLimits) -> dict[str, Any]:
    """The JSON object of a request body (413 past the size limit, 400 for anything else)."""
    if len(raw) > limits.max_body_bytes:
        raise too_large(limits)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError among them
        message = str(err) if isinstance(err, ValueError) else "nested too deeply"
        raise ApiError(400, f"the request body is not JSON we read: {message[:200]}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if _SURROGATE.search(raw):  # an escaped lone surrogate is JSON but no text
        try:
            json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise ApiError(400, "the request body holds a lone UTF-16 surrogate") from None
    return body


def too_large(limits: EndpointLimits) -> ApiError:
    return ApiError(
        413,
        f"the request body is over {limits.max_body_bytes} bytes",
        code="request_too_large",
    )


def _integer(body: dict, name: str, default: Any, low: int, high: int) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(
            400, f"{name} must be an integer in [{low}, {high}], got {str(value)[:40]}", param=name
        )
    return value


def _budget(value: Any, param: str, max_new_tokens: int) -> int:
    """A positive integer, clamped to the sampler's budget (the reply then says "length")."""
    if value is None:
        return max_new_tokens
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(
            400, f"{param} must be a positive integer, got {str(value)[:40]}", param=param
        )
    return min(value, max_new_tokens)


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false, got {str(value)[:40]}", param=name)
    return value


MAX_STOPS, MAX_STOP_CHARS = 4, 256
SEED_RANGE = (-(2**63), 2**63 - 1)


def _stops(value: Any, name: str = "stop", most: int = MAX_STOPS) -> tuple[str, ...]:
    """Up to ``most`` non-empty stop strings (a string is one)."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    ok = isinstance(stops, list) and len(stops) <= most
    ok = ok and all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)
    if not ok:
        raise ApiError(
            400,
            f"{name} must be a string or a list of at most {most} non-empty strings "
            f"of at most {MAX_STOP_CHARS} characters",
            param=name,
        )
    return tuple(stops)


def _stream_options(body: dict, stream: bool) -> bool:
    """``stream_options.include_usage`` (only with ``stream``, as the API says)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise ApiError(400, "stream_options: only with stream true", param="stream_options")
    known = {"include_usage", "include_obfuscation"}
    if not isinstance(options, dict) or set(options) - known:
        raise ApiError(400, f"stream_options: an object of {sorted(known)}", param="stream_options")
    for name, value in options.items():
        if not isinstance(value, bool):
            raise ApiError(
                400, f"stream_options.{name} must be true or false", param="stream_options"
            )
    return bool(options.get("include_usage", False))


def _common(body: dict, policy: Policy, limits: EndpointLimits, table: dict) -> dict:
    check_fields(body, table, policy)
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
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    stream = _flag(body, "stream")
    return {
        "model": name,
        "max_tokens": _budget(limit, param, policy.max_new_tokens),
        "n": _integer(body, "n", 1, 1, limits.max_n),
        "stream": stream,
        "seed": _integer(body, "seed", None, *SEED_RANGE),
        "stop": _stops(body.get("stop")),
        "include_usage": _stream_options(body, stream),
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


MESSAGE_FIELDS = {"role", "content", "tool_calls", "tool_call_id", "refusal"}


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list) or not calls:
        raise ApiError(400, f"{where}.tool_calls must be a non-empty list", param=where)
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(400, f"{where}.tool_calls[{k}] needs a function name", param=where)
        if not isinstance(call.get("id", ""), str):
            raise ApiError(400, f"{where}.tool_calls[{k}].id must be a string", param=where)
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            raise ApiError(400, f"{where}.tool_calls[{k}]: arguments must be a JSON string")
    return calls


def _message(message: Any, k: int) -> dict[str, Any]:
    where = f"messages[{k}]"
    if not isinstance(message, dict):
        raise ApiError(400, f"{where} must be an object", param=where)
    for field in message:
        if field not in MESSAGE_FIELDS:  # ``name`` among them: the template shows no names
            raise ApiError(
                400, f"{where}.{str(field)[:40]}: not served", param=f"{where}.{str(field)[:40]}"
            )
    role = message.get("role")
    if role not in ROLES:
        raise ApiError(
            400,
            f"{where}: role {str(role)[:40]!r} is not one of {list(ROLES)}",
            param=f"{where}.role",
        )
    if message.get("refusal") is not None:
        raise ApiError(400, f"{where}.refusal: not served", param=f"{where}.refusal")
    out: dict[str, Any] = {"role": role, "content": text_content(message.get("content"), where)}
    if role == "assistant" and message.get("tool_calls") is not None:
        out["tool_calls"] = _tool_calls(message["tool_calls"], where)
    elif message.get("tool_calls") is not None:
        raise ApiError(400, f"{where}: only an assistant message has tool_calls", param=where)
    elif out["content"] is None:
        raise ApiError(400, f"{where}: a {role} message needs content", param=where)
    if role == "tool":
        if not isinstance(message.get("tool_call_id"), str):
            raise ApiError(400, f"{where}: a tool message needs its tool_call_id", param=where)
        out["tool_call_id"] = message["tool_call_id"]
    elif message.get("tool_call_id") is not None:
        raise ApiError(400, f"{where}: only a tool message has a tool_call_id", param=where)
    return out


def check_schema(parameters: Any, where: str) -> None:
    """``parameters`` is a JSON Schema (draft 2020-12, checked whole) of an object."""
    import jsonschema  # the 'agents' extra

    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise ApiError(400, f"{where}: parameters must be a JSON Schema of an object", param=where)
    try:
        jsonschema.Draft202012Validator.check_schema(parameters)
    except jsonschema.SchemaError as err:
        at = "/".join(str(p) for p in err.absolute_path) or "(top)"
        raise ApiError(
            400, f"{where}: not a valid JSON Schema at {at[:80]}: {err.message[:160]}", param=where
        ) from None
    except RecursionError:
        raise ApiError(400, f"{where}: the schema is nested too deeply", param=where) from None


TOOL_FIELDS = {"name", "description", "parameters", "strict"}


def _tools(tools: Any, limits: EndpointLimits) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list) or len(tools) > limits.max_tools:
        raise ApiError(400, f"tools must be a list of at most {limits.max_tools}", param="tools")
    for k, tool in enumerate(tools):
        where = f"tools[{k}]"
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or set(tool) - {"type", "function"}
        ):
            raise ApiError(400, f'{where}: {{"type": "function", "function": ...}}', param=where)
        check_function(tool.get("function"), where)
    return tools


def check_function(function: Any, where: str) -> None:
    """A tool's function: its name, description, JSON Schema parameters (``strict`` read
    as the schema itself: arguments are the model's text, parsed, never constrained)."""
    if not isinstance(function, dict) or not _TOOL_NAME.match(str(function.get("name", ""))):
        raise ApiError(400, f"{where}: function.name must match {_TOOL_NAME.pattern}", param=where)
    extra = set(function) - TOOL_FIELDS
    if extra:
        raise ApiError(400, f"{where}: {min(extra)[:40]} is not a function field", param=where)
    if not isinstance(function.get("description", ""), str):
        raise ApiError(400, f"{where}: description must be a string", param=where)
    if function.get("strict"):
        raise ApiError(400, f"{where}: strict: constrained decoding is not served", param=where)
    check_schema(function.get("parameters", {"type": "object"}), where)


def chat_request(body: dict[str, Any], *, policy: Policy, limits: EndpointLimits) -> ChatRequest:
    """A checked chat request (ApiError: what is wrong, and where)."""
    common = _common(body, policy, limits, CHAT)
    messages = body.get("messages")
    if not isinstance(messages, list) or not 1 <= len(messages) <= limits.max_messages:
        raise ApiError(
            400, f"messages must be a list of 1 to {limits.max_messages}", param="messages"
        )
    choice = body.get("tool_choice", "auto")
    if choice is None:
        choice = "auto"
    if choice not in ("auto", "none"):
        raise ApiError(400, 'tool_choice: only "auto" and "none" are served', param="tool_choice")
    return ChatRequest(
        messages=[_message(m, k) for k, m in enumerate(messages)],
        tools=_tools(body.get("tools"), limits),
        logprobs=_flag(body, "logprobs"),
        tool_choice=choice,
        **common,
    )


def text_request(body: dict[str, Any], *, policy: Policy, limits: EndpointLimits) -> TextRequest:
    """A checked completions request: one prompt string (ApiError: what is wrong)."""
    common = _common(body, policy, limits, TEXT)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "prompt must be one non-empty string", param="prompt")
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0) or isinstance(logprobs, bool):
        raise ApiError(
            400,
            "logprobs: 0 (the sampled tokens' own; top alternatives are not served)",
            param="logprobs",
        )
    return TextRequest(prompt=prompt, logprobs=logprobs is not None, **common)
