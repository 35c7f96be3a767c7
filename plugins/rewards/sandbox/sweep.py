"""The weak mode's cleanup: every process and temporary file of the sandbox uid.

Standard library only; used by ``sandbox/supervisor.py`` (as root, outside
every namespace) after a run without namespaces, where no pid namespace or
private ``/tmp`` takes the program's leftovers away with it.
"""

from __future__ import annotations

import os
import signal
import time

TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def kill_uid(uid: int) -> None:
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


def remove_files_of(uid: int) -> None:
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
                    remove_tree(path)
                else:
                    os.unlink(path)
            except OSError:
                pass


def remove_tree(path: str) -> None:
    for base, dirs, files in os.walk(path, topdown=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            os.unlink(os.path.join(base, name))
        for name in dirs:
            if not os.path.islink(os.path.join(base, name)):
                os.rmdir(os.path.join(base, name))
    os.rmdir(path)


def _children(parent: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state, ppid = f.read().rsplit(b")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if int(ppid) == parent and state != b"Z":
            found.append(int(name))
    return found


def kill_children() -> None:
    """Kills this process's children until none is left, reaping them.

    The caller is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so every
    orphan of the program, a double-forked daemon in a session of its own
    too, is one of its children by then: this reaches what a process group
    misses, without a uid of the run's own (an ordinary user's weak mode).
    """
    me = os.getpid()
    for _ in range(1000):
        children = _children(me)
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        if not children:
            return
        time.sleep(0.001)
