"""Every request field of the served APIs: honoured, or refused with a 400 naming it.

Each API's table (:data:`CHAT`, :data:`TEXT`, and those of :mod:`.formats`)
names every field its request schema documents. A field is either read by
the request's parser (``READ``: the parser gives it its effect) or checked
here against the values whose effect the endpoint has:

- the sampling settings (``temperature``, ``top_p``, ``top_k``) are the
  policy's own (the trainer recomputes logprobs under them): a value equal
  to the policy's is honoured, any other refused;
- fields with no effect on what is sampled (``user``, ``metadata``,
  ``prompt_cache_key``, ...) are checked for their type and accepted;
- fields whose other values ask for something the endpoint does not do
  (penalties, ``logit_bias``, ``store``, JSON modes, audio, ...) accept
  their neutral value only.

A field in no table is refused (400, ``param`` its name), as the OpenAI API
refuses an unrecognized argument. No check raises anything but
:class:`~rlax.core.rollout.agents.requests.ApiError`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from rlax.core.rollout.agents.errors import ApiError

__all__ = ["CHAT", "READ", "TEXT", "Policy", "check_fields"]


@dataclasses.dataclass(frozen=True)
class Policy:
    """What the endpoint samples with: the served model's name and the policy's settings."""

    model: str
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


Check = Callable[[Any, str, Policy], None]


def READ(value: Any, name: str, policy: Policy) -> None:
    """A field its API's parser reads (and gives its effect)."""


def refused(why: str) -> Check:
    """A field that is refused whatever its value (None: absent)."""

    def check(value: Any, name: str, policy: Policy) -> None:
        if value is not None:
            raise ApiError(400, f"{name}: not served ({why})", param=name)

    return check


def neutral(*ok: Any, why: str) -> Check:
    """A field whose only served values are ``ok`` (None: absent)."""

    def check(value: Any, name: str, policy: Policy) -> None:
        if value is None or any(type(value) is type(v) and value == v for v in ok):
            return
        if any(isinstance(v, float) for v in ok) and _number(value) and value == 0:
            return
        shown = " or ".join(repr(v) for v in ok)
        raise ApiError(
            400, f"{name}: only {shown} is served ({why}), got {_short(value)}", param=name
        )

    return check


def text(max_chars: int = 512) -> Check:
    """A string with no effect on sampling (None: absent)."""

    def check(value: Any, name: str, policy: Policy) -> None:
        if value is not None and (not isinstance(value, str) or len(value) > max_chars):
            raise ApiError(400, f"{name} must be a string of at most {max_chars}", param=name)

    return check


def string_map(value: Any, name: str, policy: Policy) -> None:
    """``metadata``: up to 16 string keys (64 chars) to string values (512 chars)."""
    if value is None:
        return
    ok = isinstance(value, dict) and len(value) <= 16
    ok = ok and all(
        isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
        for k, v in value.items()
    )
    if not ok:
        raise ApiError(400, f"{name}: at most 16 string keys to string values", param=name)


def boolean(value: Any, name: str, policy: Policy) -> None:
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false, got {_short(value)}", param=name)


def policy_value(setting: str) -> Check:
    """A sampling setting: honoured when it is the policy's own, else refused."""

    def check(value: Any, name: str, policy: Policy) -> None:
        if value is None:
            return
        own = getattr(policy, setting)
        if not _number(value) or not math.isclose(float(value), float(own), abs_tol=1e-6):
            raise ApiError(
                400,
                f"{name}: the policy samples at {setting} {own} (the trainer scores its "
                f"logprobs there); got {_short(value)}",
                param=name,
            )

    return check


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def check_fields(body: dict[str, Any], table: dict[str, Check], policy: Policy) -> None:
    """Every field of ``body`` is in ``table`` and passes its check (else 400 naming it)."""
    for name, value in body.items():
        check = table.get(name)
        if check is None:
            raise ApiError(400, f"unrecognized request argument: {_short(name)}", param=str(name))
        check(value, name, policy)


_COMMON: dict[str, Check] = {
    "model": READ,
    "max_tokens": READ,
    "n": READ,
    "stream": READ,
    "stream_options": READ,
    "seed": READ,
    "stop": READ,
    "logprobs": READ,
    "temperature": policy_value("temperature"),
    "top_p": policy_value("top_p"),
    "frequency_penalty": neutral(0.0, why="no penalties: the policy's own distribution"),
    "presence_penalty": neutral(0.0, why="no penalties: the policy's own distribution"),
    "logit_bias": neutral({}, why="no bias: the policy's own distribution"),
    "user": text(),
}

# POST /v1/chat/completions, every field of the API's request schema.
CHAT: dict[str, Check] = {
    **_COMMON,
    "messages": READ,
    "max_completion_tokens": READ,
    "tools": READ,
    "tool_choice": READ,
    "top_logprobs": neutral(0, why="top alternatives are not served"),
    "parallel_tool_calls": neutral(True, why="every call the model writes is returned"),
    "response_format": neutral({"type": "text"}, why="no JSON modes"),
    "metadata": string_map,
    "store": neutral(False, why="nothing is stored"),
    "service_tier": neutral("auto", "default", why="one tier"),
    "prompt_cache_key": text(),
    "safety_identifier": text(),
    "modalities": neutral(["text"], why="text only"),
    "audio": refused("text only"),
    "prediction": refused("no predicted outputs"),
    "reasoning_effort": refused("not a reasoning model's endpoint"),
    "verbosity": refused("not a reasoning model's endpoint"),
    "web_search_options": refused("no web search"),
    "functions": refused("deprecated: use tools"),
    "function_call": refused("deprecated: use tool_choice"),
}

# POST /v1/completions, every field of the API's request schema.
TEXT: dict[str, Check] = {
    **_COMMON,
    "prompt": READ,
    "best_of": neutral(1, why="one sample per request"),
    "echo": neutral(False, why="the reply only"),
    "suffix": neutral("", why="no insertion"),
}
