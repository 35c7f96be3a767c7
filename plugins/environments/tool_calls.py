"""Tool calls written as JSON inside tags, the style of the Qwen and Hermes chat templates.

A model turn calls a tool by writing, anywhere in its text::

    <tool_call>
    {"name": "python", "arguments": {"code": "print(2 ** 10)"}}
    </tool_call>

and the result comes back as ``<tool_response>...</tool_response>`` (how the
Qwen2.5 template renders a ``tool`` message). This is the documented format
of those templates, parsed here with the standard library's JSON reader.
"""

from __future__ import annotations

import json
import re
from typing import Annotated

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast
from rlax.core.episodes import ToolCall

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class HermesToolParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (arguments may be a JSON string).

    Args:
      max_calls: calls read from one turn; more is a malformed turn.
    """

    def __init__(self, *, max_calls: Annotated[int, AtLeast(1)] = 4):
        if max_calls < 1:
            raise ValueError(f"tool_parsers.hermes: max_calls must be >= 1, got {max_calls}")
        self.max_calls = max_calls

    def parse(self, text: str) -> list[ToolCall]:
        bodies = _CALL.findall(text)
        if text.count("<tool_call>") != len(bodies):
            raise ValueError("a <tool_call> without its </tool_call>")
        if len(bodies) > self.max_calls:
            raise ValueError(f"{len(bodies)} tool calls in one turn; at most {self.max_calls}")
        return [_call(body) for body in bodies]

    #: The frame around each result, as the Qwen2.5 template renders a ``tool`` message:
    #: framing (its added tokens become ids), the result between is text.
    result_framing = ("<tool_response>\n", "\n</tool_response>")

    def format_result(self, call: ToolCall, result: str) -> str:
        opening, closing = self.result_framing
        return f"{opening}{result}{closing}"


def _call(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as err:
        raise ValueError(f"tool call is not JSON ({err.msg} at {err.pos})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError('tool call needs a JSON object with a string "name"')  # noqa: TRY004
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise ValueError(f"tool {obj['name']!r}: arguments are not JSON") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"tool {obj['name']!r}: arguments must be a JSON object")  # noqa: TRY004
    return ToolCall(obj["name"], arguments)


@hookimpl
def rlax_register_tool_parsers():
    return {"hermes": HermesToolParser}
