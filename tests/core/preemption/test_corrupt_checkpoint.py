"""(e) A trainer whose newest checkpoint is corrupt resumes from the one before, says so,
and redoes the steps in between exactly (the inline role: one process)."""

from __future__ import annotations

import re

import pytest
from cluster import finish, metrics, small, start, training_metrics

pytestmark = pytest.mark.e2e


def run(run_dir, steps):
    return finish(start(run_dir, small(steps, "--gin.rlax.checkpointing.every=1"), role="inline"))


def test_a_corrupt_newest_checkpoint_is_skipped_and_its_steps_redone(tmp_path):
    run_dir = tmp_path / "run"
    code, _, err = run(run_dir, 3)
    assert code == 0, err[-3000:]
    first = metrics(run_dir)
    states = run_dir / "train_state"
    assert sorted(p.name for p in states.iterdir()) == ["1", "2", "3"]
    for data in [p for p in (states / "3" / "state").rglob("*") if p.parent.name == "d"]:
        data.write_bytes(data.read_bytes()[:-64] + b"\xff" * 64)

    code, out, err = run(run_dir, 4)
    assert code == 0, err[-3000:]
    assert re.search(
        r"checkpoint \S+/train_state/3 cannot be restored \(.*\); moved to \S+"
        r"/train_state/3\.corrupt-\d+ and skipped",
        err,
    ), err[-3000:]
    assert f"resumed from {states / '2'}: step 2" in out
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # step 3 once, not twice
    # The redone step repeats the lost one exactly: same state, prompts and seeds.
    assert training_metrics(rows[:3]) == training_metrics(first)
    # The damaged checkpoint was set aside, not deleted; training went on past it.
    names = sorted(p.name for p in states.iterdir())
    assert [n for n in names if n.startswith("3.corrupt-")] and {"2", "3", "4"} <= set(names)
