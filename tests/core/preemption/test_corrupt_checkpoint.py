"""(e) A trainer whose newest checkpoint is corrupt resumes from the one before, says so,
and redoes the steps in between exactly (inline role, in this process)."""

from __future__ import annotations

import pytest
from cluster import BASE, ROOT, metrics, training_metrics

from rlax.core import cli
from rlax.core.checkpoint import CorruptCheckpointWarning


def run(run_dir, steps):
    return cli.main([
        "run", "--gin", str(ROOT / "configs" / "quickstart.gin"),
        f"--gin.INIT_CHECKPOINT='{BASE}'", f"--gin.rlax.train.steps={steps}",
        "--gin.PROMPTS_PER_STEP=16", "--gin.tasks.arithmetic.num_eval=16",
        "--gin.rlax.train.eval_samples=2", "--gin.rlax.train.eval_ks=(1,)",
        "--gin.rlax.train.progress=False", "--gin.rlax.train.checkpoint_every=2",
        "--role", "inline", "--run-dir", str(run_dir),
    ])  # fmt: skip


def test_a_corrupt_newest_checkpoint_is_skipped_and_its_steps_redone(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(run_dir, 4) == cli.EXIT_OK
    first = metrics(run_dir)
    states = run_dir / "train_state"
    assert sorted(p.name for p in states.iterdir()) == ["2", "4"]
    for data in [p for p in (states / "4" / "state").rglob("*") if p.parent.name == "d"]:
        data.write_bytes(data.read_bytes()[:-64] + b"\xff" * 64)
    capsys.readouterr()

    with pytest.warns(CorruptCheckpointWarning, match=r"train_state/4 cannot be restored"):
        assert run(run_dir, 6) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert f"resumed from {states / '2'}: step 2" in out
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(6))  # steps 2 and 3 once, not twice
    # The redone steps repeat the lost ones exactly: same state, prompts and seeds.
    assert training_metrics(rows[:4]) == training_metrics(first)
    # The damaged checkpoint was set aside, not deleted; training went on past it.
    names = sorted(p.name for p in states.iterdir())
    assert [n for n in names if n.startswith("4.corrupt-")] and {"2", "4", "6"} <= set(names)
