"""The local cluster's supervisor sends each child one stop signal, never a second.

A role that has taken its notice puts the default signal handlers back while it
exits (``Preemption.close``); a second SIGTERM then kills it before it has said
why it stopped or finished closing. Found as a flaky exact-resume test: the
parameter server, still in its one-second gRPC grace, was killed by the
supervisor's second SIGTERM and never printed "stopped at a safe point".
"""

from __future__ import annotations

import pathlib
import signal
import sys
import time

import pytest

from rlax.core.errors import EXIT_PREEMPTED
from rlax.core.launch.local_cluster import _Child, _end_children, _stop_all
from rlax.core.runtime.preemption import FINISH_SIGNAL

# A role's exit as the roles make it: the first stop signal is taken, the default
# handlers are back, and closing takes a while; every signal received is written down.
ROLE = """
import pathlib, signal, sys, time
log = pathlib.Path(sys.argv[1])
got = []
def take(signum, frame):
    got.append(signum)
    log.write_text(" ".join(map(str, got)))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal({finish}, signal.SIG_DFL)
signal.signal(signal.SIGTERM, take)
signal.signal({finish}, take)
log.write_text("ready")
while not got:
    time.sleep(0.01)
time.sleep(0.5)
log.write_text(log.read_text() + " closed")
sys.exit(int(sys.argv[2]))
""".format(finish=int(FINISH_SIGNAL))


def role(tmp_path: pathlib.Path, name: str, status: int) -> tuple[_Child, pathlib.Path]:
    log = tmp_path / f"{name}.log"
    child = _Child(name, [sys.executable, "-c", ROLE, str(log), str(status)], {}, None)
    sent = child.sent = []  # every signal the supervisor sends this process
    send = child.proc.send_signal
    child.proc.send_signal = lambda sig: (sent.append(int(sig)), send(sig))[1]
    deadline = time.monotonic() + 30
    while not (log.exists() and log.read_text() == "ready"):
        assert time.monotonic() < deadline, f"{name} did not start"
        time.sleep(0.01)
    return child, log


@pytest.mark.parametrize("status", [0, EXIT_PREEMPTED, 1])
def test_ending_the_children_signals_each_once_and_waits_for_it(tmp_path, status):
    children = [role(tmp_path, name, 0) for name in ("param_server", "worker-0", "worker-1")]
    _end_children([c for c, _ in children], status)
    sig = FINISH_SIGNAL if status == 0 else signal.SIGTERM
    for child, log in children:
        assert child.sent == [int(sig)], child.name
        assert child.proc.returncode == 0, child.name  # closed, not killed
        assert log.read_text() == f"{int(sig)} closed", child.name


def test_a_notice_then_the_end_signals_each_child_once(tmp_path):
    """The supervisor's notice path: _stop_all signals the trainer and the workers and
    waits for the trainer; _end_children then stops everything, the server last."""
    server, server_log = role(tmp_path, "param_server", 0)
    trainer, trainer_log = role(tmp_path, "trainer", EXIT_PREEMPTED)
    worker, worker_log = role(tmp_path, "worker-0", 0)
    children = [server, trainer, worker]
    status = _stop_all(trainer, children)
    assert status == EXIT_PREEMPTED
    _end_children(children, status)
    for child, log in ((server, server_log), (trainer, trainer_log), (worker, worker_log)):
        assert child.sent == [int(signal.SIGTERM)], child.name
        assert child.proc.returncode == (EXIT_PREEMPTED if child is trainer else 0), child.name
        assert log.read_text() == f"{int(signal.SIGTERM)} closed", child.name


def test_a_restarted_child_can_be_signalled_again(tmp_path):
    child, log = role(tmp_path, "worker-0", 0)
    child.stop()
    assert log.read_text() == f"{int(signal.SIGTERM)} closed"
    child.start()
    while log.read_text() != "ready":
        time.sleep(0.01)
    child.stop()
    assert child.proc.returncode == 0
    assert log.read_text() == f"{int(signal.SIGTERM)} closed"
