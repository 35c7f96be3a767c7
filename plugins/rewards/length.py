"""The ``length`` reward: a penalty for completions outside a length range.

.. math::

   R(y) = -\\min\\left(1, \\frac{\\max(0, L_{min} - |y|, |y| - L_{max})}{W}\\right)

zero inside ``[min_length, max_length]``, falling linearly to -1 over
``width`` units outside it. Length counts characters or words of the text.
For DAPO's one-sided soft overlong punishment use ``rewards.overlong``; this
one also discourages answers that are too short (e.g. skipping the reasoning).
"""

from __future__ import annotations

from typing import Annotated

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, OneOf, checked_by, ordered
from rlax.core.types import Prompt, RewardResult

__all__ = ["LengthReward", "length_penalty"]


def length_penalty(length: int, min_length: int, max_length: int, width: int) -> float:
    """R of a completion of ``length`` units (see the module docstring)."""
    excess = max(0, min_length - length, length - max_length)
    return -min(1.0, excess / width)


@checked_by(ordered("min_length", "max_length"))
class LengthReward:
    """Linear penalty outside ``[min_length, max_length]``.

    Args:
      min_length: shortest length without penalty.
      max_length: longest length without penalty.
      width: units outside the range over which the penalty reaches -1.
      unit: ``"chars"`` or ``"words"``.
    """

    def __init__(
        self,
        *,
        min_length: Annotated[int, AtLeast(0)] = 0,
        max_length: Annotated[int, AtLeast(0)],
        width: Annotated[int, AtLeast(1)] = 100,
        unit: Annotated[str, OneOf("chars", "words")] = "chars",
    ) -> None:
        if not 0 <= min_length <= max_length:
            raise ValueError(
                f"rewards.length: need 0 <= min_length <= max_length, got {min_length}, "
                f"{max_length}"
            )
        if width <= 0:
            raise ValueError(f"rewards.length: width must be > 0, got {width}")
        if unit not in ("chars", "words"):
            raise ValueError(f"rewards.length: unit must be 'chars' or 'words', got {unit!r}")
        self.min_length, self.max_length, self.width, self.unit = (
            min_length,
            max_length,
            width,
            unit,
        )

    def score(self, prompt: Prompt, completion_text: str) -> RewardResult:
        text = completion_text
        length = len(text.split()) if self.unit == "words" else len(text)
        value = length_penalty(length, self.min_length, self.max_length, self.width)
        return RewardResult(value, f"{length} {self.unit}")


@hookimpl
def rlax_register_rewards():
    return {"length": LengthReward}
