"""The sandbox's trusted side: namespaces, limits, privilege drop, capture, cleanup.

Started by :func:`rlax.plugins.rewards.code_sandbox.run_sandboxed` as
``python -I -S -c BOOTSTRAP`` (standard library only; the bootstrap reads the
JSON job from stdin and calls :func:`main`, so no host path shows in any
command line the program could read); it prints one JSON report on stdout.
The process tree::

    caller ── supervisor (root; new network, mount, IPC, UTS namespaces)
                └── init (pid 1 of a new pid namespace; root; the minimal world)
                      └── program (own session; unprivileged uid; rlimits; no new privileges)

Each link dies with its parent (``PR_SET_PDEATHSIG``), and when ``init`` exits
the kernel kills every process left in its pid namespace, so no daemon, fork
or orphan outlives the call. Without namespaces (not root, or the kernel
refuses) the program runs only when the job allows the weak mode; it then
still runs under its own uid (when root), limits and session, is swept by uid
and process group, and the files of its uid left in the host's temporary
directories are removed.

The program gets the job's ``stdin`` text (test inputs only) and writes its
outputs to fd 3; the supervisor relays that channel verbatim (up to
``CHANNEL_LIMIT``) and judges nothing: the caller decodes and compares.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

if __package__:  # imported as part of rlax (its tests, an installed wheel's import check)
    from rlax.plugins.rewards import sandbox_world
else:  # the sandbox's bootstrap: this folder alone on sys.path, no rlax (python -I -S)
    import sandbox_world  # type: ignore[import-not-found, no-redef]

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWNET, CLONE_NEWPID = 0x40000000, 0x20000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
CAPTURE_LIMIT = 64 * 1024  # stdout / stderr: for logs only
CHANNEL_LIMIT = 4 * 1024 * 1024  # the outputs channel; more is cut (and fails to decode)
TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _die_with_parent(parent: int) -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    # A pid namespace's init sees its parent (outside the namespace) as pid 0.
    if os.getppid() not in (parent, 0 if os.getpid() == 1 else parent):
        os._exit(1)  # the parent died before the line above


def _unshare(isolation: dict) -> None:
    """Enters new namespaces where the kernel allows; records what happened."""
    try:
        _check(_libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
        isolation["network"] = isolation["mounts"] = True
    except OSError as exc:
        isolation["network"] = isolation["mounts"] = False
        isolation["network_reason"] = str(exc)
    try:
        _check(_libc.unshare(CLONE_NEWPID), "unshare(pid)")
        isolation["pid_namespace"] = True
    except OSError as exc:
        isolation["pid_namespace"] = False
        isolation["pid_reason"] = str(exc)


def _private_filesystem(job: dict, isolation: dict) -> str:
    """The minimal world (see ``sandbox_world.py``) when mounts are ours, else the host's."""
    if isolation.get("mounts") and os.getpid() == 1:
        try:
            workdir = sandbox_world.enter_world(job["world"], 4 * job["limits"]["file_mb"])
            isolation["filesystem"] = "private tmpfs"
            isolation["root"] = "minimal read-only world"
            return workdir
        except OSError as exc:
            isolation["filesystem_reason"] = str(exc)
    isolation["filesystem"] = "host temporary directory"
    if not job["allow_weak"]:
        why = isolation.get("filesystem_reason") or isolation.get("network_reason", "")
        raise OSError(
            f"the sandbox cannot isolate this program ({why}); the weak no-namespaces mode "
            "runs only with allow_weak_isolation=True (or namespaces=False)"
        )
    return job["fallback_dir"]


def _limits(limits: dict) -> None:
    mb = 1024 * 1024
    for name, soft, hard in (
        ("RLIMIT_CPU", limits["cpu_s"], limits["cpu_s"] + 1),
        ("RLIMIT_AS", limits["memory_mb"] * mb, limits["memory_mb"] * mb),
        ("RLIMIT_FSIZE", limits["file_mb"] * mb, limits["file_mb"] * mb),
        ("RLIMIT_NPROC", limits["processes"], limits["processes"]),
        ("RLIMIT_NOFILE", limits["open_files"], limits["open_files"]),
        ("RLIMIT_CORE", 0, 0),
    ):
        resource.setrlimit(getattr(resource, name), (soft, hard))


def _program(job: dict, workdir: str, fds: dict) -> None:
    """In the forked child: become the unprivileged program (never returns)."""
    try:
        os.setsid()
        for target, fd in ((0, fds["stdin"]), (1, fds["stdout"]), (2, fds["stderr"])):
            os.dup2(fd, target)
        os.dup2(fds["channel"], 3)
        os.closerange(4, 65536)
        os.chdir(workdir)
        os.umask(0o077)
        _limits(job["limits"])
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(job["uid"])
            os.setuid(job["uid"])
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.execve(job["argv"][0], job["argv"], job["env"])
    except BaseException as exc:  # noqa: BLE001 -- report why the program could not start
        os.write(2, f"sandbox: cannot start the program: {exc}\n".encode())
    os._exit(127)


def _feed(fd: int, pending: bytearray) -> bool:
    """Writes what the pipe takes of ``pending``; False once done (or the reader left)."""
    try:
        written = os.write(fd, pending[:65536])
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:  # the program closed its stdin: the rest is not wanted
        pending.clear()
        written = 0
    del pending[:written]
    if pending:
        return True
    os.close(fd)
    return False


def _capture(fds: dict[str, int], stdin: tuple[int, bytes], child: int, deadline: float) -> dict:
    """Feeds stdin and reads stdout, stderr, the outputs channel until exit or time runs out."""
    buffers = {name: bytearray() for name in fds}
    limits = {name: CHANNEL_LIMIT if name == "channel" else CAPTURE_LIMIT for name in fds}
    open_fds, (stdin_fd, pending) = dict(fds), (stdin[0], bytearray(stdin[1]))
    os.set_blocking(stdin_fd, False)
    feeding = _feed(stdin_fd, pending)
    status, exited_at = None, None
    while open_fds:
        now = time.monotonic()
        if now >= deadline or (exited_at is not None and now - exited_at > 0.2):
            break  # after exit, a daemon may hold the pipes open: stop shortly after
        writable = [stdin_fd] if feeding else []
        ready, can_write, _ = select.select(list(open_fds.values()), writable, [], 0.05)
        if can_write:
            feeding = _feed(stdin_fd, pending)
        for name, fd in list(open_fds.items()):
            if fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    del open_fds[name]
                elif len(buffers[name]) < limits[name]:
                    buffers[name] += data[: limits[name] - len(buffers[name])]
        if status is None:
            pid, status_now = os.waitpid(child, os.WNOHANG)
            if pid == child:
                status, exited_at = status_now, time.monotonic()
    if feeding:
        os.close(stdin_fd)
    while status is None and time.monotonic() < deadline:  # pipes closed, exit pending
        pid, status_now = os.waitpid(child, os.WNOHANG)
        status = status_now if pid == child else None
        if status is None:
            time.sleep(0.005)
    return {"buffers": buffers, "status": status, "timed_out": status is None}


def _kill_uid(uid: int) -> None:
    """As ``uid`` itself, kills every process of that uid, until none is left.

    One ``kill(-1)`` can miss a child forked while the kernel walks the
    process list (a fork bomb does that), hence the loop.
    """
    sweeper = os.fork()
    if sweeper == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            for _ in range(1000):
                os.kill(-1, signal.SIGKILL)  # ESRCH (nothing left) ends the loop
                time.sleep(0.001)
        finally:
            os._exit(0)
    os.waitpid(sweeper, 0)


def _remove_files_of(uid: int) -> None:
    """Removes what ``uid`` left at the top of the host's temporary dirs (weak mode)."""
    for top in TEMP_DIRS:
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            path = os.path.join(top, name)
            try:
                if os.lstat(path).st_uid != uid:
                    continue
                if os.path.isdir(path) and not os.path.islink(path):
                    _remove_tree(path)
                else:
                    os.unlink(path)
            except OSError:
                pass


def _remove_tree(path: str) -> None:
    for base, dirs, files in os.walk(path, topdown=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            os.unlink(os.path.join(base, name))
        for name in dirs:
            if not os.path.islink(os.path.join(base, name)):
                os.rmdir(os.path.join(base, name))
    os.rmdir(path)


def _sweep(child: int, uid: int) -> str:
    """Kills everything the program left behind; says how."""
    if os.getpid() == 1:  # init of our own pid namespace: -1 is exactly the namespace
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:  # nothing left
            pass
        how = "pid namespace"
    else:
        try:
            os.killpg(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
        how = "process group"
        if os.geteuid() == 0 and uid > 0:
            _kill_uid(uid)
            _remove_files_of(uid)
            how = "process group and uid"
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
    return how


def _start(job: dict, workdir: str) -> tuple[int, dict[str, int], int]:
    """Writes the files, forks the program; returns its pid, our pipe ends, stdin's end."""
    for name, text in job["files"].items():
        path = os.path.join(workdir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        os.chown(path, job["uid"], job["uid"])
    os.chown(workdir, job["uid"], job["uid"])
    pipes = {name: os.pipe() for name in ("stdin", "stdout", "stderr", "channel")}
    child_ends = {"stdin": pipes["stdin"][0]} | {
        n: pipes[n][1] for n in ("stdout", "stderr", "channel")
    }
    child = os.fork()
    if child == 0:
        _program(job, workdir, child_ends)
    for fd in child_ends.values():
        os.close(fd)
    reads = {n: pipes[n][0] for n in ("stdout", "stderr", "channel")}
    return child, reads, pipes["stdin"][1]


def _init(job: dict, isolation: dict, parent: int) -> None:
    """Pid 1 of the sandbox (when namespaces work): set up, run, capture, sweep, report."""
    _die_with_parent(parent)
    workdir = _private_filesystem(job, isolation)
    if isolation["filesystem"] == "private tmpfs":
        workdir = os.path.join(workdir, "work")
        os.mkdir(workdir, 0o700)
    start = time.monotonic()
    child, reads, stdin_fd = _start(job, workdir)
    stdin = (stdin_fd, job["stdin"].encode())
    captured = _capture(reads, stdin, child, start + job["limits"]["wall_s"])
    isolation["cleanup"] = _sweep(child, job["uid"])
    status = captured["status"]
    text = {n: bytes(b).decode("utf-8", "replace") for n, b in captured["buffers"].items()}
    report = {
        "timed_out": captured["timed_out"],
        "returncode": os.WEXITSTATUS(status)
        if status is not None and os.WIFEXITED(status)
        else None,
        "signal": os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None,
        "stdout": text["stdout"],
        "stderr": text["stderr"],
        "channel": text["channel"],
        "wall_s": time.monotonic() - start,
        "isolation": isolation,
        "uid": job["uid"],
    }
    os.write(1, (json.dumps(report) + "\n").encode())
    os._exit(0)


def main(job: dict) -> None:
    """Runs ``job`` (see ``code_sandbox.run_sandboxed``); exits with init's status."""
    _die_with_parent(job["caller_pid"])
    isolation: dict = {}
    if job["namespaces"]:
        _unshare(isolation)
    else:
        isolation.update(network=False, network_reason="namespaces disabled", mounts=False)
        isolation.update(pid_namespace=False, pid_reason="namespaces disabled")
    me = os.getpid()
    init = os.fork()
    if init == 0:
        try:
            _init(job, isolation, me)
        except BaseException as exc:  # noqa: BLE001 -- a report is the only way out
            os.write(1, (json.dumps({"supervisor_error": str(exc)}) + "\n").encode())
            os._exit(1)
    _, status = os.waitpid(init, 0)
    sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
