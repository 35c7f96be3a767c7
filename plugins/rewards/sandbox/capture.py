"""The program's pipes, relayed by the sandbox's init: stdin fed, the outputs read, within limits.

Standard library only; imported by ``supervisor.py`` inside the sandbox (its
folder alone on ``sys.path``). :func:`capture` writes the job's ``stdin`` to
the program while it reads the program's stdout and stderr (up to
``CAPTURE_LIMIT`` each, for logs) and its outputs channel (up to
``CHANNEL_LIMIT``; more is cut and then fails to decode on the trusted side),
until the program exits and its pipes close, or the run's wall time ends; with
a :class:`~rlax.plugins.rewards.sandbox.cgroup.ResidentWatch` (no cgroup for
the run) it kills the namespace once the run holds too much memory.
"""

from __future__ import annotations

import os
import select
import signal
import time

if __package__:  # imported as part of rlax (its tests, an installed wheel's import check)
    from rlax.plugins.rewards.sandbox import cgroup
else:  # the sandbox's bootstrap: this folder alone on sys.path, no rlax (python -I -S)
    import cgroup  # type: ignore[import-not-found, no-redef]

CAPTURE_LIMIT = 64 * 1024  # stdout / stderr: for logs only
CHANNEL_LIMIT = 4 * 1024 * 1024  # the outputs channel; more is cut (and fails to decode)


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


def capture(fds: dict[str, int], stdin: tuple[int, bytes], child: int, deadline: float, watch=None):
    """Feeds stdin and reads stdout, stderr, the outputs channel until exit or time runs out;
    with a ``watch`` (no cgroup), kills the namespace once the run holds too much memory."""
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
        poll = 0.05 if watch is None else cgroup.POLL_S
        ready, can_write, _ = select.select(list(open_fds.values()), writable, [], poll)
        if watch is not None and not watch.exceeded and watch.over():
            os.kill(-1, signal.SIGKILL)  # init: every process of its namespace but itself
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
