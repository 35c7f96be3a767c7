"""Exact-match reward for integer answers (the arithmetic task's verifier)."""

from __future__ import annotations

import re

from rlax.core import hookimpl
from rlax.core.types import Prompt, RewardResult

_INTEGER = re.compile(r"[-+]?\d+")


class ArithmeticReward:
    """1.0 if the completion is exactly the integer answer, else 0.0.

    Leading and trailing whitespace is ignored; anything else (extra digits,
    text after the number) is wrong, so the policy cannot be rewarded for
    padding its answer.
    """

    def score(self, prompt: Prompt, completion_text: str) -> RewardResult:
        text = completion_text.strip()
        if not _INTEGER.fullmatch(text):
            return RewardResult(0.0, f"not an integer: {text[:20]!r}")
        if int(text) == int(prompt.answer):
            return RewardResult(1.0, "correct")
        return RewardResult(0.0, f"wrong: {text} != {prompt.answer}")


@hookimpl
def rlax_register_rewards():
    return {"arithmetic": ArithmeticReward}
