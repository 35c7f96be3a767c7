"""benchmarks/packing.py's pure helpers: the SmolLM2 section's length distribution, the
synthetic groups every section trains on, and the sections its arguments refuse."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

from rlax.core.types import Prompt

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("packing", ROOT / "benchmarks" / "packing.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def test_long_tail_lengths_have_median_64_a_tail_to_the_cap_and_nothing_beyond(bench):
    lengths = bench.long_tail_lengths(20_000, seed=0)
    assert lengths.min() >= 1 and lengths.max() == 512
    assert abs(np.median(lengths) - 64) <= 2
    # the cap is two sigmas above the median: about 2.3% of rows reach it
    assert 0.015 < np.mean(lengths == 512) < 0.03
    assert np.array_equal(lengths[:16], bench.long_tail_lengths(16, seed=0)[:16])


def test_synthetic_groups_have_the_drawn_lengths_tokens_in_the_vocabulary_and_rewards(bench):
    prompts = [
        Prompt(id=str(i), text="", tokens=np.arange(3, dtype=np.int32), answer="") for i in range(2)
    ]
    lengths = np.array([[1, 5, 7], [2, 2, 9]])
    groups = bench.synthetic_groups(prompts, lengths, vocab=50, seed=0)
    assert [[len(c.tokens) for c in g.completions] for g in groups] == lengths.tolist()
    tokens = np.concatenate([c.tokens for g in groups for c in g.completions])
    assert tokens.min() >= 2 and tokens.max() < 50
    assert all(len(set(g.rewards.tolist())) == 3 for g in groups)  # GRPO's advantages nonzero


@pytest.mark.parametrize(
    "skip,message",
    [("ragged", "skip both"), ("bogus", "unknown sections ['bogus']")],
)
def test_arguments_that_cannot_give_a_figure_are_refused(bench, skip, message, capsys):
    with pytest.raises(SystemExit) as err:
        bench.parse_args(["--skip", skip])
    assert err.value.code == 2
    assert message in capsys.readouterr().err
