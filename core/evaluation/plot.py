"""Learning curves of a run as one PNG."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import numpy as np

PANELS = (
    ("reward", "reward (train)"),
    ("pass_rate", "pass rate (train)"),
    ("loss", "loss"),
    ("kl_old", "KL(old || new) per update"),
    ("entropy", "entropy"),
    ("tokens_per_s", "tokens / s"),
)


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    if len(values) < window or window < 2:
        return values
    kernel = np.ones(window) / window
    return np.convolve(values, kernel, mode="valid")


def plot_curves(rows: Sequence[dict], path: pathlib.Path, title: str = "") -> pathlib.Path:
    """Writes a 2x3 grid of the per-step metrics in ``rows`` to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    steps = np.array([r["step"] for r in rows])
    window = max(1, len(rows) // 20)
    for ax, (key, label) in zip(axes.flat, PANELS):
        values = np.array([r.get(key, np.nan) for r in rows], dtype=float)
        ax.plot(steps, values, alpha=0.3, color="C0")
        smooth = _smooth(values, window)
        ax.plot(steps[len(steps) - len(smooth) :], smooth, color="C0")
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
