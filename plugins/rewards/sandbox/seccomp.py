"""The sandboxed program's system-call allow-list, compiled by libseccomp.

Standard library only. The caller builds the filter once per process
(:func:`filter_program`) through ``libseccomp.so.2``, the library that
Docker, Podman, systemd and Firecracker's jailer use for the same job (it
knows every architecture's call numbers, refuses the other ABIs of the machine
— 32-bit and x32 calls on x86-64 — and compiles the rules to a classic BPF
program); the supervisor installs those bytes in the program's process right
before ``execve`` (:func:`install`, after ``no_new_privs``), so the program
and everything it starts run under it.

Deny by default: a call not in :data:`ALLOWED` fails with ``EPERM``. Refused
among others: kernel keyrings (``add_key``, ``keyctl``, ``request_key``), new
namespaces (``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*`` flag;
``clone3``, whose flags a filter cannot read, says ``ENOSYS`` so the C
library falls back to ``clone``), ``ptrace``, ``bpf``, ``perf_event_open``,
anonymous and shared memory that address-space limits do not see
(``memfd_create``, ``memfd_secret``, ``userfaultfd``, System V ``shm*``,
``mq_open``), ``mount``, ``io_uring``, ``setuid`` and friends, sockets of any
family but ``AF_UNIX`` (``asyncio``'s self-pipe and ``socketpair`` keep
working).

Allowed only with some commands (``sandbox/commands.py``, argument filtering
in the same filter): ``fcntl``, ``ioctl``, ``prctl``, ``madvise``,
``fadvise64``, ``set/getpriority``, ``preadv2``/``pwritev2`` and ``futex``:
no command that reaches a kernel object keyed by a file other runs can open
(locks of every kind, leases, directory notifications, a file's owner for
signals) or the shared page cache. Refused whole: ``flock``, ``mincore``,
``futex_waitv``; inotify and fanotify were never on the list.

We call libseccomp's stable C API through ``ctypes`` (seven functions) rather
than a PyPI binding: the only ctypes binding there (``pyseccomp``) is a shim of
the same calls without a release since 2021, and the supervisor side must run
on the standard library alone (``python -I -S``). Where ``libseccomp.so.2`` is
missing, :func:`filter_program` raises :class:`SeccompUnavailable`, and the
run is an error naming ``allow_weak_isolation`` (never a silent skip).
"""

from __future__ import annotations

import ctypes
import functools
import os

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_FLTATR_CTL_OPTIMIZE = 8  # 2: a binary tree of call numbers (libseccomp >= 2.5)
SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ = 4, 7
AF_UNIX = 1
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
CLONE_NEW_ANY |= 0x20000000 | 0x40000000

# What a program may call, by kind (every other call: EPERM).
ALLOWED_BY_KIND = {
    "files and descriptors": (
        "read write readv writev pread64 pwrite64 preadv pwritev open openat "
        "openat2 creat close close_range lseek stat fstat lstat newfstatat statx fstatfs statfs "
        "access faccessat faccessat2 fsync fdatasync ftruncate truncate getdents "
        "getdents64 getcwd chdir fchdir rename renameat renameat2 mkdir mkdirat rmdir link linkat "
        "unlink unlinkat symlink symlinkat readlink readlinkat chmod fchmod fchmodat umask utime "
        "utimes utimensat futimesat sendfile copy_file_range splice tee fallocate "
        "readahead dup dup2 dup3 pipe pipe2 select pselect6 poll ppoll epoll_create "
        "epoll_create1 epoll_ctl epoll_wait epoll_pwait epoll_pwait2 eventfd eventfd2 "
        "timerfd_create timerfd_settime timerfd_gettime signalfd signalfd4 "
    ),
    "memory (mapped memory only: RLIMIT_AS and the run's cgroup see it)": (
        "brk mmap munmap mremap mprotect msync "
    ),
    "processes and threads (clone: below, without namespace flags)": (
        "fork vfork execve execveat exit exit_group wait4 waitid kill tkill tgkill getpid getppid "
        "gettid getuid geteuid getgid getegid getgroups getresuid getresgid getpgrp getpgid setpgid "
        "getsid setsid set_tid_address set_robust_list get_robust_list rseq arch_prctl "
        "prlimit64 getrlimit setrlimit getrusage sched_yield "
        "sched_getaffinity sched_setaffinity sched_getparam sched_getscheduler "
        "sched_get_priority_max sched_get_priority_min pidfd_open pidfd_send_signal getcpu "
    ),
    "signals and time": (
        "rt_sigaction rt_sigprocmask rt_sigreturn rt_sigsuspend rt_sigpending rt_sigtimedwait "
        "sigaltstack pause alarm getitimer setitimer restart_syscall nanosleep clock_nanosleep "
        "clock_gettime clock_getres gettimeofday time times uname sysinfo getrandom "
    ),
    "AF_UNIX sockets (socket and socketpair: below)": (
        "bind connect listen accept accept4 sendto recvfrom sendmsg recvmsg sendmmsg recvmmsg "
        "shutdown getsockname getpeername setsockopt getsockopt"
    ),
}
ALLOWED = tuple(name for names in ALLOWED_BY_KIND.values() for name in names.split())
# Allowed with some commands only (``sandbox/commands.py``): fcntl ioctl prctl madvise
# fadvise64 setpriority getpriority preadv2 pwritev2 futex; and clone, socket, socketpair.


class SeccompUnavailable(OSError):
    """libseccomp cannot be loaded or cannot build the filter on this machine."""


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _library() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError as exc:
        raise SeccompUnavailable(f"libseccomp.so.2 cannot be loaded ({exc})") from None
    lib.seccomp_init.argtypes, lib.seccomp_init.restype = [ctypes.c_uint32], ctypes.c_void_p
    lib.seccomp_release.argtypes, lib.seccomp_release.restype = [ctypes.c_void_p], None
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def errno_action(errno: int) -> int:
    """libseccomp's ``SCMP_ACT_ERRNO(errno)``: the call fails with ``errno``."""
    return 0x00050000 | (errno & 0xFFFF)


@functools.cache
def filter_program() -> bytes:
    """The allow-list as a classic BPF program (``struct sock_filter[]``), built once.

    Raises:
      SeccompUnavailable: no ``libseccomp.so.2``, or it refused a rule.
    """
    import tempfile  # here: the supervisor, which imports this module too, never needs it

    lib = _library()
    ctx = lib.seccomp_init(errno_action(1))  # default: EPERM
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:
        lib.seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2)  # older libseccomp: linear

        def add(action: int, name: str, *cmps: tuple[int, int, int, int]) -> None:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:  # not a call on this architecture (e.g. open on arm64)
                return
            array = (_ArgCmp * max(1, len(cmps)))(*[_ArgCmp(*c) for c in cmps])
            rc = lib.seccomp_rule_add_array(ctx, action, number, len(cmps), array)
            if rc < 0:
                raise SeccompUnavailable(f"libseccomp refused the rule for {name}: {-rc}")

        for name in ALLOWED:
            add(SCMP_ACT_ALLOW, name)
        add(SCMP_ACT_ALLOW, "clone", (0, SCMP_CMP_MASKED_EQ, CLONE_NEW_ANY, 0))
        add(errno_action(38), "clone3")  # ENOSYS: glibc falls back to clone
        add(SCMP_ACT_ALLOW, "socket", (0, SCMP_CMP_EQ, AF_UNIX, 0))
        add(SCMP_ACT_ALLOW, "socketpair", (0, SCMP_CMP_EQ, AF_UNIX, 0))
        _add_command_rules(add)
        with tempfile.TemporaryFile() as out:
            rc = lib.seccomp_export_bpf(ctx, out.fileno())
            if rc < 0:
                raise SeccompUnavailable(f"seccomp_export_bpf failed: {os.strerror(-rc)}")
            out.seek(0)
            program = out.read()
    finally:
        lib.seccomp_release(ctx)
    if not program or len(program) % 8:
        raise SeccompUnavailable("libseccomp exported no filter")
    return program


def _add_command_rules(add) -> None:
    """The argument-level rules of ``sandbox/commands.py`` through ``add(action, name, *cmps)``."""
    if __package__:
        from rlax.plugins.rewards.sandbox import commands
    else:  # pragma: no cover -- the supervisor never builds a filter
        import commands  # type: ignore[import-not-found, no-redef]

    for name, (arg, mask, values) in commands.RULES.items():
        for value in values:
            add(SCMP_ACT_ALLOW, name, (arg, SCMP_CMP_MASKED_EQ, mask, value))
    for name, conditions in commands.CONDITIONAL:
        add(SCMP_ACT_ALLOW, name, *[(a, SCMP_CMP_MASKED_EQ, m, v) for a, m, v in conditions])
    for name, (errno, (arg, mask, value)) in commands.OTHERWISE.items():
        add(errno_action(errno), name, (arg, SCMP_CMP_MASKED_EQ, mask, value))
    for name, errno in commands.REFUSED.items():
        if errno != 1:  # EPERM is the default
            add(errno_action(errno), name)


def install(program: bytes) -> None:
    """Installs ``program`` (from :func:`filter_program`) on this process, for good.

    Needs ``no_new_privs`` (or ``CAP_SYS_ADMIN``); raises ``OSError`` if the
    kernel refuses it.
    """
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_SECCOMP): {os.strerror(errno)}")
