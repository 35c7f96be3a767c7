"""Running untrusted Python against tests in a sandboxed subprocess.

:func:`run_sandboxed` starts ``sandbox_supervisor.py`` (see its docstring for
the process tree) and returns a :class:`SandboxResult`. What contains a
hostile program, and what it defends against:

=====================  =====================================================
fresh temporary dir    a private tmpfs (its own mount namespace) or a new
                       ``mkdtemp`` directory, removed afterwards
scrubbed environment   ``PATH``, ``HOME``, ``LANG``, ``TMPDIR`` only: no
                       tokens or secrets of the caller
CPU time               ``RLIMIT_CPU`` per process (SIGKILL one second later)
memory                 ``RLIMIT_AS``
file size              ``RLIMIT_FSIZE`` (and a size-capped tmpfs)
process count          ``RLIMIT_NPROC`` under a uid of its own: a fork bomb
                       hits the limit, never the machine (root is exempt from
                       this limit, hence the unprivileged uid)
wall time              the sandbox's init kills everything at ``wall_s``; the
                       caller kills the whole process group as a backstop
no survivors           a pid namespace whose init sweeps it; without one, the
                       process group and (as root) every process of the uid
network                a new network namespace with no interface up; where
                       the OS refuses, ``network_isolated`` is False and the
                       reward says so in its reason
privileges             dropped to the sandbox uid, no supplementary groups,
                       ``no_new_privs`` (setuid binaries cannot elevate)
=====================  =====================================================

The verdict comes from the harness through its own channel (see
``sandbox_harness.py``), never from what the program prints. The harness runs
the tests in the program's interpreter, so a program written to dig the
per-run nonce out of the harness's memory could forge a verdict; treat the
verdict as proof against accidents and ordinary reward hacking (early exit,
fake output, killing the parent), not against an adversary that targets this
harness by name.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from typing import Any

__all__ = ["Limits", "SandboxResult", "python_for_sandbox", "run_python_tests", "run_sandboxed"]

_HERE = pathlib.Path(__file__).resolve().parent
SUPERVISOR = _HERE / "sandbox_supervisor.py"
HARNESS = _HERE / "sandbox_harness.py"
UID_BASE = 1_000_000  # far above any real account


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
    """

    cpu_s: int = 5
    wall_s: float = 10.0
    memory_mb: int = 512
    file_mb: int = 16
    processes: int = 16
    open_files: int = 64

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) <= 0:
                raise ValueError(f"sandbox limit {field.name} must be > 0")


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What happened in one sandboxed run.

    Attributes:
      status: ``"passed"`` (every test), ``"failed"`` (the harness ran the
        tests, not all passed), ``"no_verdict"`` (the program ended without the
        harness reporting: an early exit, a crash, a kill), ``"timeout"``, or
        ``"error"`` (the sandbox itself failed).
      passed: tests passed, per the harness (0 without a verdict).
      total: tests run, per the harness (0 without a verdict).
      detail: the first failure, or why there is no verdict.
      network_isolated: whether the program ran without network access.
      isolation: what the supervisor applied (namespaces, filesystem, cleanup).
      returncode: the program's exit status, if it exited.
      signal: the signal that ended the program, if one did.
      stdout: the start of what the program printed (for logs only).
      stderr: the start of its error output.
      uid: the uid the program ran as.
      wall_s: seconds the program ran.
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


_uid_lock = threading.Lock()
_uid_counter = itertools.count()


def _sandbox_uid() -> int:
    """A uid no other concurrent sandbox on this machine uses (pid-derived)."""
    with _uid_lock:
        slot = next(_uid_counter) % 16
    return UID_BASE + (os.getpid() % 4_000_000) * 16 + slot


def _world_executable(path: pathlib.Path) -> bool:
    """True if an unprivileged user can execute ``path`` (every parent traversable)."""
    try:
        if not path.stat().st_mode & stat.S_IXOTH:
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in path.parents)
    except OSError:
        return False


@functools.cache
def python_for_sandbox() -> str:
    """A Python interpreter that the unprivileged sandbox uid can run."""
    candidates = [
        pathlib.Path(sys.executable).resolve(),
        *(pathlib.Path(p).resolve() for p in ("/usr/bin/python3", "/usr/local/bin/python3")),
    ]
    if os.geteuid() != 0:
        return str(candidates[0])
    for candidate in candidates:
        if candidate.is_file() and _world_executable(candidate):
            return str(candidate)
    raise RuntimeError(
        "no Python interpreter is executable by an unprivileged user "
        f"(tried {', '.join(map(str, candidates))})"
    )


def run_sandboxed(
    files: dict[str, str],
    argv: list[str],
    *,
    limits: Limits = Limits(),
    namespaces: bool = True,
) -> SandboxResult:
    """Runs ``argv`` in a sandbox whose work dir holds ``files``.

    Args:
      files: file name -> text, written into the fresh work dir.
      argv: the program and its arguments (``argv[0]`` an absolute path).
      limits: resource limits.
      namespaces: use Linux namespaces where the OS allows (off: test the
        fallback, or run where namespaces are known to misbehave).

    Returns:
      The result; the verdict fields come from the harness's channel.
    """
    fallback = tempfile.mkdtemp(prefix="rlax-sandbox-")
    uid = _sandbox_uid()
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
    if not namespaces:
        env.update(HOME=fallback, TMPDIR=fallback)
    job = {
        "files": files,
        "argv": argv,
        "limits": dataclasses.asdict(limits),
        "namespaces": namespaces,
        "uid": uid,
        "caller_pid": os.getpid(),
        "fallback_dir": fallback,
        "env": env,
    }
    proc = subprocess.Popen(
        [python_for_sandbox() if os.geteuid() != 0 else sys.executable, "-I", "-S",
         str(SUPERVISOR)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(json.dumps(job).encode(), timeout=limits.wall_s + 10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return SandboxResult("timeout", detail="the sandbox supervisor did not finish", uid=uid)
    finally:
        shutil.rmtree(fallback, ignore_errors=True)
    return _result(out, err, uid)


def _result(out: bytes, err: bytes, uid: int) -> SandboxResult:
    try:
        report = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        detail = f"supervisor gave no report: {err.decode(errors='replace')[-300:]}"
        return SandboxResult("error", detail=detail, uid=uid)
    if "supervisor_error" in report:
        return SandboxResult("error", detail=report["supervisor_error"], uid=uid)
    verdict = report["verdict"]
    fields = {
        "network_isolated": bool(report["isolation"].get("network")),
        "isolation": report["isolation"],
        "returncode": report["returncode"],
        "signal": report["signal"],
        "stdout": report["stdout"],
        "stderr": report["stderr"],
        "uid": report["uid"],
        "wall_s": report["wall_s"],
    }
    if report["timed_out"]:
        return SandboxResult("timeout", detail="wall-clock limit reached", **fields)
    if verdict is None:
        how = (
            f"killed by signal {report['signal']}"
            if report["signal"]
            else f"exit status {report['returncode']}"
        )
        return SandboxResult("no_verdict", detail=f"no verdict from the harness ({how})", **fields)
    passed, total = int(verdict["passed"]), int(verdict["total"])
    status = "passed" if total > 0 and passed == total else "failed"
    return SandboxResult(status, passed, total, verdict.get("failure", ""), **fields)


def run_python_tests(
    solution: str, tests: dict[str, Any], *, limits: Limits = Limits(), namespaces: bool = True
) -> SandboxResult:
    """Runs ``solution`` against ``tests`` (see ``sandbox_harness.py``) in the sandbox."""
    files = {
        "harness.py": HARNESS.read_text(),
        "solution.py": solution,
        "tests.json": json.dumps(tests),
    }
    argv = [python_for_sandbox(), "-I", "-S", "-B", "harness.py"]
    return run_sandboxed(files, argv, limits=limits, namespaces=namespaces)
