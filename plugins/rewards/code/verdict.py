"""The verdict, made on the trusted side from what the sandboxed program sent.

The program's outputs channel (fd 3) is read line by line. A line counts
only if it is a JSON object ``{"i": index, ...}`` whose index names one of
the plan's tests and that index has not been seen before; the first word on
each test is final. Call outputs are parsed by ``values.parse_line``
and compared in this process with the expected value, which never left it,
on the wire form itself (``code/equality.py``: exact built-in types,
nothing rebuilt); stdin/stdout outputs are compared line by line, trailing
whitespace ignored. ``passed`` counts the tests that matched and ``total`` is
the plan's own number of tests: nothing the program reports about itself
(totals, "passed", a verdict) enters either number.

Reading is bounded: at most one line per test plus ``EXTRA_LINES`` (the
channel itself is at most 4 MiB), each parsed once in time linear in its
length (a line with more ``[`` and ``{`` than a right answer could hold is
not parsed at all), each comparison bounded by the expected value's size, and the call's
deadline checked between lines and during comparisons.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from rlax.plugins.rewards.code.equality import Late, bracket_bound, matches
from rlax.plugins.rewards.code.plan import CallTest, StdioTest, TestPlan
from rlax.plugins.rewards.code.values import WireError, fields, parse_line

__all__ = ["Verdict", "judge", "judge_weak"]

EXTRA_LINES = 64  # lines read past one per test: the harness writes no others
_LINE = re.compile(r"\S[^\n]*")  # a line from its first non-space (blank lines cost nothing)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Tests passed out of ``total``; ``answered`` tests got any output at all;
    ``late`` when the call's deadline passed before every line was judged."""

    passed: int
    total: int
    answered: int
    failure: str = ""
    late: bool = False


def _lines(text: str) -> list[str]:
    return text.strip().splitlines()


def _same_output(out: str, expected: str) -> bool:
    """Line by line, trailing whitespace ignored; the line counts are compared first."""
    sent, wanted = _lines(out), _lines(expected)
    return len(sent) == len(wanted) and all(
        a.rstrip() == b.rstrip() for a, b in zip(sent, wanted, strict=True)
    )


def _check(test: CallTest | StdioTest, message: dict[str, Any], deadline: float | None) -> str:
    """'' if ``message`` satisfies ``test``, else why not."""
    if "error" in message:
        error = message["error"]
        return f"raised {error[:200]}" if type(error) is str else "raised"
    if isinstance(test, StdioTest):
        out = message.get("stdout")
        if type(out) is not str:
            return "no stdout in the message"
        return "" if _same_output(out, test.expected) else "wrong output"
    if "value" not in message:
        return "no value in the message"
    try:
        same = matches(message["value"], test.expected, test.check, test.tol, deadline)
    except (WireError, RecursionError) as exc:
        return f"malformed value ({str(exc)[:100]})"
    return "" if same else "wrong value"


def _bracket_allowance(tests: tuple[CallTest | StdioTest, ...]) -> int:
    """The most ``[`` and ``{`` a line answering any of ``tests`` rightly holds."""
    bounds = [
        t.expected.count("[") + t.expected.count("{") + 256
        if isinstance(t, StdioTest)
        else bracket_bound(t.expected)
        for t in tests
    ]
    return max(bounds, default=256)


def judge(plan: TestPlan, channel: str, deadline: float | None = None) -> Verdict:
    """The verdict of a call or stdio plan over the program's outputs ``channel``.

    Reads at most one line per test plus ``EXTRA_LINES``, and stops at
    ``deadline`` (a ``time.monotonic()``; the verdict is then ``late``).
    """
    tests = plan.tests
    results: dict[int, str] = {}
    late, allowed = False, _bracket_allowance(tests)
    for number, match in enumerate(_LINE.finditer(channel)):
        if number >= len(tests) + EXTRA_LINES or len(results) == len(tests):
            break
        if deadline is not None and time.monotonic() > deadline:
            late = True
            break
        line = match.group()
        if line.count("[") + line.count("{") > allowed:
            continue  # more containers than any right answer has: not parsed
        try:
            message = fields(parse_line(line))
        except WireError:
            continue
        index = None if message is None else message.get("i")
        if type(index) is not int or not 0 <= index < len(tests) or index in results:
            continue
        try:
            results[index] = _check(tests[index], message, deadline)  # type: ignore[arg-type]
        except Late:
            late = True
            break
    passed = sum(1 for why in results.values() if not why)
    failures = [f"test {i}: {results.get(i, 'no output')}" for i in range(len(tests))]
    first = next((f for i, f in enumerate(failures) if results.get(i, "x")), "")
    return Verdict(passed, len(tests), len(results), first, late)


def judge_weak(plan: TestPlan, channel: str, nonce: str) -> Verdict | None:
    """The harness's own verdict of a weak (asserts) plan: the last line with the nonce
    (found from the end: the lines before it are never read)."""
    end = len(channel)
    for _ in range(8):
        at = channel.rfind(nonce, 0, end)
        if at < 0:
            return None
        start, stop = channel.rfind("\n", 0, at) + 1, channel.find("\n", at)
        end = start
        try:
            found = fields(parse_line(channel[start : len(channel) if stop < 0 else stop]))
        except WireError:
            continue
        if found is not None and found.get("nonce") == nonce:
            passed, failure = found.get("passed"), found.get("failure", "")
            total = len(plan.asserts)
            if type(passed) is not int or not 0 <= passed <= total:
                return None
            return Verdict(passed, total, total, str(failure)[:300])
    return None
