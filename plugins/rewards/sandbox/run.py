"""Running an untrusted program in a sandboxed subprocess: :func:`run_sandboxed`.

:func:`run_sandboxed` starts ``supervisor.py`` (see its docstring for the process
tree) with the program's files, arguments and limits; the code reward runs a
solution against its tests through it (:mod:`rlax.plugins.rewards.code.sandboxed`),
the Python tool environment each tool call. What contains a hostile program:

=====================  =====================================================
minimal world          a tmpfs root holding, read-only, only the interpreter,
                       its shared libraries and its standard library
                       (:func:`interpreter_world`; ``world.py``);
                       ``site-packages`` hidden; no host path exists there
private scratch        ``/tmp``, a size-capped tmpfs, the only writable place;
                       the work dir is ``/tmp/work``
scrubbed environment   ``PATH``, ``HOME``, ``LANG``, ``TMPDIR`` only: no
                       tokens or secrets of the caller
user namespace         its own per run, mapping one uid (the sandbox uid as
                       root, the caller's own as an ordinary user): nothing
                       the kernel keeps per user (keyrings, process counts)
                       is shared with another run; the same sandbox as root
                       and rootless
system calls           an allow-list compiled by libseccomp
                       (``seccomp.py``): keyrings, new namespaces,
                       ``ptrace``, ``bpf``, ``memfd_create``, ``userfaultfd``,
                       System V shared memory, sockets but ``AF_UNIX``, ...
                       fail with ``EPERM``
CPU time               ``RLIMIT_CPU`` per process (SIGKILL one second later)
memory                 ``RLIMIT_AS`` per process; the whole run, mapped or
                       not, ``run_memory_mb`` in its cgroup where one can be
                       had, else its resident memory watched by init
                       (``cgroup.py``; its peak in ``isolation``)
file size              ``RLIMIT_FSIZE`` (and the size-capped tmpfs)
process count          ``RLIMIT_NPROC``, counted in the run's user namespace
                       (and ``pids.max`` of its cgroup): a fork bomb hits the
                       limit, never the machine
wall time              the sandbox's init kills everything at ``wall_s``; the
                       caller kills the whole process group as a backstop
no survivors           a pid namespace whose init sweeps it; without one, the
                       process group and (as root) every process of the uid
network                a new network namespace with no interface up
privileges             no capability after ``execve``, no supplementary
                       groups, ``no_new_privs`` (setuid binaries cannot elevate)
=====================  =====================================================

The weak mode, without namespaces (no private world, no network or pid
isolation; the host's files readable as any unprivileged user can), runs only
when asked for: ``namespaces=False``, or ``allow_weak_isolation=True`` where
the kernel refuses a user namespace (otherwise such a run is an ``"error"``
naming that setting). Where ``libseccomp.so.2`` is missing, a run is an
``"error"`` naming ``allow_weak_isolation`` too, and with it runs unfiltered. It warns once per process
(:class:`WeakIsolationWarning`) and the result's ``isolation`` says so.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from typing import Any

from rlax.plugins.rewards.sandbox import exemptions
from rlax.plugins.rewards.sandbox.interpreter import interpreter_world, python_for_sandbox
from rlax.plugins.rewards.sandbox.records import Limits, SandboxResult
from rlax.plugins.rewards.sandbox.seccomp import SeccompUnavailable, filter_program

__all__ = [
    "Limits",
    "SandboxResult",
    "WeakIsolationWarning",
    "python_for_sandbox",
    "run_sandboxed",
]

_HERE = pathlib.Path(__file__).resolve().parent
SUPERVISOR = _HERE / "supervisor.py"
UID_BASE = 1_000_000  # far above any real account
GRACE_S = 10.0  # past wall_s: starting the supervisor and its world, reading the report
# The supervisor runs from -c, so that its command line (readable in the sandbox's
# /proc) names no host path; the module's directory travels in the job on stdin.
_BOOTSTRAP = (
    "import json, sys; job = json.loads(sys.stdin.read()); sys.path.insert(0, job['modules']);"
    " import supervisor; supervisor.main(job)"
)


class WeakIsolationWarning(UserWarning):
    """A sandboxed run without namespaces: no private world, network or pid isolation."""


DEFAULT_LIMITS = Limits()
_uid_lock = threading.Lock()
_uid_counter = itertools.count()
_warned = threading.Event()


def _sandbox_uid() -> int:
    """As root, a uid no other concurrent sandbox on this machine uses (pid-derived);
    as an ordinary user, that user's uid (mapped to itself in the run's user namespace)."""
    if os.geteuid() != 0:
        return os.geteuid()
    with _uid_lock:
        slot = next(_uid_counter) % 16
    return UID_BASE + (os.getpid() % 4_000_000) * 16 + slot


def _warn_weak(why: str, what: str = "namespaces") -> None:
    if not _warned.is_set():
        _warned.set()
        warnings.warn(
            f"code sandbox: running WITHOUT {what} ({why}): weaker isolation than the "
            "sandbox's own world, whose walls are listed in plugins/rewards/sandbox/run.py "
            "(warned once per process)",
            WeakIsolationWarning,
            stacklevel=3,
        )


def _supervisor_job(
    files: dict[str, str],
    argv: list[str],
    stdin: str,
    limits: Limits,
    namespaces: bool,
    allow_weak_isolation: bool,
    *,
    uid: int,
    fallback: str,
) -> dict[str, Any]:
    """What the supervisor gets on its stdin: the program and its files, the limits, the
    minimal world (none in the weak mode), the sandbox ``uid`` and a scrubbed environment;
    ``fallback`` is the host directory the weak mode works in (and its home and ``TMPDIR``)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
    if not namespaces:
        env.update(HOME=fallback, TMPDIR=fallback)
    return {
        "files": files,
        "argv": argv,
        "stdin": stdin,
        "limits": dataclasses.asdict(limits),
        "namespaces": namespaces,
        "allow_weak": allow_weak_isolation or not namespaces,
        "world": interpreter_world(argv[0]) if namespaces else {},
        "uid": uid,
        "caller_pid": os.getpid(),
        "fallback_dir": fallback,
        "env": env,
        "modules": str(_HERE),
    }


def _system_call_filter(*, weak_allowed: bool) -> bytes | str:
    """The compiled allow-list; without libseccomp, ``b""`` (weak allowed) or why not.
    A kernel whose seccomp exemptions are known exploitable is refused, weak or not."""
    try:
        exemptions.this_kernel()
    except exemptions.KernelRefused as exc:
        return str(exc)
    try:
        return filter_program()
    except SeccompUnavailable as exc:
        if not weak_allowed:
            return (
                f"the sandbox cannot filter system calls: {exc}; install libseccomp2, or "
                "accept a run without the filter with allow_weak_isolation=True"
            )
        _warn_weak(str(exc), what="a system-call filter")
        return b""


def run_sandboxed(
    files: dict[str, str],
    argv: list[str],
    *,
    stdin: str = "",
    limits: Limits = DEFAULT_LIMITS,
    namespaces: bool = True,
    allow_weak_isolation: bool = False,
    deadline: float | None = None,
) -> SandboxResult:
    """Runs ``argv`` in a sandbox whose work dir holds ``files``.

    Args:
      files: file name -> text, written into the fresh work dir.
      argv: the program and its arguments (``argv[0]`` the interpreter).
      stdin: the program's standard input.
      limits: resource limits.
      namespaces: isolate with namespaces and the minimal world; False asks for
        the weak mode (warned once per process).
      allow_weak_isolation: where the kernel refuses namespaces, run in the weak
        mode anyway (warned) instead of returning an ``"error"`` result.
      deadline: the call's ``time.monotonic()`` deadline (default: ``wall_s``
        plus ``GRACE_S`` from now); the supervisor is killed there.

    Returns:
      ``"finished"``, ``"timeout"`` or ``"error"``, with the outputs channel.
    """
    if not namespaces:
        _warn_weak("namespaces=False")
    if deadline is None:
        deadline = time.monotonic() + limits.wall_s + GRACE_S
    uid = _sandbox_uid()
    seccomp = _system_call_filter(weak_allowed=allow_weak_isolation or not namespaces)
    if isinstance(seccomp, str):
        return SandboxResult("error", detail=seccomp, uid=uid)
    fallback = tempfile.mkdtemp(prefix="rlax-sandbox-")
    job = _supervisor_job(
        files, argv, stdin, limits, namespaces, allow_weak_isolation, uid=uid, fallback=fallback
    )
    job["seccomp"] = seccomp.hex()
    proc = subprocess.Popen(  # the interpreter the program sees: its path is no news there
        [python_for_sandbox(), "-I", "-S", "-c", _BOOTSTRAP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        start_new_session=True,
    )
    try:
        timeout = max(0.0, deadline - time.monotonic())
        out, err = proc.communicate(json.dumps(job).encode(), timeout=timeout)
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
    isolation = report["isolation"]
    isolation["filter_exemptions"] = exemptions.this_kernel()
    if isolation.get("filesystem") == "host temporary directory":
        _warn_weak(isolation.get("network_reason") or isolation.get("filesystem_reason", "?"))
    fields = {
        "network_isolated": bool(isolation.get("network")),
        "isolation": isolation,
        "returncode": report["returncode"],
        "signal": report["signal"],
        "stdout": report["stdout"],
        "stderr": report["stderr"],
        "uid": report["uid"],
        "wall_s": report["wall_s"],
        "channel": report["channel"],
    }
    if report["timed_out"]:
        return SandboxResult("timeout", detail="wall-clock limit reached", **fields)
    return SandboxResult("finished", **fields)
