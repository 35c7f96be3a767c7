"""`rlax run` with the default role: parameter server, trainer and two workers as processes."""

from __future__ import annotations

import json
import re

import pytest
from cli_runs import CLUSTER_STEPS, quickstart_cluster, rlax_process

pytestmark = pytest.mark.e2e


def test_processes_run_through_the_parameter_server(cluster_run_sync):
    run_dir = cluster_run_sync
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == list(range(1, CLUSTER_STEPS + 1))
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
    """12 steps: the workers run ahead from the second step on, so a dozen is plenty to
    see groups one and two versions old, and none older."""
    run_dir = tmp_path / "run"
    proc = rlax_process(
        *quickstart_cluster(CLUSTER_STEPS, "--gin.MAX_STALENESS=2"), "--run-dir", str(run_dir)
    )
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
    # No restarts: the first death fails the run (restarts are the preemption tests').
    proc = rlax_process(
        *quickstart_cluster(
            CLUSTER_STEPS,
            "--gin.rlax.worker.reward_workers=-1",
            "--gin.rlax.local_cluster.max_restarts=0",
        ),
        "--run-dir",
        str(tmp_path / "run"),
    )
    assert proc.returncode == 1
    # Both workers fail at start; whichever the supervisor sees first is named.
    assert re.search(r"worker-[01] \(pid \d+\) died with status [1-9]", proc.stderr), proc.stderr[
        -2000:
    ]
    assert "restarted 0 times already (max_restarts); stopping the run" in proc.stderr
