"""Compiled programs kept whole across a role's restarts, called again without tracing.

JAX's persistent cache (:mod:`rlax.core.runtime.compile_cache`) saves XLA's compile, but
a restarted role still traces and lowers each program to find its cache key: for the
quickstart's train step about 1.2 s per variant, paid again for each row bucket its
batches come in (docs/preemption.md). This store keeps the compiled executable itself
(``jax.experimental.serialize_executable``) under a key made of everything the program is
a function of, so a restarted trainer calls what its predecessor compiled::

    the program      its name, and the caller's description of what it closes over
                     (the model's definition, the trainer's settings, the algorithm)
    its arguments    tree structure, shapes, dtypes, weak types and shardings
    the process      Python, jax, jaxlib, flax, optax and rlax versions; the devices;
                     XLA_FLAGS, LIBTPU_INIT_ARGS and JAX_* variables; JAX's configuration
                     (its cache settings aside); the gin configuration
    the code         size and modification time of every Python file of rlax and of the
                     packages the ``rlax`` entry points name (third-party plugins)

A change to any of them gives another key: the program is traced and compiled as before
(through the persistent cache) and stored under its new key -- if XLA compiled it: an
executable JAX read back from its persistent cache does not serialize whole on XLA:CPU,
so it is not stored (after a change to the code that leaves a program's HLO as it was,
restarts trace and lower it as without the store). An entry that cannot be read
back (another jaxlib wrote it, a truncated file) is logged and compiled again. Entries
are pickles written by the run's own roles, trusted like its checkpoints.

The store lives in the compilation cache's directory (``executables/``) and is on
whenever that cache is (:func:`rlax.core.runtime.compile_cache.start`); :func:`stored`
wraps a ``jax.jit`` function (a no-op with the store off).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import pathlib
import pickle
import re
import sys
import threading
import time
from typing import Any

import numpy as np

__all__ = ["LOAD_EVENT", "active", "describe", "prefetch", "start", "stop", "stored"]

log = logging.getLogger(__name__)

#: A monitoring event with the seconds spent reading one program back (counted with
#: compiling in :class:`rlax.core.runtime.compile_cache.CompileCounts`).
LOAD_EVENT = "/rlax/executables/load_duration"
_ENV_PREFIXES = ("JAX_", "XLA_FLAGS", "LIBTPU_INIT_ARGS")
_DISTRIBUTIONS = ("jax", "jaxlib", "flax", "optax", "rlax-llm")


def describe(value: Any) -> str:
    """``repr(value)`` without the object addresses that differ between processes."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


class Store:
    """Serialized executables in ``directory``, one file per key.

    A file is named ``<name>-<family>-<arguments>.exe``: the family is the program's name,
    what it closes over and the process's part; the arguments' part tells its variants
    apart (a batch's row buckets). :meth:`prefetch` reads a family's stored variants in
    the background, so a restarted trainer finds each one ready at its first batch.
    """

    def __init__(self, directory: pathlib.Path):
        self.directory = directory
        self._process: str | None = None
        self._lock = threading.Lock()
        self._ahead: dict[pathlib.Path, _Ahead] = {}
        self._readers: list[threading.Thread] = []
        self.loaded = self.written = 0

    def process_fingerprint(self) -> str:
        """The process's part of every key (computed once, at the first program)."""
        if self._process is None:
            self._process = _digest(_process_parts())
        return self._process

    def family(self, name: str, closure: str) -> str:
        return _digest([self.process_fingerprint(), name, closure])

    def key(self, name: str, closure: str, args: tuple) -> str:
        leaves, treedef = _flatten(args)
        arguments = _digest([str(treedef), *(_describe_leaf(x) for x in leaves)])
        return f"{self.family(name, closure)}-{arguments}"

    def executable(self, name: str, jitted: Any, closure: str, args: tuple) -> Any:
        """The compiled program for ``args``: read back if stored, else compiled and stored."""
        path = self.directory / f"{name}-{self.key(name, closure, args)}.exe"
        compiled = self._read_ahead(path)
        if compiled is None and path.exists():
            compiled = self._load(path)
        if compiled is not None:
            return compiled
        hits = _local.hits
        compiled = jitted.lower(*args).compile()
        # An executable JAX read back from its persistent cache serializes without its
        # kernels on XLA:CPU (calling it back fails: "Function ... not found"): only a
        # program this call compiled is stored.
        if _local.hits == hits:
            self._write(path, compiled)
        return compiled

    def prefetch(self, name: str, closure: str) -> int:
        """Starts reading every stored variant of the program ``name`` closing over
        ``closure`` in a background thread; returns how many. A variant asked for before
        the thread reached it is read by the caller instead (never twice)."""
        paths = sorted(self.directory.glob(f"{name}-{self.family(name, closure)}-*.exe"))
        with self._lock:
            paths = [p for p in paths if p not in self._ahead]
            for p in paths:
                self._ahead[p] = _Ahead()
            if paths:
                reader = threading.Thread(
                    target=self._read_all, args=(paths,), name=f"rlax-prefetch-{name}", daemon=True
                )
                self._readers.append(reader)
                reader.start()
        return len(paths)

    def close(self) -> None:
        """Ends the background reads: variants not read yet are dropped, the one being read
        finishes first. No read outlives the store: a thread inside XLA while the process
        tears its backend down (at exit), or while a caller goes on without the store (a
        test, after an in-process run), is left to neither."""
        with self._lock:
            for ahead in self._ahead.values():
                if ahead.state == "queued":
                    ahead.state = "taken"
            self._ahead.clear()
            readers, self._readers = self._readers, []
        for reader in readers:
            reader.join()

    def _read_all(self, paths: list[pathlib.Path]) -> None:
        for path in paths:
            with self._lock:
                ahead = self._ahead.get(path)
                if ahead is None or ahead.state != "queued":  # a caller took it
                    continue
                ahead.state = "reading"
            ahead.result = self._load(path)
            ahead.done.set()

    def _read_ahead(self, path: pathlib.Path) -> Any:
        """The program :meth:`prefetch` read (waiting while it reads it); None when it was
        not prefetched, could not be read, or is not reached yet (the caller reads it)."""
        with self._lock:
            ahead = self._ahead.pop(path, None)
            if ahead is None or ahead.state == "queued":
                if ahead is not None:
                    ahead.state = "taken"
                return None
        ahead.done.wait()
        return ahead.result

    def _load(self, path: pathlib.Path) -> Any:
        import jax
        from jax.experimental import serialize_executable

        start = time.perf_counter()
        try:
            payload, in_tree, out_tree, *ids = pickle.loads(path.read_bytes())
            # A program of a sub-mesh (one-process placement) runs on its own devices, not
            # on all of them: deserialised for every device, XLA aborts the process.
            by_id = {d.id: d for d in jax.devices()}
            on = [by_id[i] for i in ids[0]] if ids else None
            compiled = serialize_executable.deserialize_and_load(
                payload, in_tree, out_tree, execution_devices=on
            )
        except Exception as e:  # noqa: BLE001 -- any unreadable entry: dropped, compiled again
            log.warning("compiled program %s could not be read back (%s); compiling it", path, e)
            path.unlink(missing_ok=True)
            return None
        jax.monitoring.record_event_duration_secs(LOAD_EVENT, time.perf_counter() - start)
        with self._lock:
            self.loaded += 1
        return compiled

    def _write(self, path: pathlib.Path, compiled: Any) -> None:
        from jax.experimental import serialize_executable

        try:
            payload, in_tree, out_tree = serialize_executable.serialize(compiled)
            data = pickle.dumps((payload, in_tree, out_tree, *_sub_mesh(compiled)))
        except Exception as e:  # noqa: BLE001 -- a backend that cannot serialize: it still runs
            log.warning("compiled program %s not stored: %s", path.name, e)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        partial.write_bytes(data)
        os.replace(partial, path)  # a reader sees the whole file or none
        with self._lock:
            self.written += 1


@dataclasses.dataclass
class _Ahead:
    """One variant :meth:`Store.prefetch` queued: queued, reading, taken (by a caller
    that needed it first) or read (``done`` set, ``result`` the program or None)."""

    state: str = "queued"
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: Any = None


class _Stored:
    """A ``jax.jit`` function whose executables come from the store (see :func:`stored`)."""

    def __init__(self, store: Store, name: str, jitted: Any, closure: str):
        self.store, self.name, self.jitted, self.closure = store, name, jitted, closure
        self._executables: dict[tuple, Any] = {}

    def __call__(self, *args: Any) -> Any:
        leaves, treedef = _flatten(args)
        signature = (treedef, *(_leaf_signature(x) for x in leaves))
        compiled = self._executables.get(signature)
        if compiled is None:
            compiled = self.store.executable(self.name, self.jitted, self.closure, args)
            self._executables[signature] = compiled
        return compiled(*args)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        return self.jitted.lower(*args, **kwargs)


_store: Store | None = None
_HIT_EVENT = "/jax/compilation_cache/cache_hits"  # JAX's: a program read from its cache


class _Hits(threading.local):
    hits = 0  # in this thread: JAX fires its events in the thread that compiles


_local = _Hits()
_listening = False


def start(directory: pathlib.Path) -> Store:
    """Turns the store on for this process, in ``directory`` (made at the first write)."""
    global _store, _listening
    if not _listening:
        import jax

        def count(event: str, **_: Any) -> None:
            if event == _HIT_EVENT:
                _local.hits += 1

        jax.monitoring.register_event_listener(count)
        _listening = True
    if _store is not None:
        _store.close()
    _store = Store(pathlib.Path(directory))
    return _store


def stop() -> None:
    """Turns the store off, once its background reads have ended (:meth:`Store.close`)."""
    global _store
    if _store is not None:
        _store.close()
    _store = None


def active() -> Store | None:
    return _store


def prefetch(name: str, closure: str) -> int:
    """Reads the stored variants of ``name`` (closing over ``closure``) in the background
    (:meth:`Store.prefetch`); 0 while the store is off."""
    return 0 if _store is None else _store.prefetch(name, closure)


def stored(name: str, jitted: Any, closure: str) -> Any:
    """``jitted`` (a ``jax.jit`` function called with positional arguments only), its
    executables kept in the store under ``name`` and ``closure`` -- a description of
    everything the function closes over that its arguments do not carry (use
    :func:`describe`); ``jitted`` itself while the store is off."""
    return jitted if _store is None else _Stored(_store, name, jitted, closure)


# -- the key's parts ----------------------------------------------------------------------


def _sub_mesh(compiled: Any) -> list[list[int]]:
    """``[ids]`` of the devices a one-process program runs on when they are not all of
    them (a sub-mesh of one-process placement); else ``[]`` (deserialised for all)."""
    import jax

    devices = compiled.runtime_executable().local_devices()
    if jax.process_count() > 1 or len(devices) == len(jax.local_devices()):
        return []
    return [[d.id for d in devices]]


def _flatten(args: tuple) -> tuple[list, Any]:
    import jax

    return jax.tree.flatten(args)


def _leaf_signature(x: Any) -> tuple:
    if isinstance(x, np.ndarray):
        return (x.shape, x.dtype)
    sharding = getattr(x, "sharding", None)
    return (
        type(x),
        getattr(x, "shape", None),
        getattr(x, "dtype", None),
        getattr(x, "weak_type", None),
        sharding,
    )


def _describe_leaf(x: Any) -> str:
    return describe(_leaf_signature(x))


def _digest(parts: list[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _process_parts() -> list[str]:
    import gin
    import jax

    versions = []
    for dist in _DISTRIBUTIONS:
        try:
            versions.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{dist}=none")
    devices = [(d.platform, d.device_kind, d.id, d.process_index) for d in jax.devices()]
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES))
    config = sorted((k, describe(v)) for k, v in jax.config.values.items() if "cache" not in k)
    return [
        sys.version,
        *versions,
        describe(devices),
        describe(env),
        describe(config),
        gin.config_str(),
        *_code_stamps(),
    ]


def _code_stamps() -> list[str]:
    """(path, size, mtime) of each Python file of rlax and of its plugins' packages."""
    folders, files = _code_roots()
    paths = list(files)
    for root in sorted(folders):
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
            paths += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".py")]
    stamps = []
    for path in paths:
        st = os.stat(path)
        stamps.append(f"{path}:{st.st_size}:{st.st_mtime_ns}")
    return stamps


def _code_roots() -> tuple[set[str], set[str]]:
    """The folders of rlax's and its plugins' packages, and plugins that are one module:
    for each entry point of the ``rlax`` group, its top-level package (``rlax.plugins``
    and the like for rlax's own)."""
    import rlax.core

    folders, files = set(rlax.core.__path__), set()
    for ep in importlib.metadata.entry_points(group="rlax"):
        parts = ep.value.split(":")[0].split(".")
        spec = importlib.util.find_spec(".".join(parts[:2] if parts[0] == "rlax" else parts[:1]))
        if spec is None:
            continue
        if spec.submodule_search_locations:
            folders.update(spec.submodule_search_locations)
        elif spec.origin:
            files.add(spec.origin)
    return folders, files
