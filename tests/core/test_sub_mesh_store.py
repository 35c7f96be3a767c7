"""A stored program of a sub-mesh is read back onto its own devices (8 fake CPU devices,
the program on devices 4-7): the first process compiles and stores it, the second reads it
and runs it there. Deserialised for every device, as before, XLA aborted the second
process (a one-process trainer at each restart)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cli_runs import fake_devices

pytestmark = pytest.mark.e2e

CHECKS = os.path.join(os.path.dirname(__file__), "sub_mesh_store_checks.py")


def test_a_sub_mesh_program_is_stored_then_read_back_and_run_on_its_devices(tmp_path):
    env = dict(os.environ, XLA_FLAGS=fake_devices(8), JAX_PLATFORMS="cpu")
    runs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, CHECKS, str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert (first["written"], first["loaded"]) == (1, 0)
    assert (second["written"], second["loaded"]) == (0, 1)  # read back, not compiled
    for run in runs:
        assert run["result"] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]
        assert run["devices"] == [4, 5, 6, 7]
