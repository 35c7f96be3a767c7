"""Adversarial inputs for the math verifier, and the slowest of them.

Each is a completion a policy could write to stall the verifier: expressions
whose evaluation runs away (power towers, factorials of huge numbers, huge
binomials), texts that make a naive extractor quadratic (thousands of
unclosed ``\\boxed{``, runs of ``$``), and long or deeply nested answers.
Every one is wrong against its reference, and must be scored so in-process
within the verifier's own ``timeout_s`` (``test_math_adversarial.py`` measures
each); ``benchmarks/rewards.py`` reports the slowest via
:func:`slowest_adversarial`. Import it with this folder on ``sys.path``.
"""

from __future__ import annotations

import time

import numpy as np

from rlax.core.types import Prompt
from rlax.plugins.rewards.math.verifier import MathReward

__all__ = ["ADVERSARIAL", "NOTATIONS", "score_adversarial", "slowest_adversarial"]

_NEST = 40
_LONG = 100_000

# (name, completion, reference answer)
ADVERSARIAL: list[tuple[str, str, str]] = [
    # The five that ran with no deadline (issue 16): the timeout was an Exception.
    ("tower 9^9^9^9", r"\boxed{{9}^{{9}^{{9}^{9}}}}", "5"),
    ("tower 10^10^10", r"\boxed{{10}^{{10}^{10}}}", "5"),
    ("factorial (10^10)!", r"\boxed{(10^{10})!}", "5"),
    ("factorial (99999999)!", r"\boxed{(99999999)!}", "5"),
    ("power 10^(999*999*999)", r"\boxed{10^{999 \cdot 999 \cdot 999}}", "5"),
    # Variants around the pre-filter: only the deadline stops these.
    ("factorial of a factorial", r"\boxed{(999!)!}", "5"),
    ("tower in parentheses", r"\boxed{3^{(3^{(3^{3})})}}", "5"),
    ("power of a power", r"\boxed{(10^{100})^{(10^{100})}}", "5"),
    ("huge binomial", r"\boxed{\binom{10^{9}}{5 \cdot 10^{8}}}", "5"),
    ("power 3^3486784401", r"\boxed{3^{3486784401}}", "5"),
    ("double factorial", r"\boxed{(999)!!!!}", "5"),
    ("e-notation overflow", r"\boxed{1e999999999}", "5"),
    ("nested radicals", r"\boxed{" + r"\sqrt{" * _NEST + "2" + "}" * _NEST + "}", "5"),
    ("nested fractions", r"\boxed{" + r"\frac{1}{1+" * 30 + "x" + "}" * 30 + "}", "5"),
    ("polynomial power", r"\boxed{(x+y+z+1)^{99}}", r"(x+y+z)^{99}"),
    ("long product", r"\boxed{" + r"\cdot ".join(["(x+1)"] * 30) + "}", "x^{30}"),
    ("answer at the length cap", r"\boxed{" + "x+" * 199 + "}", "x"),
    # Extraction: quadratic in a naive scanner, linear here.
    ("30 k chars of unclosed boxes", r"\boxed{" * (30_000 // 7), "1"),
    ("100 k chars of unclosed boxes", r"\boxed{" * (_LONG // 7), "1"),
    ("100 k chars of boxes after a box", r"\boxed{1}" + r"\boxed{" * (_LONG // 7), "2"),
    ("100 k chars of $", "$" * _LONG, "1"),
    ("100 k chars of $ after a marker", "The answer is " + "$" * _LONG + "x", "1"),
    ("100 k chars of \\(", r"\(" * (_LONG // 2), "1"),
    ("100 k open braces", "{" * _LONG + "1", "2"),
    ("100 k close braces", r"\boxed{" + "}" * _LONG, "2"),
    ("100 k digits", "9" * _LONG, "1"),
    ("100 k thousands groups", "1" + ",000" * (_LONG // 4), "1"),
    ("100 k chars in one box", r"\boxed{" + "1" * _LONG + "}", "1"),
    ("100 k of ####", "####" * (_LONG // 4), "1"),
    ("100 k of 'the answer'", "the answer " * (_LONG // 11), "1"),
    ("100 k of fractions", r"\frac{1}{" * (_LONG // 9), "2"),
    ("100 k of spaces then the answer is", " " * _LONG + "the answer is 2", "1"),
]


# 100 k characters aimed at the choice, repeating-decimal and base-subscript rules:
# each must be judged on its own (no "timeout" reason), so no step is quadratic.
NOTATIONS = [
    ("choice, then spaces", "Answer: B" + " " * _LONG + "x", "B"),
    ("Answer: repeated", "Answer:" * (_LONG // 7), "B"),
    ("Answer: ( repeated", "Answer: (" * (_LONG // 9), "B"),
    ("labels repeated", "Answer: " + "(B) " * (_LONG // 4), "C"),
    ("spaces before a letter", "Answer:" + " " * _LONG + "B x", "B"),
    ("decorations", "Answer: " + "**$" * (_LONG // 3) + "B x", "B"),
    ("a long decimal, then (", "0." + "1" * _LONG + "(", "1"),
    ("decimal points", ". " * (_LONG // 2), "1"),
    ("open overlines", r"\overline{" * (_LONG // 10), "1"),
    ("dots", r"0.\dot{1}" + "1" * _LONG, "1"),
    ("subscripts", "_8" * (_LONG // 2), "1"),
    ("open subscripts", "1_{" * (_LONG // 3), "2"),
    ("digits, then a subscript", "1" * _LONG + "_8", "1"),
    ("imaginary units", "i" * _LONG, "1"),
    ("an answer of imaginary units", r"\boxed{" + "i+" * 190 + "}", "1"),
    ("a subscripted numeral at the cap", r"\boxed{" + "1" * 390 + "_2}", "1"),
    ("a repeating block at the cap", r"\boxed{0.\overline{" + "3" * 380 + "}}", "1"),
]


def _prompt(answer: str) -> Prompt:
    return Prompt(id="adversarial", text="q", tokens=np.zeros(1, np.int32), answer=answer)


def score_adversarial(timeout_s: float) -> list[tuple[str, float, float, str]]:
    """Scores every adversarial input in this process.

    Returns:
      ``(name, score, seconds, reason)`` per input, in order.
    """
    reward = MathReward(timeout_s=timeout_s)
    reward.score(_prompt("1"), r"\boxed{\sqrt{2}}")  # imports outside the timing
    rows = []
    for name, completion, gold in [*ADVERSARIAL, *NOTATIONS]:
        start = time.perf_counter()
        result = reward.score(_prompt(gold), completion)
        rows.append((name, result.score, time.perf_counter() - start, result.reason))
    return rows


def slowest_adversarial(timeout_s: float = 5.0) -> tuple[str, float]:
    """The adversarial input that took longest to score in-process, and its seconds."""
    name, _, seconds, _ = max(score_adversarial(timeout_s), key=lambda row: row[2])
    return name, seconds
