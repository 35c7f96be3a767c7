"""Learning curves of a run as one PNG: the training metrics, held-out pass@k, where time went."""

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
HELDOUT = "heldout/pass_at_"  # the periodic evaluation's metrics (rlax.core.trainer.observe)
# The phases of a step (rlax.core.trainer.phases), stacked in the last panel.
PHASE_NAMES = ("wait_rollouts", "train", "publish", "eval", "checkpoint", "observe")
# The grid's margins and gaps, fractions of the 16 x 6.5 in figure (room for the titles,
# the tick labels and the x labels).
_MARGINS = {
    "left": 0.035,
    "right": 0.99,
    "bottom": 0.08,
    "top": 0.9,
    "wspace": 0.22,
    "hspace": 0.42,
}


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    if len(values) < window or window < 2:
        return values
    kernel = np.ones(window) / window
    return np.convolve(values, kernel, mode="valid")


def _heldout(ax, rows: Sequence[dict], before: dict | None, after: dict | None) -> None:
    """One line per k: the evaluation before training (step 0), every periodic one, after."""
    last = rows[-1]["step"] if rows else 0
    ks = sorted(
        {n.removeprefix(HELDOUT) for r in rows for n in r if n.startswith(HELDOUT)}
        | {k.removeprefix("pass@") for r in (before, after) if r for k in r},
        key=lambda k: int(k) if k.isdigit() else 0,
    )
    for i, k in enumerate(ks):
        points = [(0, before.get(f"pass@{k}"))] if before else []
        points += [(r["step"], r[HELDOUT + k]) for r in rows if HELDOUT + k in r]
        points += [(last, after.get(f"pass@{k}"))] if after else []
        points = [(s, v) for s, v in points if v is not None]
        if points:
            steps, values = zip(*points)
            ax.plot(steps, values, marker="o", color=f"C{i}", label=f"pass@{k}")
    if ks:
        ax.legend(fontsize=8)
    ax.set_title("held-out pass@k")


def _phases(ax, rows: Sequence[dict], steps: np.ndarray) -> None:
    bottom = np.zeros(len(rows))
    for i, phase in enumerate(PHASE_NAMES):
        values = np.array([r.get(f"{phase}_s", 0.0) for r in rows], dtype=float)
        if values.any():
            ax.fill_between(
                steps, bottom, bottom + values, step="mid", alpha=0.6, color=f"C{i}", label=phase
            )
            bottom = bottom + values
    if bottom.any():
        ax.legend(fontsize=7, loc="upper left")
    ax.set_title("seconds per step, by phase")


def plot_curves(
    rows: Sequence[dict],
    path: pathlib.Path,
    title: str = "",
    before: dict | None = None,
    after: dict | None = None,
) -> pathlib.Path:
    """Writes a 2x4 grid of the per-step metrics in ``rows`` to ``path``.

    ``before`` and ``after`` (``{"pass@1": x, ...}``, as in ``eval.json``) are
    drawn at step 0 and at the last step of the held-out panel, with the
    periodic evaluations in between. The file is replaced whole (written
    beside it, then renamed), so a reader never sees half a PNG.
    """
    # The object API on an Agg canvas: no pyplot (its import and global figure state)
    # and fixed margins rather than tight_layout, which draws every label to measure it
    # (together about half the time of a redraw, which the trainer's step waits for).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 6.5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 4, gridspec_kw=_MARGINS)
    steps = np.array([r["step"] for r in rows])
    window = max(1, len(rows) // 20)
    for ax, (key, label) in zip(axes.flat, PANELS):
        values = np.array([r.get(key, np.nan) for r in rows], dtype=float)
        ax.plot(steps, values, alpha=0.3, color="C0")
        smooth = _smooth(values, window)
        ax.plot(steps[len(steps) - len(smooth) :], smooth, color="C0")
        ax.set_title(label)
    _heldout(axes.flat[6], rows, before, after)
    _phases(axes.flat[7], rows, steps)
    for ax in axes.flat:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=80)
    tmp.replace(path)
    return path
