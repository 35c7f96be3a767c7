"""The train/rollout mismatch, seen: its metrics by hand, the curves' panel, ``rlax show``."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rlax.core.evaluation.plot import MISMATCH_TITLE, draw_curves, typical_top
from rlax.core.evaluation.show import alignment_line, metric_lines
from rlax.core.trainer.mismatch import mismatch_metrics as _mismatch_metrics


def test_mismatch_metrics_by_hand():
    # d = train - old over the mask: 0.05, -0.2, 0.1, 0.0 (and 9.0 off the mask).
    train = jnp.asarray([[0.05, -0.2, 9.0], [0.1, 0.0, 0.0]])
    batch = {"old_logprobs": jnp.zeros((2, 3)), "loss_mask": jnp.asarray([[1.0, 1, 0], [1, 1, 0]])}
    m = {k: float(v) for k, v in _mismatch_metrics(train, batch).items()}
    assert m["mismatch_abs_logp"] == pytest.approx((0.05 + 0.2 + 0.1) / 4)
    # Nearest rank: ceil(0.99 * 4) = 4th smallest of 0, 0.05, 0.1, 0.2.
    assert m["mismatch_abs_logp_p99"] == pytest.approx(0.2)
    # Ratios e^0.05 = 1.051 (in), e^-0.2 = 0.819 (out), e^0.1 = 1.105 (out), 1 (in).
    assert m["ratio_out_of_band"] == pytest.approx(0.5)
    k3 = sum(math.exp(d) - 1 - d for d in (0.05, -0.2, 0.1, 0.0)) / 4
    assert m["mismatch_kl"] == pytest.approx(k3, rel=1e-5)
    empty = _mismatch_metrics(train, dict(batch, loss_mask=jnp.zeros((2, 3))))
    assert float(empty["mismatch_abs_logp_p99"]) == 0.0


def rows(kl: bool, n: int = 20):
    out = []
    for s in range(1, n + 1):
        r = {"step": s, "reward": 0.1 * s, "loss": 1.0, "entropy": 2.0, "train_s": 1.0}
        r.update(mismatch_abs_logp=1e-3, mismatch_abs_logp_p99=5e-3, ratio_out_of_band=0.02)
        if kl:
            r["kl_old"] = 1e-4
        out.append(r)
    out[-3]["eval_s"] = 30.0  # an evaluation's step
    return out


def titles(fig) -> list[str]:
    return [ax.get_title() for ax in fig.axes]


def test_the_mismatch_panel_replaces_the_empty_kl_panel():
    without = titles(draw_curves(rows(kl=False)))
    assert MISMATCH_TITLE in without
    assert not any(t.startswith("KL(old") for t in without)
    with_kl = titles(draw_curves(rows(kl=True)))
    assert "KL(old || new) per update" in with_kl and MISMATCH_TITLE not in with_kl


def test_the_phase_panel_clips_an_evaluation_spike_and_marks_it():
    fig = draw_curves(rows(kl=False))
    (phases,) = [ax for ax in fig.axes if ax.get_title() == "seconds per step, by phase"]
    # 19 steps of 1 s and one of 31 s: the top is 1.5 x the 90th percentile, 1.5 s.
    assert phases.get_ylim()[1] == pytest.approx(1.5)
    assert [t.get_text() for t in phases.texts] == ["31s"]
    assert typical_top(np.asarray([1.0, 1.2, 0.9, 1.1, 2.5])) is None  # nothing far above
    assert typical_top(np.asarray([1.0] * 19 + [31.0])) == pytest.approx(1.5)


def test_rlax_show_prints_the_mismatch():
    line = alignment_line(rows(kl=False)[-1])
    assert (
        line
        == "  train/rollout mismatch: |dlogp| mean 1.00e-03, p99 5.00e-03, ratio out of band 2.0%"
    )
    assert line in list(metric_lines(rows(kl=False)))
    partly = dict(rows(kl=False)[-1], mismatch_coverage=0.25)
    assert alignment_line(partly) == line + ", on 25% of the tokens"
    unmeasured = {k: v for k, v in partly.items() if not k.startswith(("mismatch_abs", "ratio_"))}
    unmeasured["mismatch_coverage"] = 0.0
    assert "not measured" in alignment_line(unmeasured)
    assert alignment_line(unmeasured) in list(metric_lines([*rows(kl=False)[:-1], unmeasured]))
