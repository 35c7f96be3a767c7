"""Learning curves of a run as one PNG: the training metrics, held-out pass@k, where time went.

The fourth panel is the post-update KL(old ‖ new) when the run measured it
(``trainer_settings.post_update_kl``), otherwise the train/rollout mismatch
(:data:`MISMATCH_TITLE`: mean and p99 of |log π_train − log π_sampler| and, on
the right axis, the fraction of tokens whose ratio is out of band), the signal
that shows train/inference alignment working. The phase panel's scale follows
the typical step: a step far above the rest (an evaluation, a checkpoint) is
clipped at the top and marked with its total, so it does not flatten the others.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PANELS = (
    ("reward", "reward (train)"),
    ("pass_rate", "pass rate (train)"),
    ("loss", "loss"),
    ("kl_old", "KL(old || new) per update"),
    ("entropy", "entropy"),
    ("tokens_per_s", "tokens / s"),
)
#: The fourth panel's title when no post-update KL was measured.
MISMATCH_TITLE = "train/rollout mismatch: |Δlogp| mean, p99; ratio out of band"
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


def _mismatch(ax, rows: Sequence[dict], steps: np.ndarray) -> None:
    """Mean and p99 |Δlogp| (left axis) and the out-of-band fraction (right axis)."""
    for key, label, color in (
        ("mismatch_abs_logp", "|Δlogp| mean", "C0"),
        ("mismatch_abs_logp_p99", "|Δlogp| p99", "C1"),
    ):
        ax.plot(steps, [r.get(key, np.nan) for r in rows], color=color, label=label)
    right = ax.twinx()
    band = [r.get("ratio_out_of_band", np.nan) for r in rows]
    right.plot(steps, band, color="C3", alpha=0.7, label="ratio out of band")
    right.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper left")
    right.legend(fontsize=7, loc="upper right")
    ax.set_title(MISMATCH_TITLE)


def typical_top(totals: np.ndarray) -> float | None:
    """The phase panel's top: None (autoscale) unless some step takes more than three
    times the median, then 1.5 x the 90th percentile (those steps are clipped)."""
    if len(totals) < 5 or not np.any(totals > 0):
        return None
    median = float(np.median(totals))
    if totals.max() <= 3 * median:
        return None
    return 1.5 * float(np.percentile(totals, 90))


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
    top = typical_top(bottom)
    if top is not None:  # clip the spikes, mark each with its total
        ax.set_ylim(0, top)
        for s, total in zip(steps[bottom > top], bottom[bottom > top]):
            ax.plot([s], [top], marker="^", color="k", clip_on=False)
            ax.annotate(f"{total:.0f}s", (s, top), fontsize=6, ha="center", va="top")
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
    fig = draw_curves(rows, title, before, after)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=80)
    tmp.replace(path)
    return path


def draw_curves(
    rows: Sequence[dict], title: str = "", before: dict | None = None, after: dict | None = None
) -> Figure:
    """The figure :func:`plot_curves` writes (a matplotlib ``Figure`` on an Agg canvas)."""
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
    kl = any("kl_old" in r for r in rows)
    for ax, (key, label) in zip(axes.flat, PANELS):
        if key == "kl_old" and not kl:
            _mismatch(ax, rows, steps)
            continue
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
    return fig
