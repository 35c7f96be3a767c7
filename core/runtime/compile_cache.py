"""The persistent compilation cache a run's roles share: JAX's own, in the run directory.

A restarted role (a preempted trainer, a killed worker, ``rlax run --resume``) would
otherwise compile every program its previous incarnation compiled. Each role that
compiles -- the trainer, the inline trainer, a worker, ``rlax eval`` -- turns the
cache on at start, before anything compiles (:func:`start`, from the CLI), so the
first incarnation writes each program it compiles and the next one reads them back.
The supervisor (``rlax run``, role ``all``) never starts JAX: its children get
``--run-dir RUN`` and find the cache there themselves.

``rlax.compile_cache.path`` says where (docs/preemption.md, "The compilation cache")::

    True (default)        RUN/compile_cache: every role of the run, and every restart
    '/some/dir'           that directory (``~`` expanded): shared across runs too
    False or ''           off

With the default a role that has no run directory (a cluster worker started without
``--run-dir``, ``rlax eval`` of a checkpoint outside a run) compiles without a cache.
JAX keys each entry by the program, the jaxlib version, the backend and its version,
the devices, the XLA flags and the compile options, so an entry written by another
release or for another backend is never read back: the role compiles and adds its own.

A restarted role would still trace and lower each program to find its key: while the
cache is on, whole compiled programs are kept beside it too (``executables/``,
:mod:`rlax.core.runtime.executables`), so the trainer's steps are called again without
tracing.

The cache lives as long as the command (:func:`session`): a role that refuses its
settings after it compiled something takes back the folder it made, and JAX's cache is
turned off again when the command returns. :func:`counts` counts this process's reads
(hits) and writes (misses).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
import shutil
import threading
from collections.abc import Iterator
from typing import Annotated

from rlax.core.constraints import AtLeast, check_fields
from rlax.core.errors import ConfigError
from rlax.core.runtime import executables
from rlax.core.runtime.run_dir import RunDir

__all__ = [
    "CompileCacheSettings",
    "CompileCounts",
    "counts",
    "listen",
    "session",
    "start",
    "start_in_run",
]

#: The folder of the cache where whole compiled programs are kept (:mod:`executables`).
EXECUTABLES = "executables"
# JAX's monitoring events: a program read from the cache, and one compiled and written.
HIT_EVENT = "/jax/compilation_cache/cache_hits"
MISS_EVENT = "/jax/compilation_cache/cache_misses"
# JAX says which program missed, with its key, at DEBUG in its compiler's logger.
COMPILER_LOGGER = "jax._src.compiler"
MISS_MESSAGE = "PERSISTENT COMPILATION CACHE MISS for '%s' with key %r"
# The seconds of making a program: tracing, lowering, and compiling it or reading it
# back from the cache (the last, "backend compile", wraps the cache's read).
COMPILE_EVENTS = frozenset(
    {
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
        executables.LOAD_EVENT,  # a whole program read back without tracing
    }
)


@dataclasses.dataclass(frozen=True)
class CompileCacheSettings:
    """Where the run's compiled programs are kept (``rlax.compile_cache``; see the module doc).

    ``path``: True: the run directory's ``compile_cache/``; a string: that directory;
    False or ``''``: no cache. ``min_compile_time_s``: programs that compile faster than
    this are not written (JAX's default is 1 s; 0 writes every one, so a restarted role
    compiles nothing its previous incarnation compiled).
    """

    path: str | bool = True
    min_compile_time_s: Annotated[float, AtLeast(0, means="0: every program")] = 0.0

    def __post_init__(self) -> None:
        check_fields(self)

    def directory(self, run_dir: RunDir | None) -> pathlib.Path | None:
        """The cache's directory for a role in ``run_dir`` (None: none, or no cache)."""
        if self.path is True:
            return run_dir.compile_cache.absolute() if run_dir is not None else None
        if not self.path:
            return None
        return pathlib.Path(os.path.expanduser(str(self.path))).absolute()


@dataclasses.dataclass
class CompileCounts:
    """This process's cache hits (programs read back) and misses (compiled and written),
    and the seconds it spent making programs (``compile_s``: tracing, lowering, compiling
    or reading back; counted once :func:`listen` was called, with or without a cache)."""

    hits: int = 0
    misses: int = 0
    compile_s: float = 0.0
    #: Whole programs read back from the store (:mod:`executables`): neither traced nor
    #: looked up in the cache, so not among the hits.
    loaded: int = 0
    #: The cache keys of the misses (an entry's file is ``<key>-cache`` in the cache).
    missed: tuple[str, ...] = ()

    def metrics(self) -> dict[str, float]:
        return {
            "compile/cache_hits": float(self.hits),
            "compile/cache_misses": float(self.misses),
            "compile/programs_loaded": float(self.loaded),
        }


_counts = CompileCounts()
_lock = threading.Lock()
_listening = False
_pending: CompileCacheSettings | None = None  # in the run, whose directory is not made yet
_made: pathlib.Path | None = None  # the cache folder, if it was not there when it was turned on
_on = False  # JAX's cache is turned on (JAX is imported)


def counts() -> CompileCounts:
    """This process's counts so far (a copy); zero until :func:`start` turned the cache on."""
    with _lock:
        return dataclasses.replace(_counts)


def start(settings: CompileCacheSettings, run_dir: RunDir | None) -> pathlib.Path | None:
    """Turns JAX's persistent cache on for this process, in ``settings.directory(run_dir)``.

    Call it before anything compiles. With ``path = True`` and no run directory yet (a
    trainer that makes its own), the cache waits for :func:`start_in_run`.

    Returns:
      The cache's directory, or None: no cache (yet).
    """
    global _pending
    directory = settings.directory(run_dir)
    _pending = settings if settings.path is True and run_dir is None else None
    if directory is not None:
        _turn_on(directory, settings.min_compile_time_s)
    return directory


def start_in_run(run_dir: RunDir) -> pathlib.Path | None:
    """The cache :func:`start` left waiting for a run directory, now in ``run_dir`` (None:
    none was waiting)."""
    return start(_pending, run_dir) if _pending is not None else None


@contextlib.contextmanager
def session() -> Iterator[None]:
    """One command's use of the cache (``rlax.core.cli.main``): if a role refuses its
    settings (ConfigError) after it compiled something, the cache folder it made goes too
    (a refused role leaves the run directory as it was); at the end JAX's cache is turned
    off again, so an in-process caller (a test) compiles on without it."""
    try:
        yield
    except ConfigError:
        if _made is not None:
            shutil.rmtree(_made, ignore_errors=True)
        raise
    finally:
        _stop()


def _stop() -> None:
    global _pending, _made, _on
    _pending, _made = None, None
    if _on:
        import jax
        from jax.experimental.compilation_cache import compilation_cache

        jax.config.update("jax_compilation_cache_dir", None)
        compilation_cache.reset_cache()  # JAX keeps the folder it opened until this
        executables.stop()
        _on = False


def _turn_on(directory: pathlib.Path, min_compile_time_s: float) -> None:
    import jax  # here, not at import: the supervisor imports this module and never starts JAX
    from jax.experimental.compilation_cache import compilation_cache

    global _made, _on
    _made = None if directory.exists() else directory
    _on = True
    # JAX decides once per process whether it uses a cache, at its first compilation: a
    # process that compiled before this (a trainer loading its policy before it made its
    # run directory) would keep compiling without one. Reset makes it look again.
    compilation_cache.reset_cache()
    # JAX makes the folder at the first compilation: a role refused before that leaves none.
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_time_s)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # every size
    executables.start(directory / EXECUTABLES)
    listen()


def listen() -> None:
    """Counts JAX's cache events and compile seconds in :data:`_counts` (one listener per
    process; it imports JAX)."""
    global _listening
    with _lock:
        if _listening:
            return
        _listening = True
    import jax

    def count(event: str, **_: object) -> None:
        if event in (HIT_EVENT, MISS_EVENT):
            with _lock:
                if event == HIT_EVENT:
                    _counts.hits += 1
                else:
                    _counts.misses += 1

    _listen_for_missed_keys()

    def seconds(event: str, duration_secs: float, **_: str | int) -> None:
        if event in COMPILE_EVENTS:
            with _lock:
                _counts.compile_s += duration_secs
                _counts.loaded += event == executables.LOAD_EVENT

    jax.monitoring.register_event_listener(count)
    jax.monitoring.register_event_duration_secs_listener(seconds)


class _MissedKeys(logging.Filter):
    """Takes the key of each cache miss from JAX's debug message; lets through only what
    JAX's compiler logger would have let through without it (no new debug lines)."""

    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == MISS_MESSAGE and len(record.args or ()) == 2:
            key = str(record.args[1])  # type: ignore[index]
            with _lock:
                _counts.missed += (key,)
        return record.levelno >= self.level


def _listen_for_missed_keys() -> None:
    logger = logging.getLogger(COMPILER_LOGGER)
    level = logger.getEffectiveLevel()
    logger.addFilter(_MissedKeys(level))
    logger.setLevel(min(level, logging.DEBUG))  # JAX logs a miss's key at DEBUG
