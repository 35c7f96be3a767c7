"""`rlax run` with the default role: parameter server, trainer and two workers as processes."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = ROOT / "assets" / "quickstart-base"
STEPS = 25


def rlax_run(*args, timeout=300):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLAX_PS_")}
    cmd = [
        sys.executable, "-m", "rlax.core.cli", "run", "--gin", str(ROOT / "configs" / "quickstart.gin"),
        f"--gin.INIT_CHECKPOINT='{BASE}'", f"--gin.rlax.train.steps={STEPS}",
        "--gin.tasks.arithmetic.num_eval=24", "--gin.rlax.train.progress=False", *args,
    ]  # fmt: skip
    return subprocess.run(
        cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_processes_run_through_the_parameter_server(tmp_path):
    run_dir = tmp_path / "run"
    proc = rlax_run("--run-dir", str(run_dir), "--gin.MAX_STALENESS=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        # Synchronous mode (max_staleness 0): every group trained on came from the current version.
        assert r["groups_kept"] == r.get("staleness_0", 0)
        assert r["dropped_stale"] == 0
        assert r["weight_sync_s"] > 0 and 0 <= r["worker_idle_fraction"] <= 1
        assert r["worker_generate_s"] >= 0 and r["worker_score_s"] >= 0
    # The workers' sampling and scoring seconds reach the trainer's metrics.
    assert sum(r["worker_generate_s"] for r in rows) > 0 < sum(r["worker_score_s"] for r in rows)
    assert json.loads((run_dir / "eval.json").read_text()).keys() == {"before", "after"}


def test_async_mode_trains_on_groups_at_most_max_staleness_old(tmp_path):
    run_dir = tmp_path / "run"
    proc = rlax_run("--run-dir", str(run_dir), "--gin.MAX_STALENESS=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    ages = {k for r in rows for k in r if k.startswith("staleness_")}
    assert ages <= {"staleness_0", "staleness_1", "staleness_2"}
    assert any(
        r.get("staleness_1", 0) + r.get("staleness_2", 0) > 0 for r in rows
    )  # it did run ahead


def test_a_dead_worker_is_reported_and_fails_the_run(tmp_path):
    # A worker that crashes at start (its reward pool refuses -1 processes); a model path
    # for the workers alone is refused before anything starts (the roles must agree).
    proc = rlax_run("--run-dir", str(tmp_path / "run"), "--gin.rlax.worker.reward_workers=-1")
    assert proc.returncode == 1
    # Both workers fail at start; whichever the supervisor sees first is named.
    assert re.search(r"worker-[01] \(pid \d+\) died with status [1-9]", proc.stderr), proc.stderr[
        -2000:
    ]
