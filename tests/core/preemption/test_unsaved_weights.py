"""A parameter server that saves no weights (``saved_weights = 0``): killed mid-run, it
comes back serving none, the trainer publishes its version again, the run completes, and
the run directory holds the weights only in the trainer's state and the final export."""

from __future__ import annotations

import os
import signal
import time

import pytest
from cluster import (
    children,
    finish,
    kill,
    leases_of,
    metrics,
    output,
    small,
    start,
    wait_until,
)

pytestmark = pytest.mark.e2e

# Steps: enough leases after step 2 to catch a worker holding one. A lease lives as long
# as its generation, shorter since the static sampler prefills a prompt once for its
# samples: 6 steps with the queue read every 0.1 s missed 1 run in 3 (10 and 5 ms: 5 of 5).
N = 10


def pause_workers_holding_leases(proc, db, tries: int = 20) -> list[int]:
    """SIGSTOPs every worker at a moment one of them holds leases; their pids."""
    for _ in range(tries):
        wait_until(
            lambda: leases_of(db, "worker-0") or leases_of(db, "worker-1"),
            what="a worker leasing",
            proc=proc,
            every=0.005,
        )
        workers = [pid for role, pid in children(proc.pid).items() if role.startswith("worker")]
        for worker in workers:
            os.kill(worker, signal.SIGSTOP)
        time.sleep(0.5)  # a request one had already sent is answered
        if leases_of(db, "worker-0") or leases_of(db, "worker-1"):
            return workers
        for worker in workers:
            os.kill(worker, signal.SIGCONT)
    raise AssertionError(f"no worker was paused holding a lease in {tries} tries")


def test_a_server_killed_without_saved_weights_gets_them_again_from_the_trainer(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(
        run_dir, small(N, "--gin.rlax.param_server.saved_weights=0", "--gin.MAX_STALENESS=0")
    )
    wait_until(lambda: len(metrics(run_dir)) >= 2, what="step 2", proc=proc)
    # Synchronous: the next batch needs the version being published now. The workers are
    # paused while one holds leases, so the queue is short of a batch and the trainer ends
    # up waiting for rollouts; the server is killed then, and comes back serving no
    # weights. Only the trainer can bring them back (without it the run would wait
    # forever), before the workers go on. (Paused after the batch was complete, the
    # trainer would publish its next version instead, and the rule would go untested.)
    workers = pause_workers_holding_leases(proc, run_dir / "param_server" / "queue.sqlite")
    spool = run_dir / "param_server" / "weights" / ".spool"
    assert list(spool.glob("*.bin"))  # pushes are received into (and served from) files
    pid = kill(proc, "param_server", signal.SIGKILL)
    # The restart, and a wait for rollouts that ends empty: the trainer says so, and
    # publishes again. Before it has, a worker let go could submit rollouts of a version
    # the restarted server has never had (its submission is refused; the rule untested).
    republished = "parameter server restarted without weights (serving -1)"
    wait_until(lambda: republished in output(proc)[0], what="the trainer's republish", proc=proc)
    for worker in workers:
        os.kill(worker, signal.SIGCONT)
    code, out, err = finish(proc)
    assert code == 0, err[-4000:]
    assert f"param_server (pid {pid}) died with killed by SIGKILL; restarting it" in err
    assert republished in out, err[-5000:]
    assert [row["step"] for row in metrics(run_dir)] == list(range(1, N + 1))
    weights = run_dir / "param_server" / "weights"
    assert [p.name for p in weights.iterdir()] == [".spool"]  # no saved version
    assert list(spool.iterdir()) == []  # and the served files went with the server
