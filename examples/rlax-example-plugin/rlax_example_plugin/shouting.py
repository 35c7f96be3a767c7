"""The ``shouting`` reward: the fraction of a completion's letters in upper case.

A complete rlax plugin: a reward class and the hook that registers it. The
entry point ``shouting`` in this package's ``pyproject.toml`` points here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, check_arguments

if TYPE_CHECKING:
    from rlax.core.types import Prompt


class ShoutingReward:
    """Scores a completion by how much it shouts.

    ``score = uppercase letters / letters``, and 0.0 when the completion has
    fewer than ``min_length`` letters. For example ``"HELLO world"`` has 10
    letters, 5 of them upper case: 0.5.

    Args:
      min_length: the fewest letters a completion needs to score above 0.
    """

    def __init__(self, *, min_length: Annotated[int, AtLeast(0)] = 1) -> None:
        # rlax checks the annotation on the bound value before any role starts;
        # check_arguments holds code that builds the reward without gin to it too.
        check_arguments(ShoutingReward.__init__, locals(), owner="rewards.shouting")
        self.min_length = min_length

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """The fraction of letters in upper case (the prompt is not used)."""
        letters = [ch for ch in completion_text if ch.isalpha()]
        if not letters or len(letters) < self.min_length:
            return 0.0
        return sum(ch.isupper() for ch in letters) / len(letters)


@hookimpl
def rlax_register_rewards() -> dict[str, type[ShoutingReward]]:
    """Registers the reward as ``rewards.shouting`` (gin: ``@rewards.shouting()``)."""
    return {"shouting": ShoutingReward}
