"""The ``format`` reward: does the completion follow the reasoning/answer layout?

By default the layout is ``<think>...</think>`` followed by
``<answer>...</answer>`` and nothing else (whitespace aside), the template of
DeepSeek-R1-style training; any regular expression can replace it.
"""

from __future__ import annotations

import re

from rlax.core import hookimpl
from rlax.core.types import Prompt, RewardResult

__all__ = ["FormatReward"]


class FormatReward:
    """``score`` if the completion matches the layout, ``partial_score`` if it
    holds every tag pair but also other text, else 0.

    Args:
      reasoning_tag: the tag around the reasoning (``think``); "" for none.
      answer_tag: the tag around the answer (``answer``).
      pattern: a regular expression the whole completion must match instead
        of the tag layout (``re.DOTALL``).
      score: the score of a well-formed completion.
      partial_score: the score when every tag pair is present but the text
        has more around them (or the tags are out of order).
    """

    def __init__(
        self,
        *,
        reasoning_tag: str = "think",
        answer_tag: str = "answer",
        pattern: str = "",
        score: float = 1.0,
        partial_score: float = 0.0,
    ) -> None:
        tags = [t for t in (reasoning_tag, answer_tag) if t]
        if not tags and not pattern:
            raise ValueError("rewards.format: give a pattern or at least one tag")
        for tag in tags:
            if not re.fullmatch(r"[\w-]+", tag):
                raise ValueError(f"rewards.format: tag {tag!r} must be a word")
        layout = r"\s*".join(rf"<{t}>(?!\s*</{t}>).+?</{t}>" for t in tags)
        self.pattern = re.compile(pattern or rf"\s*{layout}\s*", re.DOTALL)
        self._pairs = [re.compile(rf"<{t}>.*?</{t}>", re.DOTALL) for t in tags]
        self.score_value = score
        self.partial_score = partial_score

    def score(self, prompt: Prompt, completion_text: str) -> RewardResult:
        if self.pattern.fullmatch(completion_text):
            return RewardResult(self.score_value, "well formed")
        if self._pairs and all(p.search(completion_text) for p in self._pairs):
            return RewardResult(self.partial_score, "tags present, layout wrong")
        return RewardResult(0.0, "malformed")


@hookimpl
def rlax_register_rewards():
    return {"format": FormatReward}
