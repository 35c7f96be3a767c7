"""The sandbox's trusted side: namespaces, limits, privilege drop, capture, cleanup.

Started by :func:`rlax.plugins.rewards.sandbox.run.run_sandboxed` as
``python -I -S -c BOOTSTRAP`` (standard library only; the bootstrap reads the
JSON job from stdin and calls :func:`main`, so no host path shows in any
command line the program could read); it prints one JSON report on stdout.
The process tree::

    caller ── supervisor (the caller's uid; outside every namespace; the run's cgroup)
                └── runner (as root: drops to the sandbox uid; then new user, mount,
                      │     network, IPC, UTS and pid namespaces)
                      └── init (pid 1 of the pid namespace; builds the minimal world)
                            └── program (joins the run's cgroup; own session; rlimits;
                                         no new privileges; the system-call filter)

The same tree runs as root and as an ordinary user: the user namespace maps
one uid, the runner's, to itself (as root, the runner first becomes the
sandbox uid), so the program holds no capability anywhere after ``execve``
and nothing the kernel keeps per user outlives it. Each link dies with its
parent (``PR_SET_PDEATHSIG``), and when ``init`` exits the kernel kills every
process left in its pid namespace, so no daemon, fork or orphan outlives the
call. Without namespaces (asked for, or the kernel refuses a user namespace)
the program runs only when the job allows the weak mode; it then still runs
under the filter, limits and its own session, is swept by process group and
(as root) by uid, and the files of its uid left in the host's temporary
directories are removed (``sandbox/sweep.py``).

The program gets the job's ``stdin`` text (test inputs only) and writes its
outputs to fd 3; the supervisor relays that channel verbatim (up to
``capture.CHANNEL_LIMIT``) and judges nothing: the caller decodes and compares.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import time

if __package__:  # imported as part of rlax (its tests, an installed wheel's import check)
    from rlax.plugins.rewards.sandbox import capture, cgroup, seccomp, sweep, world
else:  # the sandbox's bootstrap: this folder alone on sys.path, no rlax (python -I -S)
    import capture  # type: ignore[import-not-found, no-redef]
    import cgroup  # type: ignore[import-not-found, no-redef]
    import seccomp  # type: ignore[import-not-found, no-redef]
    import sweep  # type: ignore[import-not-found, no-redef]
    import world  # type: ignore[import-not-found, no-redef]

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWUSER = 0x40000000, 0x20000000, 0x10000000
NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
PR_SET_CHILD_SUBREAPER = 36

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


def _write_file(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def _become(uid: int, parent: int) -> None:
    """Root only: becomes the sandbox ``uid`` for good (no groups, no way back)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _die_with_parent(parent)  # a change of credentials clears the parent-death signal


def _unshare(isolation: dict) -> None:
    """New user, mount, network, IPC, UTS and pid namespaces, or the reason why not.

    The user namespace maps this process's uid and gid to themselves, and only
    them: inside it, this process holds the capabilities that build the world;
    the program, not uid 0 there, loses them at ``execve``. Everything the
    kernel keeps per user (keyrings, process counts) is the namespace's own.
    """
    uid, gid = os.geteuid(), os.getegid()
    try:
        _check(_libc.unshare(NAMESPACES), "unshare(user, mount, net, ipc, uts, pid)")
    except OSError as exc:
        isolation.update(network=False, mounts=False, pid_namespace=False, user_namespace="")
        isolation["network_reason"] = f"the kernel refused a user namespace ({exc})"
        return
    _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(DUMPABLE)")  # our own /proc files
    _write_file("/proc/self/setgroups", "deny")
    _write_file("/proc/self/uid_map", f"{uid} {uid} 1")
    _write_file("/proc/self/gid_map", f"{gid} {gid} 1")
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")  # no one reads init
    isolation.update(network=True, mounts=True, pid_namespace=True)
    isolation["user_namespace"] = os.readlink("/proc/self/ns/user")


def _private_filesystem(job: dict, isolation: dict) -> str:
    """The minimal world (see ``sandbox/world.py``) when mounts are ours, else the host's."""
    if isolation.get("mounts") and os.getpid() == 1:
        try:
            workdir = world.enter_world(job["world"], 4 * job["limits"]["file_mb"])
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
    # RLIMIT_NPROC counts the uid's processes in its user namespace: not root, the program
    # shares its uid with the runner and init there (the cgroup's pids.max counts its own).
    processes = limits["processes"] + (2 if os.geteuid() != 0 else 0)
    for name, soft, hard in (
        ("RLIMIT_CPU", limits["cpu_s"], limits["cpu_s"] + 1),
        ("RLIMIT_AS", limits["memory_mb"] * mb, limits["memory_mb"] * mb),
        ("RLIMIT_FSIZE", limits["file_mb"] * mb, limits["file_mb"] * mb),
        ("RLIMIT_NPROC", processes, processes),
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
        # Orphans of the program's children are the program's own to reap and kill (the
        # harness ends each test case's tree); the setting survives execve.
        _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if job["seccomp"]:
            seccomp.install(bytes.fromhex(job["seccomp"]))
        os.execve(job["argv"][0], job["argv"], job["env"])
    except BaseException as exc:  # noqa: BLE001 -- report why the program could not start
        os.write(2, f"sandbox: cannot start the program: {exc}\n".encode())
    os._exit(127)


def _sweep(child: int) -> str:
    """Kills everything the program left behind; says how."""
    if os.getpid() == 1:  # init of our own pid namespace: -1 is exactly the namespace
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:  # nothing left
            pass
        how = "pid namespace"
    else:  # the weak mode: the supervisor then sweeps the uid too (as root)
        try:
            os.killpg(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
        sweep.kill_children()  # orphans of other sessions: ours as a subreaper
        how = "process group"
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


def _init(job: dict, isolation: dict, parent: int, out: int) -> None:
    """The sandbox's init (pid 1 with namespaces): set up, run, capture, sweep, report."""
    _die_with_parent(parent)
    # The program shares init's uid: as a namespace's init, the kernel drops every signal
    # from inside it that has no handler, so none is left (Python's own is SIGINT's).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if os.getpid() != 1:  # the weak mode: the program's orphans become our children
        _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
    workdir = _private_filesystem(job, isolation)
    if isolation["filesystem"] == "private tmpfs":
        workdir = os.path.join(workdir, "work")
        os.mkdir(workdir, 0o700)
    if os.read(job["links"]["go"], 1) != b"1":  # the supervisor put us in the run's cgroup
        raise OSError("the run's cgroup could not be joined")
    watch = None
    if os.getpid() == 1 and not isolation["run_limits"].startswith("cgroup"):
        watch = cgroup.ResidentWatch(job["limits"]["run_memory_mb"])
        isolation["run_limits"] = "resident memory watched by init"
    start = time.monotonic()
    child, reads, stdin_fd = _start(job, workdir)
    stdin = (stdin_fd, job["stdin"].encode())
    captured = capture.capture(reads, stdin, child, start + job["limits"]["wall_s"], watch)
    isolation["cleanup"] = _sweep(child)
    if watch is not None:
        isolation["run_memory_mb"] = job["limits"]["run_memory_mb"]
        isolation["memory_peak_mb"] = round(watch.peak_bytes / 2**20, 1)
        isolation["run_memory_exceeded"] = watch.exceeded
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
    os.write(out, (json.dumps(report) + "\n").encode())


def _runner(job: dict, isolation: dict, parent: int, out: int) -> None:
    """Between the supervisor and init: drops root, enters the namespaces, forks init."""
    _die_with_parent(parent)
    if job["namespaces"]:
        if os.geteuid() == 0:
            _become(job["uid"], parent)
        _unshare(isolation)
    else:
        isolation.update(network=False, network_reason="namespaces disabled", mounts=False)
        isolation.update(pid_namespace=False, pid_reason="namespaces disabled", user_namespace="")
    me, links = os.getpid(), job["links"]
    init = os.fork()
    if init == 0:
        os.close(links["init_pid"])
        _guarded(out, _init, job, isolation, me, out)
    os.write(links["init_pid"], str(init).encode())  # as the supervisor sees it
    os.close(links["init_pid"])
    os.waitpid(init, 0)


def _guarded(out: int, step, *args) -> None:
    """Runs ``step`` in a forked child; any failure becomes the report (never returns)."""
    try:
        step(*args)
    except BaseException as exc:  # noqa: BLE001 -- a report is the only way out
        os.write(out, (json.dumps({"supervisor_error": str(exc)}) + "\n").encode())
        os._exit(1)
    os._exit(0)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def main(job: dict) -> None:
    """Runs ``job`` (see ``run.run_sandboxed``); prints one JSON report.

    The supervisor itself stays outside every namespace, with the caller's
    uid: it makes the run's cgroup, and after the run reads its peak, removes
    it and (weak mode, as root) sweeps the sandbox uid's processes and files.
    """
    _die_with_parent(job["caller_pid"])
    isolation: dict = {"syscalls": "allow-list (libseccomp)" if job["seccomp"] else "NOT filtered"}
    group = cgroup.for_run(job, isolation)
    if os.geteuid() == 0 and job["namespaces"]:  # the runner works there as the sandbox uid
        os.chown(job["fallback_dir"], job["uid"], job["uid"])
    (read, write), (pid_r, pid_w), (go_r, go_w) = os.pipe(), os.pipe(), os.pipe()
    job["links"] = {"init_pid": pid_w, "go": go_r}
    me = os.getpid()
    runner = os.fork()
    if runner == 0:
        for fd in (read, pid_r, go_w):
            os.close(fd)
        _guarded(write, _runner, job, isolation, me, write)
    for fd in (write, pid_w, go_r):
        os.close(fd)
    cgroup.admit(_read_all(pid_r), group, go_w)
    lines = _read_all(read).decode().strip().splitlines()
    lines = lines or ['{"supervisor_error": "the sandbox\'s init gave no report"}']
    os.waitpid(runner, 0)
    report = json.loads(lines[-1])
    if group is not None:
        peak = group.peak_bytes()
        group.remove()
        if "isolation" in report and peak is not None:
            report["isolation"]["memory_peak_mb"] = round(peak / 2**20, 1)
    weak = report.get("isolation", {}).get("filesystem") == "host temporary directory"
    if weak and os.geteuid() == 0 and job["uid"] > 0:
        sweep.kill_uid(job["uid"])
        sweep.remove_files_of(job["uid"])
        report["isolation"]["cleanup"] = "process group and uid"
    os.write(1, (json.dumps(report) + "\n").encode())
