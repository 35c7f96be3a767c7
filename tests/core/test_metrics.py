"""pass@k against hand-computed cases and the binomial formula."""

import itertools
import math

import numpy as np
import pytest

from rlax.core.evaluation.metrics import MetricsLog, mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (2, 1, 1, 0.5),
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (8, 0, 8, 0.0),
        (8, 1, 8, 1.0),
        (5, 5, 1, 1.0),
        (10, 3, 1, 0.3),  # pass@1 is the plain success rate
        (16, 2, 8, 1 - math.comb(14, 8) / math.comb(16, 8)),
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomial_formula_and_is_monotone_in_k():
    for n in range(1, 13):
        for c in range(n + 1):
            values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
            for k, v in enumerate(values, start=1):
                assert v == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
            assert all(a <= b + 1e-12 for a, b in itertools.pairwise(values))


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_over_problems():
    correct = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
    out = mean_pass_at_k(correct, ks=(1, 2))
    assert out["pass@1"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert out["pass@2"] == pytest.approx((0.5 + 0 + 1) / 3)


def test_metrics_log_appends_json_lines(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl")
    log.write({"step": 0, "reward": 0.1234567891})
    log.write({"step": 1, "reward": 0.5})
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert lines == ['{"reward": 0.123457, "step": 0}', '{"reward": 0.5, "step": 1}']
