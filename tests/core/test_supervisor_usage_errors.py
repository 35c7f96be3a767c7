"""A child that stops on a configuration error is not restarted: the run ends with
status 2 and its one line, once, however many children refused the same setting."""

from __future__ import annotations

import pathlib
import sys

from rlax.core.errors import EXIT_USAGE
from rlax.core.launch.local_cluster import _Child, _end_children, _supervise
from rlax.core.runtime.preemption import Preemption

# A role that refuses a setting the way every role does: rlax.core.cli's error path.
REFUSES = (
    "import sys; from rlax.core.cli import _error; "
    "sys.exit(_error('rlax.worker.prompts_per_lease: must be >= 1, got 0', 2))"
)
RUNS = "import time; time.sleep(60)"


def test_a_child_refusing_its_settings_ends_the_run_in_one_line_without_a_restart(
    tmp_path: pathlib.Path, capfd
):
    reports = tmp_path / "reports"
    reports.mkdir()
    trainer = _Child("trainer", [sys.executable, "-c", RUNS], {}, None, reports)
    workers = [
        _Child(f"worker-{i}", [sys.executable, "-c", REFUSES], {}, None, reports) for i in range(2)
    ]
    for worker in workers:  # both refuse before the supervisor looks
        worker.proc.wait(60)
    children = [trainer, *workers]
    stop = Preemption([], role="local").start()
    try:
        status = _supervise(trainer, children, max_restarts=3, stop=stop)
    finally:
        stop.close()
        _end_children(children, status)

    assert status == EXIT_USAGE
    assert [c.restarts for c in children] == [0, 0, 0]
    assert [c.proc.returncode for c in workers] == [EXIT_USAGE, EXIT_USAGE]
    assert capfd.readouterr().err == (
        "rlax: error: rlax.worker.prompts_per_lease: must be >= 1, got 0\n"
    )


def test_a_child_that_crashes_is_still_restarted(tmp_path: pathlib.Path, capfd):
    trainer = _Child("trainer", [sys.executable, "-c", RUNS], {}, None, tmp_path)
    crashing = _Child("worker-0", [sys.executable, "-c", "raise SystemExit(1)"], {}, None, tmp_path)
    crashing.proc.wait(60)
    stop = Preemption([], role="local").start()
    try:
        status = _supervise(trainer, [trainer, crashing], max_restarts=1, stop=stop)
    finally:
        stop.close()
        _end_children([trainer, crashing], status)

    err = capfd.readouterr().err
    assert status == 1
    assert crashing.restarts == 1
    assert "died with status 1; restarting it (1/1)" in err
    assert "restarted 1 times already (max_restarts); stopping the run" in err
