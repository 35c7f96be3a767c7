"""Host memory: let the CPU backend reuse its scratch memory from step to step.

XLA:CPU allocates one scratch buffer per call of a compiled program (the train
step's is about 1 GB on the benchmark workload) and frees it when the call
ends. The allocating thread is one of XLA's workers, whose glibc malloc arena
cannot hold a block that large, so every call maps fresh memory from the
kernel and unmaps it again: the kernel zeroes and faults in every page of it,
every step. Measured on the benchmark's train step (2-core CPU): 20% of the
step's samples were in the kernel, and the step went from 1.38 s to 1.09 s
once the memory was kept (see docs/mesh.md § Host memory).

:func:`reuse_freed_memory` asks glibc (``mallopt``) to serve every thread
from one arena that grows with ``brk`` and never hands memory back: the
process keeps its high-water mark of host memory and reuses it. It only
helps if called before JAX starts its backend (the worker threads choose
their arena on their first allocation), so ``rlax``'s command line calls it
first thing; a script that builds a :class:`~rlax.core.trainer.step.Trainer`
itself calls it before its first JAX computation.

:func:`keep_message_buffers` is the parameter server's and its clients'
milder setting, for the weight messages they build; it leaves a process
where :func:`reuse_freed_memory` took effect as it is.

``RLAX_HOST_MALLOC`` chooses: ``auto`` (the default: reuse when JAX will run
on the CPU, i.e. no accelerator plugin is installed and ``JAX_PLATFORMS``
names no other platform), ``reuse``, or ``system`` (leave malloc alone).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import logging
import os
import pkgutil
import platform
import sys

__all__ = ["ENV", "keep_message_buffers", "reuse_freed_memory"]

log = logging.getLogger(__name__)

ENV = "RLAX_HOST_MALLOC"
_MODES = ("auto", "reuse", "system")

# mallopt parameters (glibc's <malloc.h>).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_NEVER_TRIM = -1  # disables trimming altogether (man 3 mallopt)

_ACCELERATOR_MODULES = ("libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm7_plugin")

_MB = 1 << 20

_applied: str | None = None
_messages_kept = False


def reuse_freed_memory(mode: str | None = None) -> str:
    """Makes freed host memory stay in the process for the next allocation.

    Args:
      mode: ``auto``, ``reuse`` or ``system``; ``None`` reads ``RLAX_HOST_MALLOC``
        (default ``auto``).

    Returns:
      What was done: ``reused`` (malloc now keeps freed memory), ``system``
      (left alone: asked to, or not the CPU backend under ``auto``),
      ``unsupported`` (not glibc), or ``too late`` (JAX's backend was already
      running; nothing changed). A second call returns the first call's answer.

    Raises:
      ValueError: an unknown mode.
    """
    global _applied
    mode = (os.environ.get(ENV, "auto") if mode is None else mode).strip().lower()
    if mode not in _MODES:
        raise ValueError(f"{ENV}={mode!r}: expected one of {', '.join(_MODES)}")
    if _applied is not None:
        return _applied
    if mode == "system" or (mode == "auto" and not _cpu_backend_expected()):
        _applied = "system"
    elif platform.libc_ver()[0] != "glibc":
        _applied = "unsupported"
    elif _backend_started():
        log.warning("%s: JAX's backend is already running; host malloc left as it is", ENV)
        _applied = "too late"
    else:
        libc = ctypes.CDLL(None)
        ok = all(
            libc.mallopt(param, value) == 1
            for param, value in (
                (_M_ARENA_MAX, 1),  # every thread in the main arena, which can grow past 64 MB
                (_M_MMAP_MAX, 0),  # large blocks from the heap, not fresh mappings
                (_M_TRIM_THRESHOLD, _NEVER_TRIM),  # and the heap's top is kept
            )
        )
        _applied = "reused" if ok else "unsupported"
    return _applied


def keep_message_buffers() -> None:
    """Lets large weight messages reuse warm heap memory (glibc only; a no-op elsewhere).

    gRPC's Python API takes each message as a fresh ``bytes`` object. glibc
    serves allocations of a few MB with new ``mmap`` pages by default, and
    faulting those pages in costs more than copying the chunk itself; raising
    the mmap and trim thresholds keeps freed chunks in the heap for the next
    version's chunks (measured: 256 MB of chunks built in ~0.11 s instead of
    ~0.21 s, see benchmarks/weight_sync.py).

    Nothing changes where :func:`reuse_freed_memory` took effect: it already
    keeps every freed block, and a 1 GB trim threshold set here would hand a
    train step's freed scratch back to the kernel (measured: the benchmark
    step went from 1.04 s back to 1.34 s).
    """
    global _messages_kept
    if _messages_kept or _applied == "reused":
        return
    _messages_kept = True
    if platform.libc_ver()[0] != "glibc":
        return
    libc = ctypes.CDLL(None)
    libc.mallopt(_M_MMAP_THRESHOLD, 256 * _MB)
    libc.mallopt(_M_TRIM_THRESHOLD, 1024 * _MB)


def _cpu_backend_expected() -> bool:
    """Whether JAX will run on the CPU: no accelerator platform asked for or installed."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    if importlib.metadata.entry_points(group="jax_plugins"):
        return False
    namespace = importlib.util.find_spec("jax_plugins")  # JAX's other way to find plugins
    if namespace is not None and any(pkgutil.iter_modules(namespace.submodule_search_locations)):
        return False
    return not any(importlib.util.find_spec(name) for name in _ACCELERATOR_MODULES)


def _backend_started() -> bool:
    """Whether JAX has already created its backends (and with them its worker threads)."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover -- a JAX without the module
        return False
    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started()) if started is not None else False
