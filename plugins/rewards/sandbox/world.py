"""The sandbox's minimal world: a tmpfs root holding the interpreter and nothing else.

Standard library only; imported by ``sandbox/supervisor.py`` inside the
sandbox's own user and mount namespaces (by init, holding the capabilities
of that user namespace, before the program starts).
:func:`enter_world` builds, under a fresh tmpfs, a directory tree that holds

- read-only bind mounts of exactly the paths the caller lists (the
  interpreter, its shared libraries, its standard library), each at its host
  path, with the host's symlinks along the way recreated (``/lib`` →
  ``usr/lib``) so that the dynamic loader finds what it looks for;
- empty read-only tmpfs mounts over the paths to hide (``site-packages``
  inside the standard library);
- ``/dev/null``, ``/dev/zero``, ``/dev/urandom`` (bind mounts of the devices);
- a fresh ``/proc`` (of the sandbox's pid namespace);
- ``/tmp``: the only writable place, a size-capped tmpfs;

then makes it the root (``pivot_root``), detaches the host's root and makes
the skeleton read-only. No host path is left to open, read or list: the
project's sources, ``/etc``, ``/home`` and the host's ``/tmp`` do not exist in
that world. The paths chosen come from the caller
(:func:`rlax.plugins.rewards.sandbox.interpreter.interpreter_world`).
"""

from __future__ import annotations

import ctypes
import os
import platform

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 0x4000, 0x40000
MNT_DETACH = 2
ST_NOATIME, ST_NODIRATIME, ST_RELATIME, MS_RELATIME = 1024, 2048, 4096, 1 << 21
# pivot_root(2) has no glibc wrapper; its syscall number per architecture.
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "ppc64le": 203, "s390x": 217}
NEW_ROOT = "/tmp"  # a mount point in our private namespace; the host's /tmp is untouched
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    """mount(2), raising ``OSError`` naming ``target``."""
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _bind(host: str, inside: str, *, read_only: bool, flags: int) -> None:
    if os.path.isdir(host):
        os.makedirs(inside, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(inside), exist_ok=True)
        if not os.path.exists(inside):
            open(inside, "w").close()
    mount(host, inside, None, MS_BIND | MS_REC, None)
    # A bind mount takes its flags only on a remount (mount(8) does the same). In a
    # user namespace the host mount's own flags are locked: keep them (bubblewrap does too).
    remount = MS_BIND | MS_REMOUNT | flags | (MS_RDONLY if read_only else 0)
    held = os.statvfs(host).f_flag
    remount |= held & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | ST_NOATIME | ST_NODIRATIME)
    remount |= MS_RELATIME if held & ST_RELATIME else 0
    mount(None, inside, None, remount, None)


def _place(root: str, path: str, bound: set[str], depth: int = 0) -> None:
    """Binds host ``path`` at ``root + path``, recreating symlinks on the way."""
    if depth > 16:
        raise OSError(f"sandbox world: too many symlinks resolving {path}")
    parts = [p for p in path.split("/") if p]
    current = ""
    for i, part in enumerate(parts):
        current += "/" + part
        if current in bound:
            return  # inside a directory already bound
        inside = root + current
        if os.path.islink(current):
            target = os.readlink(current)
            if not os.path.lexists(inside):
                os.makedirs(os.path.dirname(inside), exist_ok=True)
                os.symlink(target, inside)
            resolved = os.path.normpath(os.path.join(os.path.dirname(current), target))
            _place(root, "/".join([resolved, *parts[i + 1 :]]), bound, depth + 1)
            return
    _bind(current, root + current, read_only=True, flags=MS_NOSUID | MS_NODEV)
    bound.add(current)


def _pivot(root: str) -> None:
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(f"sandbox world: no pivot_root syscall number for {platform.machine()}")
    os.mkdir(root + "/.old")
    _check(_libc.syscall(number, root.encode(), (root + "/.old").encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")


def enter_world(world: dict, scratch_mb: int) -> str:
    """Makes the minimal world this process's root; returns the scratch dir (``/tmp``).

    Args:
      world: ``{"binds": [host paths], "hide": [host paths]}``.
      scratch_mb: size of the writable ``/tmp``.
    """
    mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    mount("tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    try:
        _furnish(world, scratch_mb)
    except OSError:
        _libc.umount2(NEW_ROOT.encode(), MNT_DETACH)  # give the weak mode its /tmp back
        raise
    _pivot(NEW_ROOT)
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    return "/tmp"


def _furnish(world: dict, scratch_mb: int) -> None:
    bound: set[str] = set()
    for path in sorted(world["binds"]):
        if not os.path.lexists(path):
            raise OSError(f"sandbox world: {path} does not exist on the host")
        _place(NEW_ROOT, path, bound)
    for path in world.get("hide", ()):
        if os.path.isdir(NEW_ROOT + path):
            mount("tmpfs", NEW_ROOT + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
    for device in DEVICES:
        _bind(device, NEW_ROOT + device, read_only=False, flags=MS_NOSUID | MS_NOEXEC)
    os.mkdir(NEW_ROOT + "/proc")
    mount("proc", NEW_ROOT + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    os.makedirs(NEW_ROOT + "/tmp", exist_ok=True)
    mount(
        "tmpfs", NEW_ROOT + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={scratch_mb}m,mode=1777"
    )
