"""DAPO's soft overlong punishment, as a reward (alone or added to another reward).

.. math::

   R_{length}(y) = \\begin{cases}
     0, & |y| \\le L_{max} - L_{cache} \\\\
     \\frac{(L_{max} - L_{cache}) - |y|}{L_{cache}}, & L_{max} - L_{cache} < |y| \\le L_{max} \\\\
     -1, & |y| > L_{max}
   \\end{cases}

The penalty grows linearly over the last ``cache_length`` units of the
budget, so the policy learns to stop before truncation instead of being
punished only by the (noisy) task reward of a cut-off answer.

A reward plugin sees the completion's text, so length is counted in
characters of that text (the stop token excluded); with the character
tokenizer of the toy tasks that is the token count. With ``base`` set, the
score is ``base + R_length`` and the reason says both.

Reference: Yu et al., 2025, DAPO, https://arxiv.org/abs/2503.14476 (eq. 13,
"Soft Overlong Punishment").
"""

from __future__ import annotations

from typing import Annotated, Any

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, checked_by, ordered
from rlax.core.types import Prompt, RewardResult


def overlong_penalty(length: int, max_length: int, cache_length: int) -> float:
    """R_length of a completion of ``length`` units (see the module docstring)."""
    expected = max_length - cache_length
    if length <= expected:
        return 0.0
    if length <= max_length:
        return (expected - length) / cache_length
    return -1.0


@checked_by(ordered("cache_length", "max_length"))
class OverlongPenalty:
    """Soft overlong punishment, optionally added to a ``base`` reward.

    Args:
      max_length: L_max, the generation budget (in characters of text).
      cache_length: L_cache, the width of the soft-penalty zone before L_max.
      base: a reward whose score the penalty is added to (None: penalty only).
    """

    def __init__(
        self,
        *,
        max_length: Annotated[int, AtLeast(1)],
        cache_length: Annotated[int, AtLeast(1)],
        base: Any = None,
    ):
        if not 0 < cache_length <= max_length:
            raise ValueError(
                "overlong: need 0 < cache_length <= max_length, "
                f"got cache_length={cache_length}, max_length={max_length}"
            )
        self.max_length = max_length
        self.cache_length = cache_length
        self.base = base

    def score(self, prompt: Prompt, completion_text: str) -> RewardResult:
        length = len(completion_text)
        penalty = overlong_penalty(length, self.max_length, self.cache_length)
        reason = f"length {length}: overlong penalty {penalty:g}"
        if self.base is None:
            return RewardResult(penalty, reason)
        result = self.base.score(prompt, completion_text)
        if isinstance(result, RewardResult):
            return RewardResult(result.score + penalty, f"{result.reason}; {reason}")
        return RewardResult(float(result) + penalty, reason)


@hookimpl
def rlax_register_rewards():
    return {"overlong": OverlongPenalty}
