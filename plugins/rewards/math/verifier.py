"""The ``math`` reward: extract the final answer, compare it with the reference.

Extraction is :mod:`rlax.plugins.rewards.math.extraction` (last ``\\boxed``,
GSM8K ``####``, "the answer is", optionally the last number); equivalence is
:mod:`rlax.plugins.rewards.math.equivalence` (exact numbers, text for words,
math-verify for the rest, under a deadline). A reference answer written as a
worked solution (a GSM8K ``answer`` field ending in ``#### 72``) is reduced
to its final answer the same way, so a dataset's answer column can be used
as it is.
"""

from __future__ import annotations

from typing import Annotated, Any

from rlax.core import hookimpl
from rlax.core.constraints import Positive
from rlax.core.types import Prompt, RewardResult
from rlax.plugins.rewards.math.deadline import on_main_thread, within
from rlax.plugins.rewards.math.equivalence import equivalent, load_math_verify
from rlax.plugins.rewards.math.extraction import extract_answer

__all__ = ["MathReward", "reference_answer"]

RESERVE_S = 0.1  # the alarm fires this much (at most a tenth) before timeout_s


def reference_answer(answer: Any) -> str:
    """The final answer of a reference: its ``####`` / boxed part if it has one."""
    text = str(answer)
    if "####" in text or "\\boxed" in text or "\\fbox" in text:
        found = extract_answer(text, fallback_last_number=False)
        if found is not None:
            return found.answer
    return text.strip()


class MathReward:
    """``correct_score`` if the completion's final answer equals ``prompt.answer``.

    Args:
      timeout_s: deadline of one whole call, extraction included (see
        :func:`rlax.plugins.rewards.math.deadline.deadline`): past it the
        completion scores ``wrong_score`` with a reason starting "timeout".
        The alarm is set ``RESERVE`` earlier, so that the call, unwinding
        included, returns within ``timeout_s``.
      fallback_last_number: with no ``\\boxed`` / ``####`` / "the answer is",
        judge the last number in the completion (off: such a completion scores
        ``wrong_score`` with reason "no answer found").
      symbolic: compare non-numeric answers with math-verify.
      correct_score: the score of a correct answer.
      wrong_score: the score of a wrong or missing answer.
    """

    def __init__(
        self,
        *,
        timeout_s: Annotated[float, Positive] = 5.0,
        fallback_last_number: bool = True,
        symbolic: bool = True,
        correct_score: float = 1.0,
        wrong_score: float = 0.0,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"rewards.math: timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.fallback_last_number = fallback_last_number
        self.symbolic = symbolic
        self.correct_score = correct_score
        self.wrong_score = wrong_score

    def score(self, prompt: Prompt, completion_text: str) -> RewardResult:
        budget = self.timeout_s - min(RESERVE_S, self.timeout_s / 10)
        if self.symbolic and on_main_thread():
            load_math_verify()  # once per process, outside the deadline
        done, result = within(budget, self._score, prompt, completion_text, budget)
        return result if done else RewardResult(self.wrong_score, f"timeout: scoring {result}")

    def _score(self, prompt: Prompt, completion_text: str, budget: float) -> RewardResult:
        found = extract_answer(completion_text, fallback_last_number=self.fallback_last_number)
        if found is None:
            return RewardResult(self.wrong_score, "no answer found")
        gold = reference_answer(prompt.answer)
        verdict = equivalent(found.answer, gold, timeout_s=budget, symbolic=self.symbolic)
        shown = f"{found.answer[:40]!r} ({found.method})"
        if verdict.equal:
            return RewardResult(self.correct_score, f"correct: {shown} [{verdict.reason}]")
        return RewardResult(self.wrong_score, f"wrong: {shown} != {gold[:40]!r} [{verdict.reason}]")


@hookimpl
def rlax_register_rewards():
    return {"math": MathReward}
