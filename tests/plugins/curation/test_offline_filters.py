"""Offline filters on small fixtures with known duplicates, contamination and lengths."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlax.core.types import Prompt
from rlax.plugins.curation.decontaminate import Decontaminate
from rlax.plugins.curation.dedup import Dedup, jaccard, shingles
from rlax.plugins.curation.length_filter import LengthFilter

LONG = (
    "A farmer has 12 cows and each cow gives 8 liters of milk a day. He sells the milk "
    "at 2 dollars per liter at the market on Saturday. How much money does he make in a week?"
)


def prompts(*texts: str) -> list[Prompt]:
    return [Prompt(f"p{i}", t, np.zeros(1, np.int32), "0") for i, t in enumerate(texts)]


def kept_ids(result) -> list[str]:
    return [p.id for p in result.kept]


def test_dedup_drops_exact_and_near_duplicates_keeping_the_first():
    data = prompts(
        "What is 2 plus 2?",  # p0
        "what is 2 plus 2",  # p1 exact after normalization
        LONG,  # p2
        LONG.replace("Saturday", "Sunday"),  # p3 near duplicate of p2
        LONG.replace("12 cows", "15 goats")
        .replace("milk", "juice")
        .replace("money", "cash")
        .replace("a week", "a month")
        .replace("market", "fair"),  # p4 too different
        "Name a prime number greater than 10.",  # p5
    )
    result = Dedup(threshold=0.8).offline(data)
    assert kept_ids(result) == ["p0", "p2", "p4", "p5"]
    reasons = {d.prompt.id: d.reason for d in result.dropped}
    assert reasons["p1"] == "exact duplicate of p0"
    assert reasons["p3"].startswith("near duplicate of p2 (jaccard 0.")
    similarity = jaccard(shingles(LONG, 3), shingles(data[3].text, 3))
    assert 0.8 <= similarity < 1.0  # the fixture's near duplicate is near, not exact


def test_dedup_at_threshold_one_removes_exact_duplicates_only():
    data = prompts(LONG, LONG.replace("Saturday", "Sunday"), LONG.upper())
    assert kept_ids(Dedup(threshold=1.0).offline(data)) == ["p0", "p1"]


def test_dedup_is_idempotent_and_order_decides_the_survivor():
    data = prompts(LONG, "What is 2 plus 2?", LONG.replace("Saturday", "Sunday"), "Hi there")
    once = Dedup().offline(data)
    assert kept_ids(Dedup().offline(once.kept)) == kept_ids(once)
    assert kept_ids(Dedup().offline(data[::-1])) == ["p3", "p2", "p1"]


EVAL = [
    "Tom reads 15 pages every day for 3 weeks. How many pages does he read in total?",
    "What is 7 times 8?",  # shorter than the n-gram: matched verbatim
]


def test_decontaminate_drops_prompts_sharing_ngrams_with_eval_sets():
    data = prompts(
        "Solve this: Tom reads 15 pages every day for 3 weeks. How many pages?",  # p0 overlap
        "Quick one. What is 7 times 8? Show your work.",  # p1 short eval
        "Tom reads 20 pages every day for 2 weeks. How many pages in all?",  # p2 related only
        "What is 7 times 9?",  # p3 near miss
        "TOM READS 15 PAGES, EVERY DAY, FOR 3 WEEKS!",  # p4 case/punct
    )
    result = Decontaminate(eval_texts=EVAL, ngram=8).offline(data)
    assert kept_ids(result) == ["p2", "p3"]
    reasons = {d.prompt.id: d.reason for d in result.dropped}
    assert reasons["p1"].startswith("contaminated: 1 shared 8-gram(s), e.g. 'what is 7 times 8'")
    assert "shared 8-gram" in reasons["p0"]


def test_decontaminate_reads_eval_files_and_min_overlap(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps({"question": EVAL[0], "answer": "315"}) + "\n")
    data = prompts("Solve this: Tom reads 15 pages every day for 3 weeks. How many pages?")
    assert kept_ids(Decontaminate(eval_files=[str(path)], ngram=8).offline(data)) == []
    # The overlap is 12 words, 5 consecutive 8-grams; asking for 6 keeps the prompt.
    assert kept_ids(
        Decontaminate(eval_files=[str(path)], ngram=8, min_overlap=6).offline(data)
    ) == ["p0"]
    with pytest.raises(ValueError, match="no evaluation text"):
        Decontaminate(eval_texts=[])


def test_length_filter_by_chars_words_and_tokens():
    data = prompts("short", "a few words here", "x" * 50)
    assert kept_ids(LengthFilter(min_length=6, max_length=20).offline(data)) == ["p1"]
    by_words = LengthFilter(min_length=2, unit="words").offline(data)
    assert kept_ids(by_words) == ["p1"]
    assert by_words.dropped[0].reason == "too short: 1 words < 2"
    assert kept_ids(LengthFilter(max_length=1, unit="tokens").offline(data)) == ["p0", "p1", "p2"]
    with pytest.raises(ValueError, match="min_length <= max_length"):
        LengthFilter(min_length=5, max_length=2)
