"""``agents.calculator``: arithmetic with a calculator tool, written as plain ``openai`` code.

Registered as a third party would register an agent (an entry point of the
``rlax`` group naming this module, whose hook returns the agent). The agent
asks the model the task's question with one tool, ``calculate``; each call
is answered with the expression's value (or its error) as a tool message;
the model's first reply without a call is the answer, which the reward
plugin scores (``@rewards.arithmetic()``: an integer equal to the answer).
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Callable
from typing import Annotated, Any

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast

__all__ = ["SYSTEM", "TOOL", "calculate", "calculator", "call_result", "opening"]

SYSTEM = "Answer with an integer. You may use the calculator."
TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "The value of an arithmetic expression, e.g. 12*(3+4)",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
_OPS: dict[type, Callable[..., int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> int:
    """An integer expression's value (+ - * // % and parentheses); ValueError for anything else."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"not integer arithmetic: {ast.dump(node)[:40]}")

    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    try:
        return value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ZeroDivisionError) as err:
        raise ValueError(str(err)) from None


def opening(question: str) -> list[dict[str, Any]]:
    """The conversation's first messages: the system's instruction and the question."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def call_result(arguments: Any) -> str:
    """What a ``calculate`` call with these (parsed) arguments gets back: the
    expression's value, or its error as text."""
    try:
        return str(calculate(str(arguments["expression"])))
    except (ValueError, KeyError, TypeError) as err:
        return f"error: {err}"


def calculator(client: Any, prompt: Any, *, max_calls: Annotated[int, AtLeast(0)] = 3) -> str:
    """Asks the question with the calculator tool; the answer is the first reply without a call."""
    messages = opening(prompt.text)
    for _ in range(max_calls + 1):
        # The same tools every turn: each request extends the last one's ids.
        reply = client.chat.completions.create(model="rlax-policy", messages=messages, tools=[TOOL])
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                result = call_result(json.loads(call.function.arguments))
            except ValueError as err:  # arguments that are not JSON
                result = f"error: {err}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""  # still calling after max_calls: no answer


@hookimpl
def rlax_register_agents():
    return {"calculator": calculator}
