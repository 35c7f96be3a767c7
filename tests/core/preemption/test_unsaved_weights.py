"""A parameter server that saves no weights (``saved_weights = 0``): killed mid-run, it
comes back serving none, the trainer publishes its version again, the run completes, and
the run directory holds the weights only in the trainer's state and the final export."""

from __future__ import annotations

import os
import signal
import time

from cluster import children, finish, kill, metrics, small, start, wait_until

N = 6


def test_a_server_killed_without_saved_weights_gets_them_again_from_the_trainer(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(
        run_dir, small(N, "--gin.rlax.param_server.saved_weights=0", "--gin.MAX_STALENESS=0")
    )
    wait_until(lambda: len(metrics(run_dir)) >= 2, what="step 2", proc=proc)
    # Synchronous: the next batch needs the version being published now. The workers are
    # paused, so the trainer ends up waiting for rollouts with the queue short of a batch;
    # the server is killed then, and comes back serving no weights. Only the trainer can
    # bring them back (without it the run would wait forever), before the workers go on.
    workers = [pid for role, pid in children(proc.pid).items() if role.startswith("worker")]
    for worker in workers:
        os.kill(worker, signal.SIGSTOP)
    time.sleep(1.0)
    spool = run_dir / "param_server" / "weights" / ".spool"
    assert list(spool.glob("*.bin"))  # pushes are received into (and served from) files
    pid = kill(proc, "param_server", signal.SIGKILL)
    time.sleep(10.0)  # the restart, and a wait for rollouts that ends empty (5 s)
    for worker in workers:
        os.kill(worker, signal.SIGCONT)
    code, out, err = finish(proc)
    assert code == 0, err[-4000:]
    assert f"param_server (pid {pid}) died with killed by SIGKILL; restarting it" in err
    assert "parameter server restarted without weights (serving -1)" in out, err[-5000:]
    assert [row["step"] for row in metrics(run_dir)] == list(range(1, N + 1))
    weights = run_dir / "param_server" / "weights"
    assert [p.name for p in weights.iterdir()] == [".spool"]  # no saved version
    assert list(spool.iterdir()) == []  # and the served files went with the server
