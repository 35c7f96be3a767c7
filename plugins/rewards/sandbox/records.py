"""What a sandboxed run is given and what it gives back (re-exported by ``run``)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run.

    Attributes:
      cpu_s: CPU seconds per process.
      wall_s: wall-clock seconds for the whole run.
      memory_mb: address space per process.
      file_mb: largest file the program may write.
      processes: processes (and threads) the sandbox uid may have at once.
      open_files: open file descriptors per process.
      run_memory_mb: memory of the whole run, all its processes together,
        mapped or not (pipe buffers, files in its ``/tmp``): the run's cgroup
        (``sandbox/cgroup.py``), where one can be had.
    """

    cpu_s: int = 5
    wall_s: float = 10.0
    memory_mb: int = 512
    file_mb: int = 16
    processes: int = 16
    open_files: int = 64
    run_memory_mb: int = 1024

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) <= 0:
                raise ValueError(f"sandbox limit {field.name} must be > 0")


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What happened in one sandboxed run.

    Attributes:
      status: ``"passed"`` (every test), ``"failed"`` (not all passed),
        ``"no_verdict"`` (no output for any test: an early exit, a crash, a
        kill), ``"timeout"``, ``"error"`` (the sandbox itself failed), or
        ``"finished"`` (:func:`run_sandboxed` alone: the program ended).
      passed: tests whose output matched, counted by the trusted side.
      total: the plan's number of tests (never the program's claim).
      detail: the first failure, or why there is no verdict.
      network_isolated: whether the program ran without network access.
      isolation: what the supervisor applied (namespaces, filesystem, cleanup).
      returncode: the program's exit status, if it exited.
      signal: the signal that ended the program, if one did.
      stdout: the start of what the program printed (for logs only).
      stderr: the start of its error output.
      uid: the uid the program ran as.
      wall_s: seconds the program ran.
      channel: what the program wrote to its outputs channel (fd 3).
      verdict_by: ``"supervisor"`` (outputs compared here) or ``"program"``
        (the weak asserts mode: the harness's own word).
    """

    status: str
    passed: int = 0
    total: int = 0
    detail: str = ""
    network_isolated: bool = False
    isolation: dict[str, Any] = dataclasses.field(default_factory=dict)
    returncode: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    uid: int = -1
    wall_s: float = 0.0
    channel: str = ""
    verdict_by: str = "supervisor"
