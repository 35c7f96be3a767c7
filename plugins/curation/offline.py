"""The offline curation contract shared by the offline filters.

An offline filter has ``offline(prompts) -> Curated``: it receives the whole
dataset as :class:`~rlax.core.types.Prompt` values (before training) and
returns the prompts it keeps, in order, and the ones it drops, each with the
reason, so ``rlax curate`` can write the new dataset and a report of what was
dropped and why.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from rlax.core.types import Prompt

__all__ = ["Curated", "Dropped", "normalized_words"]


@dataclasses.dataclass(frozen=True)
class Dropped:
    """A prompt an offline filter removed, and why."""

    prompt: Prompt
    reason: str


@dataclasses.dataclass(frozen=True)
class Curated:
    """The outcome of one offline filter."""

    kept: list[Prompt]
    dropped: list[Dropped]

    @classmethod
    def split(cls, prompts: Sequence[Prompt], reasons: Sequence[str | None]) -> Curated:
        """Keeps ``prompts[i]`` where ``reasons[i]`` is None; drops it with the reason otherwise."""
        kept = [p for p, r in zip(prompts, reasons) if r is None]
        dropped = [Dropped(p, r) for p, r in zip(prompts, reasons) if r is not None]
        return cls(kept, dropped)


def normalized_words(text: str) -> list[str]:
    """Lower-cased words and numbers: punctuation, case and spacing do not matter."""
    return re.findall(r"[a-z0-9]+", text.lower())
