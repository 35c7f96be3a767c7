"""A worker whose parameter server is gone stops promptly on a notice instead of retrying."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from cluster import ROOT, small, wait_until


@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_a_worker_retrying_an_unreachable_server_stops_within_seconds_of_a_notice(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLAX_")}
    env.update(RLAX_PS_ADDRESS=address, RLAX_PS_TOKEN="worker-notice-test", JAX_PLATFORMS="cpu")
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlax.core.cli",
                "run",
                *small(3),
                "--role",
                "worker",
                "--run-dir",
                str(tmp_path / "run"),
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def retrying() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            return ": UNAVAILABLE; retrying" in log.read_text()

        wait_until(retrying, timeout=120, what="the worker retrying a call")
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        status = proc.wait(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert status == 75, text[-3000:]  # preempted, to be restarted
    # A failing call retries for 60 s (ParamServerClient retry_s); after the
    # notice it gives up at once, and the worker exits at its safe point.
    assert took < 10, text[-3000:]
    assert "preemption notice (SIGTERM)" in text
