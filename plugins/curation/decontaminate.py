"""``curation.decontaminate``: drop training prompts that overlap evaluation sets (offline).

A training prompt is contaminated when it shares at least ``min_overlap``
word ``ngram``-grams with any evaluation text (normalized: case, punctuation
and spacing ignored), the n-gram overlap test of GPT-3 (Brown et al., 2020,
appendix C, https://arxiv.org/abs/2005.14165). An evaluation text shorter than
``ngram`` words counts as one n-gram, so short problems are still caught when
they appear verbatim.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast
from rlax.core.types import ConfigPath, Prompt
from rlax.plugins.curation.dedup import shingles
from rlax.plugins.curation.offline import Curated, normalized_words

__all__ = ["Decontaminate"]


class Decontaminate:
    """Drops prompts that share n-grams with evaluation texts.

    Args:
      eval_files: jsonl / parquet files of the evaluation sets.
      eval_fields: the columns of those files holding the texts to protect.
      eval_texts: evaluation texts given directly (in addition to the files).
      ngram: words per n-gram.
      min_overlap: shared n-grams that make a prompt contaminated.
    """

    def __init__(
        self,
        *,
        eval_files: Sequence[ConfigPath] = (),
        eval_fields: Sequence[str] = ("question",),
        eval_texts: Sequence[str] = (),
        ngram: Annotated[int, AtLeast(1)] = 8,
        min_overlap: Annotated[int, AtLeast(1)] = 1,
    ) -> None:
        if ngram < 1 or min_overlap < 1:
            raise ValueError("curation.decontaminate: ngram and min_overlap must be >= 1")
        texts = list(eval_texts)
        for path in eval_files:
            from rlax.plugins.tasks.dataset import load_rows

            rows, _ = load_rows(path)
            texts += [str(row[f]) for row in rows for f in eval_fields if row.get(f)]
        if not texts:
            raise ValueError("curation.decontaminate: no evaluation text to protect")
        self.ngram, self.min_overlap = ngram, min_overlap
        self._grams: set[str] = set()
        self._short: set[str] = set()  # evaluation texts shorter than n words
        for text in texts:
            words = normalized_words(text)
            if len(words) < ngram:
                self._short.add(" ".join(words))
            else:
                self._grams |= shingles(text, ngram)
        self._short.discard("")
        self.eval_size = len(texts)

    def _overlap(self, text: str) -> set[str]:
        joined = f" {' '.join(normalized_words(text))} "
        shared = shingles(text, self.ngram) & self._grams
        return shared | {short for short in self._short if f" {short} " in joined}

    def offline(self, prompts: Sequence[Prompt]) -> Curated:
        reasons: list[str | None] = []
        for prompt in prompts:
            shared = self._overlap(prompt.text)
            if len(shared) >= self.min_overlap:
                example = min(shared)
                reasons.append(
                    f"contaminated: {len(shared)} shared {self.ngram}-gram(s), e.g. {example!r}"
                )
            else:
                reasons.append(None)
        return Curated.split(prompts, reasons)


@hookimpl
def rlax_register_curation_filters():
    return {"decontaminate": Decontaminate}
