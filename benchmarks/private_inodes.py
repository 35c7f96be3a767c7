"""Issue 54's alternative, measured: give each sandbox run inodes of its own instead of
filtering the commands that reach state kept on shared inodes.

The sandbox's world binds the host paths the interpreter needs read-only
(:func:`rlax.plugins.rewards.sandbox.interpreter.interpreter_world`), so two runs
open the same inodes: locks, leases, directory notifications and the page cache
are kept per inode, and the argument-level filter (``sandbox/commands.py``)
refuses the commands that reach them. The alternative gives each run inodes of
its own. Here, in a private mount namespace, as the sandbox would per run:

- ``bind``: today's world (a read-only bind mount per path), per run;
- ``overlay``: each bound directory as an overlay (lower: the host directory,
  upper and work on a tmpfs) and each bound file copied into the tmpfs -- a
  private inode for everything the run can open;
- ``copy``: every bound path copied into a tmpfs (private inodes *and* private
  pages).

For each: milliseconds to build one run's world and take it down (median of
``--runs``), and two facts checked by experiment on a file of the standard
library seen through two runs' worlds: whether an exclusive ``flock`` taken in
one blocks the other (a lock channel), and whether a page one run reads is
resident for the other after the page was evicted (the page-cache channel; residency read by ``mincore`` of a mapping, evicted through the
host's own path). The argument filter's own cost per program is
``benchmarks/rewards.py``'s ``issue54_call_cost_ratio``.

Linux, as root (the mounts need a mount namespace of our own)::

    python benchmarks/private_inodes.py [--runs 30]

Prints a table, then one JSON line: ``{"bound_paths", "bound_mb", "bind_ms",
"overlay_ms", "copy_ms", "bind_locks_shared", "overlay_locks_shared",
"copy_locks_shared", "bind_pages_shared", "overlay_pages_shared",
"copy_pages_shared"}``.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from rlax.plugins.rewards.sandbox.interpreter import interpreter_world, python_for_sandbox
from rlax.plugins.rewards.sandbox.world import MNT_DETACH, MS_BIND, MS_RDONLY, MS_REC, mount

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
MS_PRIVATE = 1 << 18
MS_REMOUNT = 32
RWF_NOWAIT = 0x00000008


def private_namespace() -> None:
    if _libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE, None)


def umount(path: str) -> None:
    if _libc.umount2(path.encode(), MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), f"umount {path}")


def bytes_of(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, files in os.walk(path)
        for f in files
        if os.path.isfile(os.path.join(d, f))
    )


def build(kind: str, paths: list[str], root: str) -> list[str]:
    """One run's world under ``root``; the mount points to take down, innermost first."""
    mount("tmpfs", root, "tmpfs", 0, "size=512m")
    mounted = [root]
    for k, host in enumerate(paths):
        inside = os.path.join(root, f"p{k}")
        if kind == "copy" or (kind == "overlay" and os.path.isfile(host)):
            if os.path.isdir(host):
                shutil.copytree(host, inside, symlinks=True)
            else:
                shutil.copy2(host, inside)
        elif kind == "overlay":
            upper, work = os.path.join(root, f"u{k}"), os.path.join(root, f"w{k}")
            for d in (inside, upper, work):
                os.mkdir(d)
            options = f"lowerdir={host},upperdir={upper},workdir={work}"
            mount("overlay", inside, "overlay", 0, options)
            mounted.append(inside)
        else:  # bind, read-only
            if os.path.isdir(host):
                os.mkdir(inside)
            else:
                open(inside, "w").close()
            mount(host, inside, None, MS_BIND, None)
            mount(None, inside, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
            mounted.append(inside)
    return mounted[::-1]


def take_down(mounted: list[str]) -> None:
    for point in mounted:
        umount(point)


def world_ms(kind: str, paths: list[str], runs: int) -> float:
    times = []
    with tempfile.TemporaryDirectory() as base:
        root = os.path.join(base, "run")
        os.mkdir(root)
        for _ in range(runs):
            start = time.perf_counter()
            take_down(build(kind, paths, root))
            times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times), 2)


def _resident(fd: int) -> bool:
    """Whether the file's first page is in the page cache: ``mincore`` of a shared read-only
    mapping (what a program inside could ask; ``preadv2(RWF_NOWAIT)`` is refused by overlayfs)."""
    mmap_, munmap, mincore = _libc.mmap, _libc.munmap, _libc.mincore
    mmap_.restype = ctypes.c_void_p
    mmap_.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    mmap_.argtypes += [ctypes.c_int, ctypes.c_long]
    munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    address = mmap_(None, 4096, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    vec = ctypes.create_string_buffer(1)
    try:
        if mincore(address, 4096, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return bool(vec.raw[0] & 1)
    finally:
        munmap(address, 4096)


def evict(path: str) -> bool:
    """Drops ``path``'s pages from the page cache (the host's own file); True if it could."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return not _resident(fd)
    finally:
        os.close(fd)


def channels(kind: str, paths: list[str], target: int, name: str) -> tuple[bool, bool]:
    """(locks shared, pages shared) between two runs' worlds of ``kind``."""
    host = os.path.join(paths[target], name)
    with tempfile.TemporaryDirectory() as base:
        roots = [os.path.join(base, r) for r in ("a", "b")]
        for r in roots:
            os.mkdir(r)
        worlds = [build(kind, paths, r) for r in roots]
        try:
            files = [os.path.join(r, f"p{target}", name) for r in roots]
            a, b = (os.open(f, os.O_RDONLY) for f in files)
            fcntl.flock(a, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locks_shared = False
            except BlockingIOError:
                locks_shared = True
            evicted = evict(host) and not _resident(a)
            os.pread(b, 4096, 0)  # run b reads the page
            pages_shared = evicted and _resident(a)
            os.close(a)
            os.close(b)
        finally:
            for w in worlds:
                take_down(w)
    return locks_shared, pages_shared


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    if os.name != "posix" or os.geteuid() != 0:
        print("needs Linux as root (a mount namespace of our own)", file=sys.stderr)
        return 2
    paths = interpreter_world(python_for_sandbox())["binds"]
    stdlib = next(p for p in paths if os.path.isfile(os.path.join(p, "os.py")))
    target = paths.index(stdlib)
    pid = os.fork()
    if pid:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    private_namespace()
    result: dict[str, object] = {
        "bound_paths": len(paths),
        "bound_mb": round(sum(bytes_of(p) for p in paths) / 1e6, 1),
    }
    rows = []
    for kind in ("bind", "overlay", "copy"):
        ms = world_ms(kind, paths, args.runs)
        locks, pages = channels(kind, paths, target, "os.py")
        result.update({f"{kind}_ms": ms, f"{kind}_locks_shared": locks})
        result[f"{kind}_pages_shared"] = pages
        rows.append((kind, ms, locks, pages))
    print(f"{len(paths)} bound paths, {result['bound_mb']} MB")
    print(f"{'world':<9}{'ms a run':>10}{'locks shared':>14}{'pages shared':>14}")
    for kind, ms, locks, pages in rows:
        print(f"{kind:<9}{ms:>10.2f}{locks!s:>14}{pages!s:>14}")
    print(json.dumps(result))
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
