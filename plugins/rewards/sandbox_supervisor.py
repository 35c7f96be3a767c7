"""The sandbox's trusted side: namespaces, limits, privilege drop, capture, cleanup.

Run as ``python -I -S sandbox_supervisor.py`` (standard library only) by
:func:`rlax.plugins.rewards.code_sandbox.run_sandboxed`, with a JSON job on
stdin; it prints one JSON report on stdout. The process tree::

    caller ── supervisor (root; new network, mount, IPC, UTS namespaces)
                └── init (pid 1 of a new pid namespace; root; tmpfs /tmp, fresh /proc)
                      └── program (own session; unprivileged uid; rlimits; no new privileges)

Each link dies with its parent (``PR_SET_PDEATHSIG``), and when ``init`` exits
the kernel kills every process left in its pid namespace, so no daemon, fork
or orphan outlives the call. Without namespaces (not root, or the kernel
refuses) the report says so; the program then still runs under its own uid
(when root), limits and session, and is swept by uid and process group.

The program's verdict channel is fd 3; only lines carrying the per-run nonce,
which the program's harness reads from stdin before any untrusted code runs,
count. Printing to stdout decides nothing.
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

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWNET, CLONE_NEWPID = 0x40000000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
CAPTURE_LIMIT = 64 * 1024

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


def _mount(source: str, target: str, fstype: str, flags: int, data: str | None) -> None:
    _check(
        _libc.mount(
            source.encode(), target.encode(), fstype.encode(), flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )  # fmt: skip


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
    """A fresh tmpfs work dir (and /proc of the new pid ns) when mounts are ours."""
    if isolation.get("mounts"):
        try:
            _mount("none", "/", "", MS_REC | MS_PRIVATE, None)
            size = f"size={4 * job['limits']['file_mb']}m,mode=1777"
            for target in ("/tmp", "/var/tmp", "/dev/shm"):
                if os.path.isdir(target):
                    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, size)
            if os.getpid() == 1:
                _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
            workdir = "/tmp/sandbox"
            os.mkdir(workdir, 0o700)
            isolation["filesystem"] = "private tmpfs"
            return workdir
        except OSError as exc:
            isolation["filesystem_reason"] = str(exc)
    isolation["filesystem"] = "host temporary directory"
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
        os.dup2(fds["verdict"], 3)
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


def _capture(fds: dict[str, int], child: int, deadline: float) -> dict:
    """Reads stdout, stderr and the verdict channel until the child exits or time runs out."""
    buffers = {name: bytearray() for name in fds}
    open_fds = dict(fds)
    status, exited_at = None, None
    while open_fds:
        now = time.monotonic()
        if now >= deadline or (exited_at is not None and now - exited_at > 0.2):
            break  # after exit, a daemon may hold the pipes open: stop shortly after
        ready, _, _ = select.select(list(open_fds.values()), [], [], 0.05)
        for name, fd in list(open_fds.items()):
            if fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    del open_fds[name]
                elif len(buffers[name]) < CAPTURE_LIMIT:
                    buffers[name] += data[: CAPTURE_LIMIT - len(buffers[name])]
        if status is None:
            pid, status_now = os.waitpid(child, os.WNOHANG)
            if pid == child:
                status, exited_at = status_now, time.monotonic()
    while status is None and time.monotonic() < deadline:  # pipes closed, exit pending
        pid, status_now = os.waitpid(child, os.WNOHANG)
        status = status_now if pid == child else None
        if status is None:
            time.sleep(0.005)
    return {"buffers": buffers, "status": status, "timed_out": status is None}


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
            sweeper = os.fork()
            if sweeper == 0:  # as the sandbox's own uid, -1 means that uid's processes only
                os.setgid(uid)
                os.setuid(uid)
                try:
                    os.kill(-1, signal.SIGKILL)
                finally:
                    os._exit(0)  # ESRCH included: nothing of that uid was left
            os.waitpid(sweeper, 0)
            how = "process group and uid"
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
    return how


def _init(job: dict, isolation: dict, parent: int) -> None:
    """Pid 1 of the sandbox (when namespaces work): set up, run, capture, sweep, report."""
    _die_with_parent(parent)
    workdir = _private_filesystem(job, isolation)
    nonce = os.urandom(16).hex()
    for name, text in job["files"].items():
        path = os.path.join(workdir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        os.chown(path, job["uid"], job["uid"])
    os.chown(workdir, job["uid"], job["uid"])
    pipes = {name: os.pipe() for name in ("stdin", "stdout", "stderr", "verdict")}
    child_ends = {"stdin": pipes["stdin"][0]} | {
        n: pipes[n][1] for n in ("stdout", "stderr", "verdict")
    }
    start = time.monotonic()
    child = os.fork()
    if child == 0:
        _program(job, workdir, child_ends)
    for fd in child_ends.values():
        os.close(fd)
    try:
        os.write(pipes["stdin"][1], (nonce + "\n").encode())
    except OSError:
        pass
    os.close(pipes["stdin"][1])
    reads = {n: pipes[n][0] for n in ("stdout", "stderr", "verdict")}
    captured = _capture(reads, child, start + job["limits"]["wall_s"])
    isolation["cleanup"] = _sweep(child, job["uid"])
    status = captured["status"]
    report = {
        "timed_out": captured["timed_out"],
        "returncode": os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None,
        "stdout": captured["buffers"]["stdout"].decode("utf-8", "replace"),
        "stderr": captured["buffers"]["stderr"].decode("utf-8", "replace"),
        "verdict": _verdict(captured["buffers"]["verdict"], nonce),
        "wall_s": time.monotonic() - start,
        "isolation": isolation,
        "uid": job["uid"],
    }  # fmt: skip
    os.write(1, (json.dumps(report) + "\n").encode())
    os._exit(0)


def _verdict(channel: bytes, nonce: str) -> dict | None:
    """The last verdict line carrying the nonce, or None."""
    found = None
    for line in channel.decode("utf-8", "replace").splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and message.get("nonce") == nonce:
            found = {k: v for k, v in message.items() if k != "nonce"}
    return found


def main() -> None:
    job = json.loads(sys.stdin.read())
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
            os.write(1, (json.dumps({"supervisor_error": repr(exc)}) + "\n").encode())
            os._exit(1)
    _, status = os.waitpid(init, 0)
    sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main()
