"""The system calls the kernel lets through seccomp whatever the filter says, and a check.

Standard library only. Linux runs two x86-64 calls before any seccomp filter
sees them, because only code the kernel itself maps may use them:

- ``uretprobe`` (335): added in 6.11; exempt from seccomp since 6.14 (the
  commit "seccomp: passthrough uretprobe systemcall without filtering", also
  taken into the stable kernels that have the call).
- ``uprobe`` (336): added, and exempt, in 6.16.

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
    """A call seccomp never sees: its x86-64 number, from which kernel, why harmless."""

    name: str
    number: int
    since: tuple[int, int]
    harmless_because: str


EXEMPT = (
    Exemption("uretprobe", 335, (6, 14), "SIGILL unless called from the uprobes trampoline"),
    Exemption("uprobe", 336, (6, 16), "an error unless called from the uprobes trampoline"),
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
