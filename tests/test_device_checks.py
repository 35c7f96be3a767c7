"""The runner of multi-device checks (tests/device_checks.py) reports a hang, not only a timeout.

A checks module on eight fake devices once ran past its 600 s bound inside a full random-order
run (seed 649764 at 03b57bf; alone it takes 40 s): the suite saw five bare TimeoutExpired
errors and nothing of where the child stood. The runner now has pytest's faulthandler dump
every thread's stack before the bound, and turns the timeout into the checks' failure with
that output.
"""

from __future__ import annotations

import pytest
from device_checks import assert_passed, pytest_on_devices


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
