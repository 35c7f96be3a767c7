"""pass@k and the run's metrics log."""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct.

    .. math:: \\mathrm{pass@}k = 1 - \\binom{n-c}{k} / \\binom{n}{k}

    computed as the product :math:`1 - \\prod_{i=n-c+1}^{n} (1 - k/i)` so it
    stays exact for large n.

    References:
      Chen et al., 2021, "Evaluating Large Language Models Trained on Code",
      https://arxiv.org/abs/2107.03374 (section 2.1)
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(correct: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """correct: bool [problems, n] -> {"pass@k": mean over problems} for each k."""
    correct = np.asarray(correct, bool)
    n = correct.shape[1]
    counts = correct.sum(axis=1)
    return {f"pass@{k}": float(np.mean([pass_at_k(n, int(c), k) for c in counts])) for k in ks}


class MetricsLog:
    """Appends one JSON object per line to ``path`` and keeps them for plotting."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.rows: list[dict[str, float]] = []

    def write(self, row: Mapping[str, float]) -> None:
        row = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()}
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
