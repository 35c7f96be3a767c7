"""The verdict, made on the trusted side from what the sandboxed program sent.

The program's outputs channel (fd 3) is read line by line. A line counts
only if it is a JSON object ``{"i": index, ...}`` whose index names one of
the plan's tests and that index has not been seen before; the first word on
each test is final. Call outputs are decoded by ``sandbox_values.decode``
(exact built-in types) and compared in this process with the expected value,
which never left it; stdin/stdout outputs are compared line by line, trailing
whitespace ignored. ``passed`` counts the tests that matched and ``total`` is
the plan's own number of tests: nothing the program reports about itself
(totals, "passed", a verdict) enters either number.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlax.plugins.rewards.code_tests import CallTest, StdioTest, TestPlan
from rlax.plugins.rewards.sandbox_values import WireError, decode, matches, parse_line

__all__ = ["Verdict", "judge", "judge_weak"]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Tests passed out of ``total``; ``answered`` tests got any output at all."""

    passed: int
    total: int
    answered: int
    failure: str = ""


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _check(test: CallTest | StdioTest, message: dict[str, Any]) -> str:
    """'' if ``message`` satisfies ``test``, else why not."""
    if "error" in message:
        error = message["error"]
        return f"raised {error[:200]}" if type(error) is str else "raised"
    if isinstance(test, StdioTest):
        out = message.get("stdout")
        if type(out) is not str:
            return "no stdout in the message"
        return "" if _lines(out) == _lines(test.expected) else "wrong output"
    if "value" not in message:
        return "no value in the message"
    try:
        value = decode(message["value"])
    except (WireError, RecursionError) as exc:
        return f"malformed value ({str(exc)[:100]})"
    return "" if matches(value, test.expected, test.check, test.tol) else "wrong value"


def judge(plan: TestPlan, channel: str) -> Verdict:
    """The verdict of a call or stdio plan over the program's outputs ``channel``."""
    tests = plan.tests
    results: dict[int, str] = {}
    for line in channel.splitlines():
        try:
            message = parse_line(line)
        except WireError:
            continue
        if type(message) is not dict:
            continue
        index = message.get("i")
        if type(index) is not int or not 0 <= index < len(tests) or index in results:
            continue
        results[index] = _check(tests[index], message)
    passed = sum(1 for why in results.values() if not why)
    failures = [f"test {i}: {results.get(i, 'no output')}" for i in range(len(tests))]
    first = next((f for i, f in enumerate(failures) if results.get(i, "x")), "")
    return Verdict(passed, len(tests), len(results), first)


def judge_weak(plan: TestPlan, channel: str, nonce: str) -> Verdict | None:
    """The harness's own verdict of a weak (asserts) plan: the last line with the nonce."""
    found = None
    for line in channel.splitlines():
        try:
            message = parse_line(line)
        except WireError:
            continue
        if type(message) is dict and message.get("nonce") == nonce:
            found = message
    if found is None:
        return None
    passed, failure = found.get("passed"), found.get("failure", "")
    total = len(plan.asserts)
    if type(passed) is not int or not 0 <= passed <= total:
        return None
    return Verdict(passed, total, total, str(failure))
