"""What a restart costs: the seconds from a notice (or a kill) to the first useful work
after it, in parts, and the work done again.

A restarted role is useful again at its first useful work: the trainer's next completed
step, a worker's next submitted group. Between the event and that moment the time goes
to, in order (each part a wall-clock interval; the parts add up to ``total_s``)::

    stop        the notice -> the old process stopped (the trainer finishes its step and
                checkpoints; a worker submits or hands in its batch); 0 after a kill
    exit        stopped -> its exit seen by the supervisor (interpreter teardown)
    restart     the exit (or the kill) seen -> the new process exists
    imports     process start -> the role begins (Python, imports, plugins, gin)
    backend     JAX's backend initialised
    load        the model built (the trainer: the base policy; a worker: the sampler)
    restore     the trainer's checkpoint restored
    weights     weights republished (the trainer, with the queue rolled back) or pulled
                (a worker)
    refill      waiting for work: the trainer for its first batch, a worker for a lease
    first_work  the first step (train, publish) or the first batch (generate, score, submit)

``compile_s`` is the part of these spent compiling (tracing, lowering, XLA or reading the
program from the persistent cache, :mod:`rlax.core.runtime.compile_cache`), inside the
parts above; ``compile_misses`` the programs compiled rather than read back, and
``compile_missed`` their cache keys (``recovery.jsonl`` only): a key whose entry was in the
cache before the process started would be a program compiled twice.

The supervisor (:mod:`rlax.core.launch.local_cluster`) tells a restarted child what
happened in :data:`RESTART_ENV` (a JSON object: ``status``, ``exited_at``, and
``noticed_at`` / ``stopped_at`` when the previous process stopped on a notice, which it
wrote to the file :data:`NOTICE_FILE_ENV` names: :func:`write_notice`). Without it (a
cluster scheduler restarted the process) the clock starts at the process's own start.

Each role keeps one :class:`RecoveryClock` per process (:func:`begin`); at the first
useful work :meth:`RecoveryClock.finish` gives the figures, appended as one line to
``RUN/recovery.jsonl`` (:class:`rlax.core.runtime.run_dir.RunDir`) when the role knows its
run directory; the trainer also puts them into that step's metrics row as
``recovery/<figure>``. ``rlax show`` lists them.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import pathlib
import signal
import sys
import threading
import time
from typing import Any

from rlax.core.runtime import compile_cache
from rlax.core.runtime.run_dir import RunDir, read_json_lines

__all__ = [
    "FIGURES",
    "NOTICE_FILE_ENV",
    "PARTS",
    "RESTART_ENV",
    "SUPERVISOR_ENV",
    "RecoveryClock",
    "begin",
    "current",
    "die_with_supervisor",
    "exit_promptly",
    "mark",
    "process_started_at",
    "read_rows",
    "start_process",
    "write_notice",
]

log = logging.getLogger("rlax.recovery")

RESTART_ENV = "RLAX_RESTART"
NOTICE_FILE_ENV = "RLAX_NOTICE_FILE"
#: The supervisor's pid, in the environment of each process it starts
#: (:func:`die_with_supervisor`).
SUPERVISOR_ENV = "RLAX_SUPERVISOR_PID"
_PR_SET_PDEATHSIG = 1

#: The parts of a recovery, in the order they happen (see the module doc).
PARTS = (
    "stop",
    "exit",
    "restart",
    "imports",
    "backend",
    "load",
    "restore",
    "weights",
    "refill",
    "first_work",
)

#: A recovery's numbers (a row of ``recovery.jsonl`` adds ``role``, ``cause`` and ``time``).
FIGURES = (
    "total_s",
    *(f"{part}_s" for part in PARTS),
    "compile_s",
    "compile_hits",
    "compile_misses",
    "restarts",
    "redone_steps",
    "redone_tokens",
)

_clock: RecoveryClock | None = None
_begun_in_process = False  # a second begin in one process (a test) starts at that moment


def process_started_at() -> float:
    """When this process started (Unix seconds), from ``/proc``; now where that is unreadable."""
    try:
        fields = pathlib.Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime, in clock ticks after boot
        uptime = float(pathlib.Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return time.time()
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def write_notice(noticed_at: float, reason: str) -> None:
    """Tells the supervisor when this process got its notice and stopped (if it asked)."""
    path = os.environ.get(NOTICE_FILE_ENV)
    if not path:
        return
    record = {"noticed_at": noticed_at, "stopped_at": time.time(), "reason": reason}
    try:
        pathlib.Path(path).write_text(json.dumps(record))
    except OSError as err:  # the figures are worth less than the stop
        log.warning("recovery: cannot write the notice record %s: %s", path, err)


def die_with_supervisor() -> None:
    """A process the supervisor started (:data:`SUPERVISOR_ENV` names it) gets SIGTERM -- a
    notice: it checkpoints and stops -- when the supervisor dies (``PR_SET_PDEATHSIG``); if
    it died before this was asked for, the process sends itself that notice now.

    Asked for here, after ``exec``, not by the supervisor between ``fork`` and ``exec``: a
    ``preexec_fn`` makes Python fork the supervisor -- a process with gRPC's threads running
    -- with every ``fork`` handler, and gRPC's restart a poller in the child that then
    fails on a closed descriptor and aborts it before ``exec`` (grpc/grpc#43055; beside a
    gRPC server and a busy channel, 8 of 500 children died so, and 0 of 1,000 started
    without one). Without it, Python starts the child with ``vfork``: no handler runs.
    """
    supervisor = os.environ.pop(SUPERVISOR_ENV, None)  # not for this process's children
    if not supervisor or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(supervisor):  # gone already: the notice it would have sent
        os.kill(os.getpid(), signal.SIGTERM)


def start_process() -> None:
    """What an ``rlax`` command does first about the processes around it: it ends with the
    supervisor that started it (:func:`die_with_supervisor`), and gRPC's fork handlers are
    off (``GRPC_ENABLE_FORK_SUPPORT=0`` unless set; read when gRPC starts, after this):
    they serve a child that goes on using gRPC without ``exec``, and rlax forks only to
    ``exec`` (a role's children, a sandbox), where they can abort the child."""
    die_with_supervisor()
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")


def exit_promptly(status: int) -> None:
    """Ends the process with ``status`` as the interpreter would, less its module teardown.

    What a normal exit does for the program is done: other non-daemon threads are joined,
    ``atexit`` functions run (loggers finish, temporary folders go), logging and the
    standard streams are flushed; then :func:`os._exit`. Skipped: freeing every module and
    object one by one, which for a process holding JAX takes about half a second and is
    part of every restart's ``exit`` (the supervisor restarts a role once it has exited).
    Role processes end through this (``python -m rlax.core.cli``).
    """
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    import atexit

    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing left to lose
            pass
    os._exit(status)


def _cause(status: int) -> str:
    from rlax.core.errors import EXIT_PREEMPTED

    if status == EXIT_PREEMPTED:
        return "preempted"
    return "killed" if status < 0 else "crashed"


class RecoveryClock:
    """The parts of one process's way back to useful work (see the module doc).

    Args:
      role: the role's name in the rows (``trainer``, ``worker-0``).
      started_at: when the clock starts counting this process's own parts (its start).
      restart: what the supervisor said (:data:`RESTART_ENV`), or None.
      run_dir: where ``recovery.jsonl`` is (None: the figures are logged only).
    """

    def __init__(
        self,
        role: str,
        started_at: float,
        restart: dict[str, Any] | None = None,
        run_dir: RunDir | None = None,
    ):
        if run_dir is None and restart and restart.get("run_dir"):
            run_dir = RunDir(pathlib.Path(restart["run_dir"]))  # the supervisor's children's
        self.role, self.restart, self.run_dir = role, restart, run_dir
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.event_at = started_at
        if restart:
            # The moments come from three clocks (this process, the supervisor, /proc's
            # 10 ms ticks for the start): each is taken no earlier than the one before it,
            # so the parts are back to back and add up to the total exactly.
            exited = float(restart["exited_at"])
            if restart.get("noticed_at") is not None:
                noticed = float(restart["noticed_at"])
                stopped = max(float(restart["stopped_at"]), noticed)
                exited = max(exited, stopped)
                self.event_at = noticed
                self.seconds["stop"] = stopped - noticed
                self.seconds["exit"] = exited - stopped
            else:
                self.event_at = exited
            started_at = max(started_at, exited)
            self.seconds["restart"] = started_at - exited
        self._mark = started_at
        self._compile = compile_cache.counts()
        self.finished = False

    @property
    def cause(self) -> str:
        """``preempted``, ``killed``, ``crashed``; ``resume`` without the supervisor's word."""
        return _cause(int(self.restart["status"])) if self.restart else "resume"

    def mark(self, part: str) -> None:
        """Counts the time since the last mark as ``part`` (a part marked twice adds up)."""
        now = time.time()
        self.seconds[part] += max(now - self._mark, 0.0)
        self._mark = now

    def init_backend(self) -> RecoveryClock:
        """Starts JAX's backend now (it would at the first array), timed as ``backend``."""
        import jax  # here: the supervisor imports this module and never starts JAX

        jax.devices()
        self.mark("backend")
        return self

    @property
    def is_restart(self) -> bool:
        """Whether the supervisor restarted this process (it said how the last one ended)."""
        return self.restart is not None

    def finish(self, within: dict[str, float] | None = None, **redone: float) -> dict[str, Any]:
        """At the first useful work: the figures, appended to ``RUN/recovery.jsonl`` when
        the run directory is known.

        Args:
          within: parts of the time since the last mark, in seconds (the trainer's first
            step: its wait for rollouts is ``refill``); the rest is ``first_work``.
          redone: the work done again (``redone_steps``, ``redone_tokens``).
        """
        now = time.time()
        for part, s in (within or {}).items():
            s = min(max(s, 0.0), max(now - self._mark, 0.0))
            self.seconds[part] += s
            self._mark += s
        self.mark("first_work")
        self.finished = True
        now_counts = compile_cache.counts()
        row: dict[str, Any] = {
            "role": self.role,
            "cause": self.cause,
            "restarts": int(self.restart.get("restarts", 0)) if self.restart else 0,
            "time": time.time(),
            "total_s": self._mark - self.event_at,  # the last mark: the parts' end
            **{f"{part}_s": s for part, s in self.seconds.items()},
            "compile_s": now_counts.compile_s - self._compile.compile_s,
            "compile_hits": now_counts.hits - self._compile.hits,
            "compile_misses": now_counts.misses - self._compile.misses,
            "compile_missed": list(now_counts.missed[len(self._compile.missed) :]),
            **redone,
        }
        if self.run_dir is not None:
            with self.run_dir.recovery.open("a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")
        log.info(
            "%s: useful again %.1f s after the %s (%s)",
            self.role,
            row["total_s"],
            "notice" if self.seconds["stop"] else "exit",
            ", ".join(f"{p} {s:.1f}" for p, s in self.seconds.items() if s >= 0.05),
        )
        return row


def begin(role: str, run_dir: RunDir | pathlib.Path | None = None) -> RecoveryClock:
    """This process's clock for ``role`` (at the role's start; ``imports`` is counted to now).

    The first clock of a process starts at the process's start; a later one (a role run
    again in the same process, as tests do) at this moment.
    """
    global _clock, _begun_in_process
    started_at = time.time() if _begun_in_process else process_started_at()
    _begun_in_process = True
    compile_cache.listen()
    raw = os.environ.get(RESTART_ENV)
    restart = json.loads(raw) if raw else None
    _clock = RecoveryClock(
        role, started_at, restart, RunDir.of(run_dir) if run_dir is not None else None
    )
    _clock.mark("imports")
    return _clock


def mark(part: str) -> None:
    """:meth:`RecoveryClock.mark` on this process's clock, if it has one being counted."""
    if (clock := current()) is not None:
        clock.mark(part)


def current() -> RecoveryClock | None:
    """The clock :func:`begin` made in this process, until its figures are taken."""
    return _clock if _clock is not None and not _clock.finished else None


def read_rows(run_dir: RunDir | pathlib.Path) -> list[dict[str, Any]]:
    """The run's recovery rows, oldest first (a torn last line is skipped)."""
    return read_json_lines(RunDir.of(run_dir).recovery)
