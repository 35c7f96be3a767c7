"""The offline curation contract shared by the offline filters.

An offline filter has ``offline(prompts) -> Curated``
(:class:`rlax.core.contracts.OfflineFilter`): it receives the whole dataset
as :class:`~rlax.core.types.Prompt` values (before training) and returns the
prompts it keeps, in order, and the ones it drops, each with the reason, so
``rlax curate`` can write the new dataset and a report of what was dropped
and why. :class:`Curated` and :class:`Dropped` are the core's value types
(:mod:`rlax.core.types`), re-exported here for the filters.
"""

from __future__ import annotations

import re

from rlax.core.types import Curated, Dropped

__all__ = ["Curated", "Dropped", "normalized_words"]


def normalized_words(text: str) -> list[str]:
    """Lower-cased words and numbers: punctuation, case and spacing do not matter."""
    return re.findall(r"[a-z0-9]+", text.lower())
