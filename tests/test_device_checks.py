"""Checks run in a child pytest (tests/device_checks.py): a hang is reported, and none is made.

In two random-order runs (seeds 649764 at 03b57bf and 337881 at 2e3e857) the eight-device
expert checks ran past their 600 s bound (alone: 40 s) and printed nothing. The cause was
a deadlock between the suite's machine lock and the child: the child pytest inherited the
xdist worker's environment, so tests/conftest.py made it queue at the machine's turnstile,
which a serial test on the other worker held while it waited for the machine that the
child's parent held. conftest now knows a worker by its config; and a child that does hang
fails with every thread's stack (pytest's faulthandler before the bound).
"""

from __future__ import annotations

import fcntl

import pytest
from device_checks import ROOT, assert_passed, pytest_on_devices


def test_a_check_that_hangs_fails_with_the_stack_it_hung_in(tmp_path):
    checks = tmp_path / "hang_checks.py"
    checks.write_text("import time\n\n\ndef test_waits_forever():\n    time.sleep(120)\n")
    outcomes = pytest_on_devices(checks, tmp_path, devices=1, timeout=30, cwd=tmp_path)
    results, log = outcomes
    assert results == {}
    assert "timed out after 30 s" in log
    # The dump (at 0.8 x the bound: 6 s left for the child to start even on a busy machine)
    # names the file and the function the child waits in.
    assert "Timeout (0:00:24)!" in log
    assert 'hang_checks.py", line 5 in test_waits_forever' in log
    with pytest.raises(AssertionError, match="did not run on 8 devices"):
        assert_passed(outcomes, "test_waits_forever")


def test_a_child_pytest_does_not_queue_for_the_machine_its_parent_holds(tmp_path, monkeypatch):
    # What two random orders met: a worker's test ran its checks in a child pytest, which
    # inherited the worker's environment and queued at the machine's turnstile -- held by
    # a serial test on the other worker, itself waiting for the machine the parent held.
    monkeypatch.setenv("RLAX_TEST_SHARED", str(tmp_path))  # the child's lock files
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw9")  # as a worker's child inherits it
    checks = ROOT / "tests" / "test_suite_rules.py"  # quick, and under tests/'s conftest
    with open(tmp_path / "turnstile.lock", "a+") as turnstile:
        fcntl.flock(turnstile, fcntl.LOCK_EX)  # a serial test, waiting for the machine
        outcomes = pytest_on_devices(checks, tmp_path, devices=1, timeout=120)
    assert_passed(outcomes, "test_every_test_that_bounds_wall_time_runs_serially", devices=1)
