"""`rlax run` with the default role: parameter server, trainer and two workers as processes."""

from __future__ import annotations

import json
import re

import pytest
from cli_runs import CLUSTER_STEPS, quickstart_cluster, rlax_process

from rlax.core.runtime.run_dir import RunDir

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


def test_the_supervisor_and_the_parameter_server_never_imported_jax(cluster_run_sync):
    """Each checked for itself as it stopped (rlax.core.runtime.jax_free): one record each
    (no restarts in this run), named by its role and pid, and neither had imported JAX."""
    records = sorted((cluster_run_sync / RunDir.PROCESSES).iterdir())
    rows = [json.loads(p.read_text()) for p in records]
    assert sorted(r["role"] for r in rows) == ["param_server", "supervisor"]
    assert [r["jax_imported"] for r in rows] == [False, False]
    assert [p.name for p in records] == [f"{r['role']}-{r['pid']}.json" for r in rows]


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


CRASHES_IN_WORKERS = """
import os

from rlax.core import hookimpl
from rlax.plugins.rewards.arithmetic import ArithmeticReward


class CrashesInWorkers(ArithmeticReward):
    def __init__(self):
        if os.environ.get("RLAX_WORKER_ID"):
            raise RuntimeError("this reward cannot start in a worker")


@hookimpl
def rlax_register_rewards():
    return {"crashes_in_workers": CrashesInWorkers}
"""


def test_a_dead_worker_is_reported_and_fails_the_run(tmp_path):
    # A worker that crashes at start (its reward, from a test plugin, raises in a worker
    # process only; every setting is valid, so nothing refuses it before it starts).
    # No restarts: the first death fails the run (restarts are the preemption tests').
    (tmp_path / "crashes_in_workers.py").write_text(CRASHES_IN_WORKERS)
    proc = rlax_process(
        *quickstart_cluster(
            CLUSTER_STEPS,
            "--gin.REWARD=@rewards.crashes_in_workers()",
            "--gin.rlax.local_cluster.max_restarts=0",
        ),
        "-p",
        "crashes_in_workers",
        "--run-dir",
        str(tmp_path / "run"),
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 1
    # Both workers fail at start; whichever the supervisor sees first is named.
    assert re.search(r"worker-[01] \(pid \d+\) died with status [1-9]", proc.stderr), proc.stderr[
        -2000:
    ]
    assert "restarted 0 times already (max_restarts); stopping the run" in proc.stderr
