"""``curation.dedup``: remove exact and near-duplicate prompts (offline).

Exact duplicates have the same normalized text (case, punctuation and
spacing ignored). Near duplicates have a Jaccard similarity of word
``ngram``-shingles of at least ``threshold``; candidates are found with
MinHash and locality-sensitive hashing (``bands`` x ``rows`` hash values,
Broder 1997; Leskovec et al., *Mining of Massive Datasets*, ch. 3) and then
confirmed with the exact Jaccard similarity, so the LSH only decides what is
compared, never what is dropped. The first occurrence is kept.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Sequence
from typing import Annotated

import numpy as np

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, Range
from rlax.core.types import Prompt
from rlax.plugins.curation.offline import Curated, normalized_words

__all__ = ["Dedup", "jaccard", "shingles"]

_PRIME = (1 << 61) - 1


def shingles(text: str, n: int) -> set[str]:
    """Word n-grams of the normalized text (the whole text if it is shorter)."""
    words = normalized_words(text)
    if len(words) <= n:
        return {" ".join(words)}
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def _hash64(item: str) -> int:
    return int.from_bytes(hashlib.blake2b(item.encode(), digest_size=8).digest(), "little")


class Dedup:
    """Drops exact and near-duplicate prompts, keeping the first of each cluster.

    Args:
      threshold: Jaccard similarity of shingles at or above which two prompts
        are near duplicates (1.0: exact duplicates only).
      ngram: words per shingle.
      bands: LSH bands; with ``rows`` per band, pairs of similarity s become
        candidates with probability 1 - (1 - s^rows)^bands.
      rows: MinHash values per band.
      seed: seed of the MinHash permutations.
    """

    def __init__(
        self,
        *,
        threshold: Annotated[float, Range(gt=0, le=1)] = 0.8,
        ngram: Annotated[int, AtLeast(1)] = 3,
        bands: Annotated[int, AtLeast(1)] = 16,
        rows: Annotated[int, AtLeast(1)] = 4,
        seed: int = 0,
    ) -> None:
        if not 0 < threshold <= 1:
            raise ValueError(f"curation.dedup: threshold must be in (0, 1], got {threshold}")
        if ngram < 1 or bands < 1 or rows < 1:
            raise ValueError("curation.dedup: ngram, bands and rows must be >= 1")
        self.threshold, self.ngram, self.bands, self.rows = threshold, ngram, bands, rows
        rng = np.random.default_rng(seed)
        self._a = rng.integers(1, _PRIME, bands * rows, dtype=np.uint64)
        self._b = rng.integers(0, _PRIME, bands * rows, dtype=np.uint64)

    def _signature(self, items: set[str]) -> np.ndarray:
        x = np.array([_hash64(s) % _PRIME for s in items], dtype=object)[:, None]
        values = (x * self._a.astype(object) + self._b.astype(object)) % _PRIME
        return values.min(axis=0).astype(np.uint64)

    def offline(self, prompts: Sequence[Prompt]) -> Curated:
        reasons: list[str | None] = [None] * len(prompts)
        exact: dict[str, int] = {}
        sets: dict[int, set[str]] = {}
        buckets: collections.defaultdict[tuple[int, bytes], list[int]] = collections.defaultdict(
            list
        )
        for i, prompt in enumerate(prompts):
            key = " ".join(normalized_words(prompt.text))
            if key in exact:
                reasons[i] = f"exact duplicate of {prompts[exact[key]].id}"
                continue
            exact[key] = i
            if self.threshold >= 1:
                continue
            sets[i] = shingles(prompt.text, self.ngram)
            signature = self._signature(sets[i]).reshape(self.bands, self.rows)
            candidates = {
                j for band, row in enumerate(signature) for j in buckets[(band, row.tobytes())]
            }
            match = next(
                (j for j in sorted(candidates) if jaccard(sets[i], sets[j]) >= self.threshold),
                None,
            )
            if match is not None:
                similarity = jaccard(sets[i], sets[match])
                reasons[i] = f"near duplicate of {prompts[match].id} (jaccard {similarity:.2f})"
                continue
            for band, row in enumerate(signature):
                buckets[(band, row.tobytes())].append(i)
        return Curated.split(prompts, reasons)


@hookimpl
def rlax_register_curation_filters():
    return {"dedup": Dedup}
