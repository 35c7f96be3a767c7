"""(a) Deterministic mode: SIGTERM to the trainer at step N/2, restarted by the supervisor,
ends with the same parameters and metrics as a run that never stopped — bitwise."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
from cluster import (
    DETERMINISTIC,
    final_params,
    finish,
    kill,
    metrics,
    small,
    start,
    training_metrics,
    wait_until,
)

N = 6
ONE_WORKER = "--gin.rlax.local_cluster.num_workers=1"


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    code, _, err = finish(start(run_dir, small(N, *DETERMINISTIC, ONE_WORKER)))
    assert code == 0, err[-3000:]
    return run_dir


def test_sigterm_at_half_way_then_resume_equals_a_run_that_never_stopped(straight, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(run_dir, small(N, *DETERMINISTIC, ONE_WORKER))
    wait_until(lambda: len(metrics(run_dir)) >= N // 2, what=f"step {N // 2}", proc=proc)
    trainer = kill(proc, "trainer", signal.SIGTERM)
    code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    # The trainer stopped at a safe point with the preempted status and was restarted once.
    assert f"trainer (pid {trainer}) died with preempted (status 75); restarting it (1/3)" in err
    assert "resumed from" in out and "died with" not in err.replace(f"pid {trainer}) died", "")
    # It finished the step it was in, checkpointed it, and resumed there: no step ran twice.
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(N))
    # Same parameters, bit for bit: the same prompts in the same order, sampled with
    # per-prompt seeds, trained on from an exactly restored state (float32 saved as is).
    a, b = final_params(straight), final_params(run_dir)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert training_metrics(rows) == training_metrics(metrics(straight))
    assert json.loads((run_dir / "eval.json").read_text()) == json.loads(
        (straight / "eval.json").read_text()
    )


def test_a_preempted_cluster_exits_75_and_the_same_command_resumes_it_exactly(straight, tmp_path):
    """The whole machine is preempted: the supervisor gets SIGTERM, passes it on, every
    process stops at its safe point with status 75; running the command again resumes."""
    run_dir = tmp_path / "run"
    args = small(N, *DETERMINISTIC, ONE_WORKER)
    proc = start(run_dir, args)
    wait_until(lambda: len(metrics(run_dir)) >= N // 2, what=f"step {N // 2}", proc=proc)
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 75, err[-3000:]
    assert "stopped on a preemption notice; trainer preempted (status 75)" in err
    for role in ("trainer", "worker", "param_server"):
        assert f"rlax: preempted: {role} stopped at a safe point (SIGTERM)" in err
    stopped_at = len(metrics(run_dir))
    assert stopped_at < N

    code, out, err = finish(start(run_dir, args))
    assert code == 0, err[-3000:]
    assert f"resumed from {run_dir / 'train_state' / str(stopped_at)}: step {stopped_at}" in out
    assert [r["step"] for r in metrics(run_dir)] == list(range(N))
    a, b = final_params(straight), final_params(run_dir)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert training_metrics(metrics(run_dir)) == training_metrics(metrics(straight))
