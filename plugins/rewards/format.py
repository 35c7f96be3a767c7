"""The ``format`` reward: does the completion follow the reasoning/answer layout?

By default the layout is ``<think>...</think>`` followed by
``<answer>...</answer>`` and nothing else (whitespace aside), the template of
DeepSeek-R1-style training; any regular expression can replace it.
"""

from __future__ import annotations

import re

from rlax.core import hookimpl
from rlax.core.constraints import check_rules, checked_by
from rlax.core.errors import BadSetting
from rlax.core.types import Prompt, RewardResult

__all__ = ["FormatReward"]


def _layout(
    *, reasoning_tag: str = "think", answer_tag: str = "answer", pattern: str = "", **_: object
) -> None:
    """BadSetting: neither a pattern nor a tag, a tag that is not a word, or a pattern
    that is not a regular expression."""
    if not all(isinstance(v, str) for v in (reasoning_tag, answer_tag, pattern)):
        return  # the annotations' checks say so
    if not (reasoning_tag or answer_tag or pattern):
        raise BadSetting("pattern", "give a pattern or at least one tag (all are empty)")
    for name, tag in (("reasoning_tag", reasoning_tag), ("answer_tag", answer_tag)):
        if tag and not re.fullmatch(r"[\w-]+", tag):
            raise BadSetting(name, f"a tag is a word (letters, digits, _ or -), got {tag!r}")
    try:
        re.compile(pattern, re.DOTALL)
    except re.error as err:
        raise BadSetting("pattern", f"not a regular expression ({err}): {pattern!r}") from None


@checked_by(_layout)
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
        check_rules(
            FormatReward,
            "rewards.format",
            reasoning_tag=reasoning_tag,
            answer_tag=answer_tag,
            pattern=pattern,
        )
        tags = [t for t in (reasoning_tag, answer_tag) if t]
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
