"""How the local cluster's supervisor starts its children, and how they end with it.

Found as a flaky exact-resume test in CI: a trainer "killed by SIGABRT" before it ran,
after ``Epoll1Poller encountered epoll_wait error: Bad file descriptor``. The supervisor
talks gRPC to the parameter server, and it started each child with a ``preexec_fn``
(asking for a signal at its death): Python then forks with every fork handler, and
gRPC's restart a poller in the child, which finds its descriptor closed before ``exec``
and aborts (grpc/grpc#43055). The child now asks for that signal itself
(``recovery.die_with_supervisor``), so Python starts it with ``vfork`` and no handler.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc

from rlax.core.launch.local_cluster import _Child
from rlax.core.runtime import recovery


def test_children_started_beside_busy_grpc_threads_all_run():
    """Beside a gRPC server and a channel in use (as the supervisor has them), 600 children
    all run. With a ``preexec_fn``, 1 to 8 in 500 aborted before ``exec`` here (SIGABRT):
    a start path that forks with gRPC's handlers fails this nearly every time."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    busy = threading.Event()

    def calls() -> None:
        call = channel.unary_unary("/rlax.Test/Nothing")
        while not busy.is_set():
            try:
                call(b"", timeout=0.05)
            except grpc.RpcError:
                pass

    caller = threading.Thread(target=calls, daemon=True)
    caller.start()
    try:
        codes = []
        for _ in range(600):
            child = _Child("true", ["/bin/true"], dict(os.environ), None)
            codes.append(child.proc.wait(timeout=30))
    finally:
        busy.set()
        caller.join(10)
        channel.close()
        server.stop(None)
    assert codes == [0] * 600, f"{sum(c != 0 for c in codes)} children died: {set(codes)}"


CHILD = """
import pathlib, signal, sys, time
from rlax.core.runtime import recovery
recovery.die_with_supervisor()
log = pathlib.Path(sys.argv[1])
def noticed(signum, frame):
    log.write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, noticed)
log.write_text("ready")
time.sleep(60)
"""

# A supervisor as `rlax run` starts its children (_Child), printing the child's pid.
SUPERVISOR = """
import sys, time, os
from rlax.core.launch.local_cluster import _Child
child = _Child("role", [sys.executable, "-c", sys.argv[1], sys.argv[2]], dict(os.environ), None)
print(child.proc.pid, flush=True)
time.sleep(60)
"""


def _wait_for(path: pathlib.Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text() == text):
        assert time.monotonic() < deadline, f"{path}: no {text!r} (has {path.read_text()!r})"
        time.sleep(0.05)


def test_a_child_gets_a_notice_when_its_supervisor_dies(tmp_path):
    """The supervisor is killed (no chance to pass a notice on): its child still gets
    SIGTERM -- its notice to checkpoint and stop -- from the kernel."""
    log = tmp_path / "log"
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, CHILD, str(log)], stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(supervisor.stdout.readline())
        _wait_for(log, "ready")
        supervisor.kill()
        supervisor.wait(30)
        _wait_for(log, "SIGTERM")
    finally:
        supervisor.kill()
        supervisor.wait(30)
    deadline = time.monotonic() + 30
    while pathlib.Path(f"/proc/{child}").exists():  # reaped by init once it has exited
        assert time.monotonic() < deadline, f"the child {child} did not exit after its notice"
        time.sleep(0.05)


def _run_child(supervisor_pid: str) -> subprocess.CompletedProcess:
    code = (
        "import os\nfrom rlax.core.runtime import recovery\nrecovery.die_with_supervisor()\n"
        f"print('went on', os.environ.get({recovery.SUPERVISOR_ENV!r}))"
    )
    env = dict(os.environ, **{recovery.SUPERVISOR_ENV: supervisor_pid})
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_child_whose_supervisor_is_already_gone_stops_at_once():
    """Named a supervisor that is not its parent (it died, the child was re-parented
    before it asked): the child takes the notice it would have been sent, at once."""
    done = _run_child(str(os.getpid() + 1 if os.getppid() != os.getpid() + 1 else 1))
    assert done.returncode == -signal.SIGTERM and "went on" not in done.stdout


def test_a_child_of_a_live_supervisor_goes_on_and_keeps_it_to_itself():
    done = _run_child(str(os.getpid()))  # this process is the child's parent
    assert done.returncode == 0 and done.stdout.strip() == "went on None"
