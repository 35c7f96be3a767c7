"""(a) Deterministic mode: preempted (SIGTERM) and resumed, a run ends with the same
parameters and metrics as a run that never stopped — bitwise.

One run is interrupted twice: SIGTERM to the trainer alone at step N/3 (it checkpoints,
exits 75 and the supervisor restarts it), then SIGTERM to the whole cluster at 2N/3 (every
process stops at its safe point, the run exits 75) and the same command resumes it.
"""

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

pytestmark = pytest.mark.e2e

N = 6
ONE_WORKER = "--gin.rlax.local_cluster.num_workers=1"
ARGS = small(N, *DETERMINISTIC, ONE_WORKER)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    code, _, err = finish(start(run_dir, ARGS))
    assert code == 0, err[-3000:]
    return run_dir


def test_preempted_twice_then_resumed_equals_a_run_that_never_stopped(straight, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(run_dir, ARGS)
    # 1. The trainer alone is preempted; the supervisor restarts it.
    wait_until(lambda: len(metrics(run_dir)) >= N // 3, what=f"step {N // 3}", proc=proc)
    trainer = kill(proc, "trainer", signal.SIGTERM)
    # 2. The whole machine is preempted: the supervisor passes SIGTERM on.
    wait_until(lambda: len(metrics(run_dir)) >= 2 * N // 3, what=f"step {2 * N // 3}", proc=proc)
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc)
    assert code == 75, err[-3000:]
    assert f"trainer (pid {trainer}) died with preempted (status 75); restarting it (1/3)" in err
    assert "resumed from" in out
    assert "stopped on a preemption notice; trainer preempted (status 75)" in err
    for role in ("trainer", "worker", "param_server"):
        assert f"rlax: preempted: {role} stopped at a safe point (SIGTERM)" in err
    stopped_at = len(metrics(run_dir))
    assert stopped_at < N

    # 3. The same command resumes the run where it stopped.
    code, out, err = finish(start(run_dir, ARGS))
    assert code == 0, err[-3000:]
    assert f"resumed from {run_dir / 'train_state' / str(stopped_at)}: step {stopped_at}" in out
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, N + 1))  # no step ran twice
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
