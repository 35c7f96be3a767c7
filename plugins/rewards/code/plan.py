"""Reading a task's tests, and turning them into what the sandbox may see.

A task's ``answer`` holds its tests in one of these shapes (:func:`read_tests`):

- call-style: ``{"calls": [{"function": "f", "args": [..], "kwargs": {..},
  "expected": v}, ..]}``, or APPS' ``{"fn_name": "f", "inputs": [[args], ..],
  "outputs": [v, ..]}`` (``outputs[i]`` is the return value itself: a
  one-element list is not unwrapped, unlike APPS' own lenient checker);
- stdin/stdout: ``{"stdio": [[stdin, stdout], ..]}`` or ``{"inputs": [..],
  "outputs": [..]}``;
- assert statements (MBPP / HumanEval style): a list of them, one script, or
  ``{"asserts": [..], "setup": ".."}``.

:func:`plan_tests` splits every test into the inputs, which go into the
sandbox, and the expected outputs, which never do (:class:`TestPlan`). Assert
statements are converted where their meaning is a comparison of a call's
value with a literal: ``assert f(1, "a") == [2]`` (either side),
``assert f(x) is None / True / False``, ``assert f(x)``, ``assert not f(x)``,
``assert math.isclose(f(x), 2.5, rel_tol=..)``, arguments being literals;
a constant expression of literals (``10**9 + 7``, ``[0] * 5``) counts as its
value (``code/constants.py``: folded here, bounded).
Any other assert (it computes with the program's objects, inside the
program's interpreter) can only run there, where the program can forge its
outcome; such a test set is *weak* and runs only where the caller allows it.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from rlax.plugins.rewards.code.constants import NotConstant, fold

__all__ = ["CallTest", "StdioTest", "TestPlan", "plan_tests", "read_tests"]


@dataclasses.dataclass(frozen=True)
class CallTest:
    """``function(*args, **kwargs)`` must satisfy ``check`` against ``expected``."""

    function: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    expected: Any
    check: str = "eq"
    tol: tuple[float, float] = (1e-9, 0.0)


@dataclasses.dataclass(frozen=True)
class StdioTest:
    """The program run as ``__main__`` on ``stdin`` must print ``expected``."""

    stdin: str
    expected: str


@dataclasses.dataclass(frozen=True)
class TestPlan:
    """The tests of one task, split into what the sandbox gets and what it must not.

    Attributes:
      mode: ``"call"``, ``"stdio"`` or ``"asserts"`` (weak: judged inside).
      tests: the tests, expected outputs included (trusted side only).
      setup: code run after the solution, before the calls (call and asserts).
      asserts: the raw statements of a weak plan.
    """

    mode: str
    tests: tuple[CallTest | StdioTest, ...] = ()
    setup: str = ""
    asserts: tuple[str, ...] = ()

    @property
    def weak(self) -> bool:
        return self.mode == "asserts"


def read_tests(answer: Any) -> dict[str, Any]:
    """The test spec from a task's ``answer`` field, normalised to one dict shape.

    Raises:
      ValueError: the answer is not one of the documented shapes.
    """
    if isinstance(answer, str):
        return {"asserts": [answer]}
    if isinstance(answer, list | tuple) and all(isinstance(t, str) for t in answer):
        return {"asserts": list(answer)}
    if isinstance(answer, dict):
        if "calls" in answer:
            return {"calls": list(answer["calls"])}
        if "fn_name" in answer and "inputs" in answer and "outputs" in answer:
            calls = [
                {"function": str(answer["fn_name"]), "args": list(i), "expected": o}
                for i, o in zip(answer["inputs"], answer["outputs"], strict=True)
            ]
            return {"calls": calls}
        if "stdio" in answer:
            return {"stdio": [[str(i), str(o)] for i, o in answer["stdio"]]}
        if "inputs" in answer and "outputs" in answer:
            return {
                "stdio": [[str(i), str(o)] for i, o in zip(answer["inputs"], answer["outputs"])]
            }
        tests = answer.get("asserts", answer.get("tests"))
        if tests is not None:
            spec = read_tests(tests)
            return spec | ({"setup": str(answer["setup"])} if answer.get("setup") else {})
    raise ValueError(
        f"code reward: cannot read tests from an answer of type {type(answer).__name__} "
        "(valid: assert strings, {'asserts': [..]}, {'calls': [..]}, {'stdio': [..]}, "
        "{'inputs': [..], 'outputs': [..]}, {'fn_name', 'inputs', 'outputs'})"
    )


def _call_of(node: ast.expr) -> tuple[str, tuple[Any, ...], dict[str, Any]] | None:
    """``f(literal, ..., k=literal)`` as (name, args, kwargs), else None."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return None
    try:
        args = tuple(fold(a) for a in node.args)
        kwargs = {k.arg: fold(k.value) for k in node.keywords if k.arg}
    except NotConstant:
        return None
    if len(kwargs) != len(node.keywords) or any(isinstance(a, ast.Starred) for a in node.args):
        return None
    return node.func.id, args, kwargs


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, fold(node)
    except NotConstant:
        return False, None


def _isclose(test: ast.expr) -> CallTest | None:
    if not (isinstance(test, ast.Call) and len(test.args) == 2):
        return None
    func = test.func
    if not (isinstance(func, ast.Attribute) and func.attr == "isclose"):
        return None
    if not (isinstance(func.value, ast.Name) and func.value.id == "math"):
        return None
    call, (ok, expected) = _call_of(test.args[0]), _literal(test.args[1])
    tol = {k.arg: _literal(k.value) for k in test.keywords}
    if call is None or not ok or any(not good for good, _ in tol.values()):
        return None
    if any(type(value) not in (int, float) for _, value in tol.values()):
        return None  # a tolerance is a real number
    rel, abs_ = tol.get("rel_tol", (True, 1e-9))[1], tol.get("abs_tol", (True, 0.0))[1]
    return CallTest(*call, expected, "isclose", (float(rel), float(abs_)))


def _convert(test: ast.expr) -> CallTest | None:
    """A call test equivalent to ``assert test``, or None."""
    if (call := _call_of(test)) is not None:
        return CallTest(*call, True, "truthy")
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        call = _call_of(test.operand)
        return None if call is None else CallTest(*call, False, "falsy")
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, right, op = test.left, test.comparators[0], test.ops[0]
        if _call_of(left) is None:
            left, right = right, left
        call, (ok, expected) = _call_of(left), _literal(right)
        if call is not None and ok and isinstance(op, ast.Eq):
            return CallTest(*call, expected)
        singleton = expected is None or type(expected) is bool
        if call is not None and ok and isinstance(op, ast.Is) and singleton:
            return CallTest(*call, expected, "is")
    return _isclose(test)


def _convert_all(asserts: list[str]) -> list[CallTest] | None:
    converted = []
    for source in asserts:
        try:
            statements = ast.parse(source).body
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return None
        for statement in statements:
            if not isinstance(statement, ast.Assert) or (test := _convert(statement.test)) is None:
                return None
            converted.append(test)
    return converted


def plan_tests(spec: dict[str, Any]) -> TestPlan:
    """The :class:`TestPlan` of a spec from :func:`read_tests`."""
    setup = str(spec.get("setup") or "")
    if "stdio" in spec:
        return TestPlan("stdio", tuple(StdioTest(str(i), str(o)) for i, o in spec["stdio"]))
    if "calls" in spec:
        tests = tuple(
            CallTest(
                str(c["function"]),
                tuple(c.get("args", ())),
                dict(c.get("kwargs", {})),
                c["expected"],
            )
            for c in spec["calls"]
        )
        return TestPlan("call", tests, setup)
    converted = _convert_all(list(spec["asserts"]))
    if converted:
        return TestPlan("call", tuple(converted), setup)
    return TestPlan("asserts", setup=setup, asserts=tuple(spec["asserts"]))
