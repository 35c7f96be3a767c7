"""The parameter-server role and the local cluster that runs every role on one machine.

``rlax run --gin F`` (role ``all``) is :func:`local_cluster`: it starts the
parameter server, then the trainer and ``num_workers`` workers as child
processes of this one — each is ``rlax run`` with the same gin files and
bindings and its own ``--role`` — and supervises them. The server's address
and a fresh token reach the children through the environment. A child that
exits — preempted (status 75) or crashed — is reported by name, pid and
status and restarted, as a cluster scheduler would, up to ``max_restarts``
times each; past that the run fails. A child that stops on a configuration
error (status 2) is not restarted: restarting cannot fix a setting. It hands
its one-line message to the supervisor (a file named by
``RLAX_USAGE_ERROR_FILE``) instead of printing it, and the run ends with status
2 and that line, once, however many workers refused the same setting. When the trainer finishes, the workers
and the server are stopped and the trainer's status is the run's. A notice to
the supervisor itself (SIGTERM, SIGINT) is passed on to every child; the
trainer checkpoints, and the run exits with status 75, to be resumed by
running the same command with the same ``--run-dir`` (the CLI prints it,
with ``--resume RUN``).

A restarted child is told what happened to the one before it (the environment's
``RLAX_RESTART``: its exit status, when the exit was seen, and when it got its notice and
stopped, which a stopping child writes to the file ``RLAX_NOTICE_FILE`` names), so it can
count its way back to useful work (:mod:`rlax.core.runtime.recovery`). The parameter
server's way back is timed here: from its exit to answering again, one line in
``RUN/recovery.jsonl``.

The parameter server keeps its state in ``state_dir`` (the run directory's
``param_server/`` under ``rlax run``): the rollout queue in SQLite and the
newest weights with orbax, so a restarted server loses nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlax.core.errors import EXIT_PREEMPTED, EXIT_USAGE, USAGE_ERROR_FILE_ENV
from rlax.core.parallel.in_process_env import role_devices_env
from rlax.core.parallel.process_env import PARAM_SERVER, TRAINER, plan_children, worker_name
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.settings import ADDRESS_ENV, TOKEN_ENV, ServerSettings
from rlax.core.runtime import recovery
from rlax.core.runtime.preemption import FINISH_SIGNAL, Preemption
from rlax.core.runtime.run_dir import RunDir
from rlax.core.worker.spec import WORKER_ID_ENV

if TYPE_CHECKING:
    from rlax.core.spec import RunSpec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_SIGTERM = signal.SIGTERM  # for _Child, whose own `signal` method hides the module


class _Child:
    """One supervised process; ``start`` (re)launches it with the same command.

    Each process it starts is sent one stop signal at most (:meth:`signal`): a process
    that has handled its notice puts the default handlers back while it exits, so a
    second SIGTERM would kill it before it says why it stopped.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        cores: Sequence[int] | None,
        reports: pathlib.Path | None = None,
    ):
        self.name, self.argv, self.env, self.cores = name, argv, env, cores
        self.report = reports / name if reports is not None else None
        self.notice = reports / f"{name}.notice" if reports is not None else None
        if self.report is not None:  # a usage error comes back here, not on stderr
            self.env = dict(env, **{USAGE_ERROR_FILE_ENV: str(self.report)})
        if self.notice is not None:  # a preempted process says when it got its notice
            self.env = dict(self.env, **{recovery.NOTICE_FILE_ENV: str(self.notice)})
        self.restarts = 0
        self.start()

    def usage_error(self) -> str | None:
        """The usage error the process reported before it exited EXIT_USAGE, if any."""
        try:
            return self.report.read_text() if self.report is not None else None
        except OSError:
            return None

    def what_happened(self, code: int, exited_at: float) -> dict[str, Any]:
        """The restarted process's :data:`recovery.RESTART_ENV`: how the last one ended."""
        said: dict[str, Any] = {}
        if self.notice is not None and self.notice.exists():
            try:
                said = json.loads(self.notice.read_text())
            except (OSError, json.JSONDecodeError):
                said = {}
        run_dir = _run_dir_in(self.argv)
        where = {"run_dir": str(run_dir)} if run_dir is not None else {}
        return {"status": code, "exited_at": exited_at, "restarts": self.restarts, **where, **said}

    def start(self, restart: dict[str, Any] | None = None) -> None:
        """Starts the process; ``restart``: how the one before it ended."""
        if self.notice is not None:
            self.notice.unlink(missing_ok=True)
        env = dict(self.env, **{recovery.SUPERVISOR_ENV: str(os.getpid())})  # it dies with us
        if restart:
            env[recovery.RESTART_ENV] = json.dumps(restart)
        self.started_at = time.time()
        self.proc = subprocess.Popen(self.argv, env=env)  # no preexec_fn: see start_process
        self.signalled: int | None = None  # the stop signal this process was sent
        if self.cores:
            os.sched_setaffinity(self.proc.pid, set(self.cores))

    def signal(self, sig: int) -> None:
        """Sends ``sig`` unless the process has exited or was already sent a stop signal."""
        if self.signalled is None and self.proc.poll() is None:
            self.signalled = sig
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 10.0, sig: int = _SIGTERM) -> None:
        """Signals the process (:meth:`signal`), waits ``timeout`` seconds, then kills it."""
        self.signal(sig)
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def describe_status(code: int) -> str:
    """'preempted (status 75)', 'killed by SIGKILL', 'status 1'."""
    if code == EXIT_PREEMPTED:
        return f"preempted (status {code})"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"status {code}"


def _wait_ready(settings: ServerSettings, server: _Child, timeout_s: float = 120.0) -> int | None:
    """None once the server answers; its exit status if it exited at start."""
    client = ParamServerClient(settings, retry_s=0.0)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if server.proc.poll() is not None:
                return server.proc.returncode
            try:
                client.stat()
                return None
            except Exception:  # noqa: BLE001 -- not listening yet
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"parameter server not reachable after {timeout_s:.0f}s"
                    ) from None
                time.sleep(0.2)
    finally:
        client.close()


def local_cluster(
    spec: RunSpec, *, argv: Sequence[str], env: Mapping[str, str] | None = None
) -> int:
    """Runs parameter server, trainer and workers as supervised child processes.

    Args:
      spec: the run; the supervisor's own settings are ``spec.local_cluster``
        (:class:`rlax.core.spec.ClusterSpec`: how many workers, how often a child is
        restarted, the supervisor's notice sources). ``spec.placement`` gives each child
        its devices and cores (:func:`rlax.core.parallel.process_env.plan_children`: the
        visible-devices and memory variables on GPU, the per-process chip variables on
        TPU, CPU cores); in the in-process placements the trainer's process samples too
        and no worker process is started. The server listens at
        ``spec.server.address`` with its port replaced by a free one unless
        RLAX_PS_ADDRESS is set.
      argv: the ``rlax run`` arguments without ``--role``; each child gets them plus
        its role.
      env: more environment for every child (the specification's digest).

    Returns:
      The trainer's exit status; 75 if the run was preempted; 2 if a child
      stopped on a configuration error (which it printed); 1 if a child failed
      more than ``max_restarts`` times.
    """
    own = spec.local_cluster
    env = {**_cluster_env(), **(env or {})}
    placed, devices = plan_children(spec.placement, workers=own.num_workers)
    base = [sys.executable, "-m", "rlax.core.cli", "run", *argv]
    stop = Preemption(own.preemption_notices, role="local").start()
    reports = pathlib.Path(tempfile.mkdtemp(prefix="rlax-usage-errors-"))

    def child(name: str, role: str, extra: dict[str, str] | None = None) -> _Child:
        own_env = {**env, **(extra or {}), **devices[name].env}
        if name == TRAINER:  # which of its devices are the trainer's, which the sampler's
            own_env.update(role_devices_env(placed))
        return _Child(name, [*base, "--role", role], own_env, devices[name].cores, reports)

    server = child(PARAM_SERVER, "param_server")
    children = [server]
    status = 1
    settings = dataclasses.replace(spec.server, address=env[ADDRESS_ENV], token=env[TOKEN_ENV])
    try:
        exited = _wait_ready(settings, server)
        if exited is not None:
            status = _start_failure(server, exited)
            return status
        trainer = child(TRAINER, "trainer")
        children.append(trainer)
        # In the in-process placements the trainer's process samples too: no worker processes.
        for i in range(own.num_workers if placed.mode == "processes" else 0):
            children.append(child(worker_name(i), "worker", {WORKER_ID_ENV: worker_name(i)}))
        timer = _ServerRecovery(settings, _run_dir_in(argv))
        status = _supervise(trainer, children, own.max_restarts, stop, timer)
        return status
    finally:
        stop.close()
        _end_children(children, status)
        shutil.rmtree(reports, ignore_errors=True)


def _cluster_env() -> dict[str, str]:
    """The children's environment: this one, plus a free local server address and a
    fresh token unless RLAX_PS_ADDRESS / RLAX_PS_TOKEN already set them."""
    env = dict(os.environ)
    env.setdefault(ADDRESS_ENV, f"127.0.0.1:{_free_port()}")
    env.setdefault(TOKEN_ENV, secrets.token_hex(16))
    return env


def _start_failure(server: _Child, exited: int) -> int:
    """The run's status when the server exited at start with ``exited``."""
    if exited == EXIT_USAGE:
        _say_usage_error(server)
        return EXIT_USAGE
    print(
        f"rlax: parameter server exited at start with {describe_status(exited)}",
        file=sys.stderr,
        flush=True,
    )
    return 1


def _say_usage_error(child: _Child) -> None:
    """Prints the usage error ``child`` reported, as its one line (the others' are dropped)."""
    if message := child.usage_error():
        print(f"rlax: error: {message}", file=sys.stderr, flush=True)


def _end_children(children: list[_Child], status: int) -> None:
    """Stops every child: all signalled at once, then each waited for, the server last.

    A finished run, or one a child refused for its settings, ends the others
    quietly (FINISH_SIGNAL); anything else is a notice (SIGTERM).
    """
    sig = FINISH_SIGNAL if status in (0, EXIT_USAGE) else signal.SIGTERM
    for child in children:
        child.signal(sig)
    for child in reversed(children):
        child.stop(sig=sig)


def _supervise(
    trainer: _Child,
    children: list[_Child],
    max_restarts: int,
    stop: Preemption,
    timer: _ServerRecovery | None = None,
) -> int:
    while True:
        if stop.requested:
            return _stop_all(trainer, children)
        for child in children:
            code = child.proc.poll()
            if code is None:
                continue
            if child is trainer and code == 0:
                return 0
            if code == EXIT_USAGE:  # a configuration error: restarting cannot fix it
                _say_usage_error(child)
                return EXIT_USAGE
            what = f"rlax: {child.name} (pid {child.proc.pid}) died with {describe_status(code)}"
            if child.restarts >= max_restarts:
                print(
                    f"{what}; restarted {child.restarts} times already (max_restarts); "
                    "stopping the run",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            exited_at = time.time()  # within one poll (0.2 s) of the exit
            child.restarts += 1
            print(
                f"{what}; restarting it ({child.restarts}/{max_restarts})",
                file=sys.stderr,
                flush=True,
            )
            restart = child.what_happened(code, exited_at)
            child.start(restart)
            if timer is not None and child.name == "param_server":
                timer.time(child, restart)
        stop.wait(0.2)


def _run_dir_in(argv: Sequence[str]) -> RunDir | None:
    """The ``--run-dir`` the children are given, if any."""
    args = list(argv)
    return RunDir(pathlib.Path(args[args.index("--run-dir") + 1])) if "--run-dir" in args else None


class _ServerRecovery:
    """Times a restarted parameter server's way back: from the exit (or notice) to the
    moment it answers again, a line in ``RUN/recovery.jsonl`` (its own parts -- imports,
    reading its queue and weights back -- are one, ``first_work``)."""

    def __init__(self, settings: ServerSettings, run_dir: RunDir | None):
        self.settings, self.run_dir = settings, run_dir

    def time(self, server: _Child, restart: dict[str, Any]) -> None:
        args = (server.proc, server.started_at, restart)
        threading.Thread(target=self._wait, args=args, daemon=True).start()

    def _wait(self, proc: subprocess.Popen, started_at: float, restart: dict[str, Any]) -> None:
        client = ParamServerClient(self.settings, retry_s=0.0)
        try:
            while proc.poll() is None:
                try:
                    client.stat()
                    break
                except Exception:  # noqa: BLE001 -- not listening yet
                    time.sleep(0.05)
            else:
                return  # it died again before it answered
        finally:
            client.close()
        clock = recovery.RecoveryClock("param_server", started_at, restart, self.run_dir)
        clock.finish()


def _stop_all(trainer: _Child, children: list[_Child], timeout_s: float = 120.0) -> int:
    """Passes the notice on: SIGTERM to the trainer and the workers, then waits for the
    trainer's checkpoint; the parameter server is stopped last (by the caller), so the
    trainer can finish its step (publish, acknowledge) and the workers their submits."""
    for child in children:
        if child.name != "param_server":
            child.signal(signal.SIGTERM)
    try:
        code = trainer.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        print(f"rlax: trainer did not stop within {timeout_s:.0f}s of the notice", file=sys.stderr)
        return 1
    print(
        f"rlax: stopped on a preemption notice; trainer {describe_status(code)}",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_PREEMPTED if code in (0, EXIT_PREEMPTED) else code
