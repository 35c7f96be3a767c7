"""The argument-level part of the system-call allow-list: which commands of a call pass.

Standard library only; read by :func:`rlax.plugins.rewards.sandbox.seccomp.filter_program`.
A call that multiplexes commands (``fcntl``, ``ioctl``, ``prctl``, ...) is
allowed only with the commands a program needs; every command that reaches
state outside the run -- a kernel object keyed by a file that other runs can
open (locks, leases, notifications), a file's owner for signals, the shared
page cache -- is refused by the filter itself, on the call's argument. Two
concurrent runs see the same read-only files (the interpreter, its library),
so anything the kernel attaches to such a file is a channel between them.

Each rule is ``(argument, mask, allowed values)``: the call passes when
``argument & mask`` is one of the values; the rest fails with ``EPERM``
unless :data:`OTHERWISE` gives a refused command another answer. Commands are
compared on their low 32 bits (the kernel reads an ``int``; the upper half of
the register is ignored by it, so comparing 64 bits would let nothing more
through but refuse nothing more either). Why each command is refused is in
``docs/rewards_and_data.md`` ("The filter, call by call").
"""

from __future__ import annotations

EPERM, ENOTTY, ENOSYS, EOPNOTSUPP = 1, 25, 38, 95
MASK32 = 0xFFFFFFFF
SUCCEED = 0  # errno 0: the call returns 0 without doing anything

# fcntl: descriptor flags, status flags, duplication, pipe size, seals read back.
# Refused: F_SETLK/F_SETLKW/F_GETLK (5-7), F_OFD_* (36-38), F_SETOWN/F_GETOWN (8, 9),
# F_SETSIG/F_GETSIG (10, 11), F_SETOWN_EX/F_GETOWN_EX (15, 16), F_GETOWNER_UIDS (17),
# F_SETLEASE/F_GETLEASE (1024, 1025), F_NOTIFY (1026), F_CANCELLK (1029),
# F_ADD_SEALS (1033), the read/write hints (1035-1038), F_DUPFD_QUERY (1027).
F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL = 0, 1, 2, 3, 4
F_DUPFD_CLOEXEC, F_SETPIPE_SZ, F_GETPIPE_SZ, F_GET_SEALS = 1030, 1031, 1032, 1034
FCNTL: tuple[int, ...] = (F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC)
FCNTL += (F_SETPIPE_SZ, F_GETPIPE_SZ, F_GET_SEALS)

# ioctl: is it a terminal, its size and process group, bytes readable, non-blocking and
# close-on-exec flags (os.set_inheritable uses FIOCLEX). The rest: EPERM; FIOASYNC (signals
# to a file's owner) says ENOTTY, as for a file that does not do it.
TCGETS, TIOCGPGRP, TIOCGWINSZ, FIONREAD, FIONBIO = 0x5401, 0x540F, 0x5413, 0x541B, 0x5421
FIONCLEX, FIOCLEX = 0x5450, 0x5451
FIOASYNC = 0x5452
IOCTL = (TCGETS, TIOCGPGRP, TIOCGWINSZ, FIONREAD, FIONBIO, FIONCLEX, FIOCLEX)

# prctl: the process's own name, parent-death signal, child reaper, no_new_privs, seccomp
# mode, capability bounding set (read), and anonymous mappings' names (the C library's).
# PR_SET_DUMPABLE only to 0 (the harness makes itself unreadable; back to 1 is refused).
PR_SET_PDEATHSIG, PR_GET_PDEATHSIG, PR_GET_DUMPABLE, PR_SET_DUMPABLE = 1, 2, 3, 4
PR_SET_NAME, PR_GET_NAME, PR_GET_SECCOMP, PR_CAPBSET_READ = 15, 16, 21, 23
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37
PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS, PR_SET_VMA = 38, 39, 0x53564D41
PRCTL: tuple[int, ...] = (
    PR_SET_PDEATHSIG,
    PR_GET_PDEATHSIG,
    PR_GET_DUMPABLE,
    PR_SET_NAME,
    PR_GET_NAME,
)
PRCTL += (PR_GET_SECCOMP, PR_CAPBSET_READ, PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER)
PRCTL += (PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS, PR_SET_VMA)

# madvise: advice about the process's own mappings. Refused: MADV_REMOVE (9),
# MADV_MERGEABLE/UNMERGEABLE (12, 13: KSM merges equal pages across processes, and the
# merge shows in write timings), MADV_COLD/PAGEOUT (20, 21: reclaim of shared page cache),
# MADV_COLLAPSE (25), MADV_HWPOISON/SOFT_OFFLINE (100, 101), the guard-page advice.
MADVISE = (0, 1, 2, 3, 4, 8, 10, 11, 14, 15, 16, 17, 18, 19, 22, 23)

# posix_fadvise: POSIX_FADV_DONTNEED (4) drops a file's clean pages from the page cache,
# which every run sharing that file then reads slower: it "succeeds" without acting.
FADVISE = (0, 1, 2, 3, 5)
POSIX_FADV_DONTNEED = 4

# set/getpriority: of a process (PRIO_PROCESS) only, not of a process group or a user.
PRIORITY = (0,)

RWF_NOWAIT = 0x8  # preadv2/pwritev2: "would the read block?" tells what the page cache holds
FUTEX_PRIVATE_FLAG = 128

# call -> (argument, mask, allowed values): the call passes when ``argument & mask`` is one
# of the values; the rest fails with EPERM (the filter's default) unless OTHERWISE says.
RULES: dict[str, tuple[int, int, tuple[int, ...]]] = {
    "fcntl": (1, MASK32, FCNTL),
    "ioctl": (1, MASK32, IOCTL),
    "prctl": (0, MASK32, PRCTL),
    "madvise": (2, MASK32, MADVISE),
    "fadvise64": (3, MASK32, FADVISE),
    "setpriority": (0, MASK32, PRIORITY),
    "getpriority": (0, MASK32, PRIORITY),
    # only the flags word's RWF_NOWAIT bit is read: every value of it without the bit passes
    "preadv2": (5, RWF_NOWAIT, (0,)),
    "pwritev2": (5, RWF_NOWAIT, (0,)),
    # a futex without FUTEX_PRIVATE_FLAG is keyed by the page's file when the page is a
    # file's (the C library's own pages are, in every run): see OTHERWISE
    "futex": (1, FUTEX_PRIVATE_FLAG, (FUTEX_PRIVATE_FLAG,)),
}

# call -> (errno or SUCCEED, (argument, mask, value)): what a refused command gets instead
# of EPERM. A shared futex "returns at once" (a wait that wakes spuriously, a wake that
# wakes no one), which every futex user already handles; DONTNEED advice is advisory.
OTHERWISE: dict[str, tuple[int, tuple[int, int, int]]] = {
    "ioctl": (ENOTTY, (1, MASK32, FIOASYNC)),
    "fadvise64": (SUCCEED, (3, MASK32, POSIX_FADV_DONTNEED)),
    "preadv2": (EOPNOTSUPP, (5, RWF_NOWAIT, RWF_NOWAIT)),
    "pwritev2": (EOPNOTSUPP, (5, RWF_NOWAIT, RWF_NOWAIT)),
    "futex": (SUCCEED, (1, FUTEX_PRIVATE_FLAG, 0)),
}

# Extra allowed commands with a condition on a second argument: PR_SET_DUMPABLE to 0.
CONDITIONAL: tuple[tuple[str, tuple[tuple[int, int, int], ...]], ...] = (
    ("prctl", ((0, MASK32, PR_SET_DUMPABLE), (1, MASK32, 0))),
)

# Calls refused whole, with the errno a program gets, beyond the default EPERM.
REFUSED = {
    "flock": EPERM,  # a lock on the file itself: keyed by a file every run can open
    "futex_waitv": ENOSYS,  # each waiter's flags sit in memory, out of the filter's reach
    "mincore": EPERM,  # which pages of a (shared) file the page cache holds
}
