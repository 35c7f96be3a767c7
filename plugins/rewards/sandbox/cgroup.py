"""The run's cgroup: one memory and process bound for everything a program starts.

Standard library only; used by ``sandbox/supervisor.py`` outside every
namespace. Per-process limits (``RLIMIT_AS``, ``RLIMIT_NPROC``) leave a run of
several processes free to hold their sum, and memory that is not mapped is
no address space at all (pipe buffers, files in a tmpfs); a memory cgroup
counts all of it, for every process of the run, and its peak is what the
kernel measured.

:func:`create` makes a child of the supervisor's own cgroup
(``/proc/self/cgroup``) where it may: as root, or as a user the cgroup was
delegated to (a directory owned by that user, as systemd's ``Delegate=yes``
or ``.ci/run`` set up). cgroup v2 is used when its ``memory`` and ``pids``
controllers can be had there, else v1's ``memory`` and ``pids`` hierarchies.
The group gets ``memory_mb`` (swap 0) and ``processes`` as limits; the
sandbox's init is moved into it before it forks the program, so everything
the program starts is born there and the supervisor and its runner stay out.
Without one (an ordinary user nobody delegated a cgroup to), :func:`create`
raises ``OSError`` saying why, and the sandbox's init bounds the run with a
:class:`ResidentWatch` instead: every ``POLL_S`` it sums the memory its pid
namespace's processes hold and kills them all past ``memory_mb``. The watch is
the weaker bound: it sees resident memory only (what is not mapped is bounded
apart: no ``memfd``/System V memory under the system-call filter, the scratch
tmpfs's size, pipes by ``open_files``), and a run may pass the bound by what
its processes fault in within one poll before it is killed.
"""

from __future__ import annotations

import errno
import os
import time

PREFIX = "rlax-sandbox-"


def _mounts() -> dict[str, str]:
    """Mount point of cgroup v2 (``"v2"``) and of each v1 controller."""
    found: dict[str, str] = {}
    with open("/proc/self/mounts", encoding="utf-8") as f:
        for line in f:
            _, point, kind, options, *_ = line.split()
            if kind == "cgroup2":
                found.setdefault("v2", point)
            elif kind == "cgroup":
                for option in options.split(","):
                    if option in ("memory", "pids"):
                        found.setdefault(option, point)
    return found


def _own() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and ``"v2"``'s."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else ["v2"]:
                paths[controller] = path
    return paths


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


class RunGroup:
    """One run's cgroup (v1: a memory and a pids group; v2: one group)."""

    def __init__(self, version: int, dirs: list[str]) -> None:
        self.version, self.dirs = version, dirs

    def join(self, pid: int) -> None:
        """Moves process ``pid`` into the group(s); its children are born there."""
        for d in self.dirs:
            _write(os.path.join(d, "cgroup.procs"), str(pid))

    def peak_bytes(self) -> int | None:
        """The most memory the group held at once (kernel-measured), if the kernel says."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            with open(os.path.join(self.dirs[0], name), encoding="ascii") as f:
                return int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def remove(self, wait_s: float = 2.0) -> None:
        """Removes the groups once the kernel has let go of their (killed) processes."""
        deadline = time.monotonic() + wait_s
        for d in self.dirs:
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        break
                    time.sleep(0.005)


def _sweep_stale(parent: str) -> None:
    """Removes groups left by supervisors that died (their pid is in the name)."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(PREFIX) :].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.rmdir(os.path.join(parent, name))
            except OSError:
                pass


def _make(parent: str, name: str) -> str:
    _sweep_stale(parent)
    path = os.path.join(parent, name)
    os.mkdir(path)
    return path


def _v2(point: str, own: str, name: str, memory: int, processes: int) -> RunGroup:
    parent = point + own.rstrip("/")
    with open(os.path.join(parent, "cgroup.controllers"), encoding="ascii") as f:
        if not {"memory", "pids"} <= set(f.read().split()):
            raise OSError(f"{parent}: no memory and pids controllers")
    with open(os.path.join(parent, "cgroup.subtree_control"), encoding="ascii") as f:
        delegated = {"memory", "pids"} <= set(f.read().split())
    if not delegated:  # only a group without processes of its own may enable them
        _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
    path = _make(parent, name)
    try:
        _write(os.path.join(path, "memory.max"), str(memory))
        if os.path.exists(os.path.join(path, "memory.swap.max")):
            _write(os.path.join(path, "memory.swap.max"), "0")
        _write(os.path.join(path, "pids.max"), str(processes))
    except OSError:
        RunGroup(2, [path]).remove(0)
        raise
    return RunGroup(2, [path])


def _v1(mounts: dict[str, str], own: dict[str, str], name: str, memory: int, processes: int):
    dirs: list[str] = []
    try:
        for controller in ("memory", "pids"):
            parent = mounts[controller] + own.get(controller, "/").rstrip("/")
            dirs.append(_make(parent, name))
        _write(os.path.join(dirs[0], "memory.limit_in_bytes"), str(memory))
        swap = os.path.join(dirs[0], "memory.memsw.limit_in_bytes")
        if os.path.exists(swap):
            _write(swap, str(memory))
        _write(os.path.join(dirs[1], "pids.max"), str(processes))
    except (OSError, KeyError):
        RunGroup(1, dirs).remove(0)
        raise
    return RunGroup(1, dirs)


def create(name: str, memory_mb: int, processes: int) -> RunGroup:
    """A new cgroup ``name`` under this process's own, bounding memory and processes.

    Raises:
      OSError: no cgroup can be had here (the message says why).
    """
    mounts, own, memory = _mounts(), _own(), memory_mb * 1024 * 1024
    reasons = []
    if "v2" in mounts and "v2" in own:
        try:
            return _v2(mounts["v2"], own["v2"], name, memory, processes)
        except OSError as exc:
            reasons.append(f"v2: {exc}")
    if "memory" in mounts and "pids" in mounts:
        try:
            return _v1(mounts, own, name, memory, processes)
        except (OSError, KeyError) as exc:
            reasons.append(f"v1: {exc}")
    raise OSError("no cgroup for the run (" + ("; ".join(reasons) or "none mounted") + ")")


POLL_S = 0.01  # the watch's period (the supervisor's capture loop polls this often)


def _resident_bytes(process: str, page: int) -> int:
    """The resident set of the process whose ``/proc`` folder is ``process`` (0 once gone)."""
    try:
        with open(f"{process}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * page
    except (FileNotFoundError, ProcessLookupError):
        return 0


def _proportional_bytes(process: str) -> int | None:
    """Its share of what it maps (``Pss``; 0 once gone, None where unreadable)."""
    try:
        with open(f"{process}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return 0
    except (OSError, ValueError):
        return None
    return None


class ResidentWatch:
    """The run's memory bound without a cgroup, kept by the pid namespace's init.

    :meth:`over` sums the resident set of every process in ``/proc`` (the
    namespace's own); past the bound it sums their proportional set (shared
    pages counted once, so forks of one interpreter are not counted many times)
    and only that decides. ``peak_bytes`` is the most it counted.
    """

    def __init__(self, memory_mb: int, proc: str = "/proc") -> None:
        self.limit, self.proc = memory_mb * 1024 * 1024, proc
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.peak_bytes, self.exceeded = 0, False

    def _processes(self) -> list[str]:
        return [f"{self.proc}/{name}" for name in os.listdir(self.proc) if name.isdigit()]

    def over(self) -> bool:
        """True once the run's processes hold more than the bound (it stays True)."""
        processes = self._processes()
        total = sum(_resident_bytes(process, self.page) for process in processes)
        if total > self.limit:
            shares = [_proportional_bytes(process) for process in processes]
            if all(share is not None for share in shares):  # else resident decides
                total = sum(share for share in shares if share is not None)
        self.peak_bytes = max(self.peak_bytes, total)
        self.exceeded = self.exceeded or total > self.limit
        return self.exceeded


def for_run(job: dict, isolation: dict) -> RunGroup | None:
    """The run's group for ``job`` (None without one); ``isolation`` records which, or why not."""
    limits = job["limits"]
    name = f"{PREFIX}{os.getpid()}-{job['uid']}"
    try:
        group = create(name, limits["run_memory_mb"], limits["processes"] + 1)
    except OSError as exc:
        isolation["run_limits"], isolation["cgroup_reason"] = "per process only", str(exc)
        return None
    isolation["run_limits"] = f"cgroup v{group.version}"
    isolation["run_memory_mb"] = limits["run_memory_mb"]
    return group


def admit(init_pid: bytes, group: RunGroup | None, go: int) -> None:
    """Moves init into the run's cgroup (the program is born there), then lets it start.

    Moving a process costs a kernel grace period (~15 ms a hierarchy): done while
    init builds the world, it costs the run nothing. Closing ``go`` unsent stops it.
    """
    try:
        if group is not None and init_pid:
            group.join(int(init_pid))
        os.write(go, b"1")
    except OSError:
        pass  # init reads no "1" and reports that the cgroup could not be joined
    finally:
        os.close(go)
