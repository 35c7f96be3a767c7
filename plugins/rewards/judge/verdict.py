"""What ``rewards.judge`` asks and how it reads the answer: the rubric and the verdict line.

The grader sees the rubric, a ``str.format`` template whose fields are
``{prompt}``, ``{completion}``, ``{answer}`` (the task's reference), ``{lo}``
and ``{hi}`` (the score's range); literal braces are doubled (``{{``). Its
answer must end with one line ``SCORE: <number>``, the number in
``[lo, hi]`` (an integer or a decimal, e.g. ``7``, ``-1``, ``8.5``); text
before that line is the grader's reasoning and is ignored. Anything else (no
such line, a line after it, a number out of range, two numbers) is a
:class:`JudgeError` of kind ``"verdict"``, never a score of 0.
"""

from __future__ import annotations

import json
import re
import string
from typing import Any

__all__ = [
    "DEFAULT_RUBRIC",
    "FIELDS",
    "JudgeError",
    "JudgeTimeout",
    "normalised",
    "parse_score",
    "render",
    "rubric_problem",
]

DEFAULT_RUBRIC = (
    "Grade a response to a task against the reference answer.\n\n"
    "Task:\n{prompt}\n\n"
    "Reference answer:\n{answer}\n\n"
    "Response:\n{completion}\n\n"
    "Think step by step about whether the response is correct and complete, then end with "
    "one line of the form\nSCORE: <number>\n"
    "where the number is from {lo} (wrong) to {hi} (fully correct). Write nothing after it."
)
FIELDS = frozenset({"prompt", "completion", "answer", "lo", "hi"})
_VERDICT = re.compile(r"SCORE:[ \t]*([-+]?(?:\d+(?:\.\d*)?|\.\d+))[ \t]*")


class JudgeError(Exception):
    """A judgement that did not happen; the reward pool counts it as a failed call.

    Attributes:
      kind: ``"verdict"`` (the grader's answer breaks the format or the range),
        ``"refused"`` (the server answered 4xx: not retried), ``"transport"``
        (connection errors, 5xx or 429 past the retries) or ``"timeout"``.
    """

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class JudgeTimeout(JudgeError, TimeoutError):
    """No answer within the score's deadline (``deadline_s``)."""

    def __init__(self, message: str):
        super().__init__("timeout", message)


def rubric_problem(rubric: str) -> str | None:
    """Why ``rubric`` is not a usable template (unknown or positional fields, no
    ``{completion}``, bad braces), or None."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(rubric) if f is not None]
    except ValueError as err:
        return f"not a format template ({err}); write literal braces as {{{{ and }}}}"
    unknown = sorted({f for f in fields if f not in FIELDS})
    if unknown:
        return f"unknown field {{{unknown[0]}}}; the fields are {', '.join(sorted(FIELDS))}"
    if "completion" not in fields:
        return "must show the completion: it has no {completion} field"
    return None


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def render(rubric: str, *, prompt: str, completion: str, answer: Any, lo: float, hi: float) -> str:
    """The rubric filled in (a non-text answer is shown as JSON, keys sorted)."""
    return rubric.format(
        prompt=prompt, completion=completion, answer=_as_text(answer), lo=_show(lo), hi=_show(hi)
    )


def _show(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def parse_score(text: str, lo: float, hi: float) -> float:
    """The number of the answer's final ``SCORE: <number>`` line, checked to be in ``[lo, hi]``.

    Raises:
      JudgeError: kind ``"verdict"``; the message quotes what the grader wrote.
    """
    lines = [line.strip() for line in text.strip().splitlines()]
    last = lines[-1] if lines else ""
    found = _VERDICT.fullmatch(last)
    if found is None:
        raise JudgeError(
            "verdict", f"the grader's answer does not end with 'SCORE: <number>': {last[-80:]!r}"
        )
    value = float(found.group(1))
    if not lo <= value <= hi:
        raise JudgeError(
            "verdict", f"the grader's score {found.group(1)} is outside [{_show(lo)}, {_show(hi)}]"
        )
    return value


def normalised(value: float, lo: float, hi: float) -> float:
    """``value`` in ``[lo, hi]`` mapped onto ``[0, 1]``: ``(value - lo) / (hi - lo)``."""
    return (value - lo) / (hi - lo)
