"""``curation.length``: keep prompts whose length lies in a range (offline)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, OneOf, checked_by, ordered
from rlax.core.types import Prompt
from rlax.plugins.curation.offline import Curated

__all__ = ["LengthFilter"]


@checked_by(ordered("min_length", "max_length", zero_is_unbounded=True))
class LengthFilter:
    """Drops prompts shorter than ``min_length`` or longer than ``max_length``.

    Args:
      min_length: the shortest prompt kept.
      max_length: the longest prompt kept (0: no limit).
      unit: ``"chars"``, ``"words"`` or ``"tokens"`` (the prompt's token ids).
    """

    def __init__(
        self,
        *,
        min_length: Annotated[int, AtLeast(0)] = 0,
        max_length: Annotated[int, AtLeast(0, means="0: no limit")] = 0,
        unit: Annotated[str, OneOf("chars", "words", "tokens")] = "chars",
    ) -> None:
        if unit not in ("chars", "words", "tokens"):
            raise ValueError(f"curation.length: unit must be chars, words or tokens, got {unit!r}")
        if min_length < 0 or max_length < 0 or (max_length and max_length < min_length):
            raise ValueError(
                f"curation.length: need 0 <= min_length <= max_length (0: no limit), "
                f"got {min_length}, {max_length}"
            )
        self.min_length, self.max_length, self.unit = min_length, max_length, unit

    def measure(self, prompt: Prompt) -> int:
        if self.unit == "tokens":
            return len(prompt.tokens)
        return len(prompt.text.split()) if self.unit == "words" else len(prompt.text)

    def offline(self, prompts: Sequence[Prompt]) -> Curated:
        reasons: list[str | None] = []
        for prompt in prompts:
            n = self.measure(prompt)
            if n < self.min_length:
                reasons.append(f"too short: {n} {self.unit} < {self.min_length}")
            elif self.max_length and n > self.max_length:
                reasons.append(f"too long: {n} {self.unit} > {self.max_length}")
            else:
                reasons.append(None)
        return Curated.split(prompts, reasons)


@hookimpl
def rlax_register_curation_filters():
    return {"length": LengthFilter}
