"""The system calls the kernel lets through seccomp whatever the filter says, and a check.

Standard library only. Linux runs two x86-64 calls before any seccomp filter
sees them, because only code the kernel itself maps may use them (both are
constant-allowed in ``kernel/seccomp.c``: the filter is never run for them):

- ``uretprobe`` (335): the call since 6.11 (ff474a78cef5, "uprobe: Add
  uretprobe syscall to speed up return probe"); exempt from seccomp since
  6.14 by cf6cb56ef244, "seccomp: passthrough uretprobe systemcall without
  filtering" (Eyal Birger, tagged for stable), which the stable kernels took
  too (the 6.13-stable review series of 2025-02-13 carries it): a 6.11 to
  6.13 kernel exempts it if its stable release has the backport.
- ``uprobe`` (336): the call and its exemption since 6.18, 89d1d8434d24,
  "seccomp: passthrough uprobe systemcall without filtering" (Jiri Olsa;
  merged into tip's perf/core on 2025-08-21, after the 6.17 merge window).

Called from anywhere but the kernel's ``[uprobes]`` trampoline -- a page that
exists only while a uprobe is attached to the process, which needs
``perf_event_open`` or ``bpf`` from the host, both refused here -- the kernel
answers with a signal that kills the caller (``uretprobe``: SIGILL) or an
error (``uprobe``). No exploit of either is known. :func:`check` refuses a
kernel in :data:`EXPLOITABLE` (empty today) and says when it cannot tell: a
kernel newer than :data:`REVIEWED_UP_TO` may exempt calls not listed here.
:func:`probe` shows on this machine which of the two reach the kernel
through the sandbox's filter.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re

__all__ = [
    "EXEMPT",
    "EXPLOITABLE",
    "REVIEWED_UP_TO",
    "KernelRefused",
    "check",
    "release",
    "this_kernel",
]


@dataclasses.dataclass(frozen=True)
class Exemption:
    """A call seccomp never sees: its x86-64 number, from which kernel, why harmless.

    ``since`` is the first mainline kernel that exempts it; ``backported_from``
    the first kernel whose stable releases may (the call's first kernel: a
    stable release there exempts it if it took the backport).
    """

    name: str
    number: int
    since: tuple[int, int]
    harmless_because: str
    backported_from: tuple[int, int] | None = None


EXEMPT = (
    Exemption(
        "uretprobe", 335, (6, 14), "SIGILL unless called from the uprobes trampoline", (6, 11)
    ),
    Exemption("uprobe", 336, (6, 18), "an error unless called from the uprobes trampoline"),
)
# (call, first kernel, first fixed kernel) of an exemption known to be exploitable: none.
EXPLOITABLE: tuple[tuple[str, tuple[int, int], tuple[int, int]], ...] = ()
REVIEWED_UP_TO = (6, 18)  # the newest kernel whose seccomp exemptions were read


class KernelRefused(OSError):
    """The kernel exempts from seccomp a call known to be exploitable."""


def release(text: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a ``uname -r`` string, or None if it has none."""
    found = re.match(r"(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def check(uname_release: str) -> str:
    """What the filter's exemptions are on this kernel, in one line.

    Raises:
      KernelRefused: an exemption of this kernel is known to be exploitable.
    """
    version = release(uname_release)
    if version is None:
        return f"cannot tell: kernel release {uname_release!r} has no version"
    for name, first, fixed in EXPLOITABLE:
        if first <= version < fixed:
            raise KernelRefused(
                f"kernel {uname_release} lets {name} through seccomp and that is known to be "
                f"exploitable before {fixed[0]}.{fixed[1]}: the sandbox refuses this kernel"
            )
    exempt = [e.name for e in EXEMPT if version >= e.since]
    exempt += [
        f"{e.name} if this stable release took the backport"
        for e in EXEMPT
        if e.backported_from is not None and e.backported_from <= version < e.since
    ]
    listed = ", ".join(exempt) if exempt else "none"
    if version > REVIEWED_UP_TO:
        return (
            f"cannot tell: kernel {uname_release} is newer than the last reviewed; {listed} known"
        )
    return f"exempt from the filter: {listed} (none known exploitable)"


@functools.cache
def this_kernel() -> str:
    """:func:`check` of the running kernel, once per process (raises as it does)."""
    return check(os.uname().release)
