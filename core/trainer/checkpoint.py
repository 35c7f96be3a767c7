"""Saving and restoring the trainer's whole state with orbax, so a restart resumes exactly.

A checkpoint is one orbax step directory under ``DIR`` holding two items:

- ``state``: every array of the trainer's state — parameters, optimiser
  state, critic — as a flat dict ``leaf_00000 ... leaf_NNNNN`` in the order of
  ``jax.tree_util.tree_flatten`` of the live state (restored into the same
  structure, so optax's named tuples and flax's ``State`` need no special
  handling);
- ``meta``: JSON — the step, the weight version, the data position, the RNG
  seeds, what the curves need to continue — plus each leaf's name, shape,
  dtype and CRC32.

Saves are asynchronous (orbax's own async checkpointing: the train loop
blocks only while the arrays are handed over, orbax writes them on a thread)
and keep the last ``keep`` steps; orbax writes into a temporary directory and
renames it when complete, so a killed save never looks like a checkpoint. A
helper thread then reads the arrays back from disk, :data:`READ_GROUP_BYTES`
at a time (a whole read-back beside the step's own memory raised the trainer's
peak by the state's size), and writes their CRC32s (``crc32.json``): only a
checkpoint with its checksums counts as complete.
:meth:`Checkpointer.restore_latest` tries the newest first: one that cannot
be read, whose leaves do not match the live state, or whose arrays fail
their CRC32 is moved aside (``DIR/<step>.corrupt``, nothing deleted) with a
warning that says why, and the next older one is tried.

With several trainer processes (docs/mesh.md) every process calls
:meth:`Checkpointer.save`, :meth:`Checkpointer.restore_latest` and
:meth:`Checkpointer.close` at the same points, on a directory they share:
orbax writes each process's shards and process 0's metadata. Process 0 alone
reads a checkpoint back whole for the checksums and decides whether one
restores (its verdict goes to every process); each process then restores its
own shards, laid out as the live state. Moving a checkpoint aside is process
0's job too.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np

from rlax.core.constraints import AtLeast, check_fields
from rlax.core.errors import NothingToResume
from rlax.core.parallel import multihost
from rlax.core.wire import leaf_name

if TYPE_CHECKING:  # the settings are read where JAX is not started (the supervisor)
    import orbax.checkpoint as ocp

FORMAT = "rlax-train-state/1"
# A checkpoint is read back for its checksums in groups of leaves of about this many bytes
# (one leaf larger than it is read alone): the read-back's memory is a group, not the state.
READ_GROUP_BYTES = 128 << 20


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """When the trainer saves its whole state (``rlax.checkpointing`` in gin)::

        rlax.checkpointing.every = 100   # steps; 0: only on a preemption notice and at the end
        rlax.checkpointing.keep = 3      # how many of the newest are kept (>= 1)

    A crash redoes at most ``every`` steps; a preemption notice redoes none.
    """

    every: Annotated[int, AtLeast(0, means="0: never")] = 100
    keep: Annotated[int, AtLeast(1)] = 3

    def __post_init__(self) -> None:
        check_fields(self)


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint could not be restored and was skipped (the message says which and why)."""


@dataclasses.dataclass
class Restored:
    """A restored checkpoint: the state (same structure as the template) and its metadata."""

    step: int
    state: Any
    meta: dict[str, Any]
    path: pathlib.Path


def _describe(tree: Any) -> tuple[list[tuple[str, Any]], Any]:
    import jax

    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [(leaf_name(path), leaf) for path, leaf in leaves], treedef


def _key(i: int) -> str:
    return f"leaf_{i:05d}"


def _short(err: BaseException) -> str:
    """The first line of an error, without tensorstore's spec dump."""
    text = str(err).split(" [tensorstore_spec=")[0].splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:300]}"


def _check(
    path: pathlib.Path,
    meta: dict[str, Any],
    named: list[tuple[str, Any]],
    read: Callable[[], Iterable[dict[str, Any]]],
) -> None:
    """Raises ValueError unless the checkpoint at ``path`` is a complete save of ``named``.

    Its format and leaf names must match and ``crc32.json`` must exist before
    ``read`` (its arrays by leaf key, in one or more groups) is called; then
    every array's CRC32 must match.
    """
    if meta.get("format") != FORMAT:
        raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT!r}")
    if [n for n, _, _ in meta["leaves"]] != [n for n, _ in named]:
        raise ValueError("its leaves do not match the trainer's state (another model?)")
    sums_path = path / "crc32.json"
    if not sums_path.is_file():
        raise ValueError("no crc32.json: the save did not finish")
    sums = json.loads(sums_path.read_text())
    names = {_key(i): name for i, (name, _) in enumerate(named)}
    seen = 0
    for group in read():
        for key, array in group.items():
            if crc32(np.asarray(array)) != sums.get(key):
                raise ValueError(f"CRC32 mismatch in {names[key]!r}")
        seen += len(group)
    if seen != len(named):
        raise ValueError(f"read {seen} of its {len(named)} arrays")


def _groups(sizes: list[int], limit: int) -> list[list[int]]:
    """Leaf indices in order, cut into runs of at most ``limit`` bytes (a larger leaf alone)."""
    groups: list[list[int]] = [[]]
    total = 0
    for i, size in enumerate(sizes):
        if groups[-1] and total + size > limit:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += size
    return [g for g in groups if g]


def crc32(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).view(np.uint8).data) & 0xFFFFFFFF


class Checkpointer:
    """Every-N-steps asynchronous checkpoints of a pytree plus JSON metadata, last K kept.

    Args:
      directory: where the step directories go (created if missing).
      every: save when ``step % every == 0`` (:meth:`due`); 0: only when asked.
      keep: how many of the newest checkpoints to keep (>= 1).
      on_saved: called as ``on_saved(step, path)`` once a save is complete on
        disk (from :meth:`wait`, :meth:`save` or :meth:`close`, in the caller's thread).
    """

    def __init__(
        self,
        directory: str | pathlib.Path,
        *,
        every: int = 0,
        keep: int = 3,
        on_saved: Callable[[int, str], Any] | None = None,
    ):
        if every < 0 or keep < 1:
            raise ValueError(f"checkpoint: need every >= 0 and keep >= 1, got {every}, {keep}")
        self.directory = pathlib.Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.every, self.keep = every, keep
        self.on_saved = on_saved
        self._manager = self._open()
        self._pending: tuple[int, threading.Thread, list] | None = None
        self.last_blocking_s = 0.0

    def _open(self) -> ocp.CheckpointManager:
        import orbax.checkpoint as ocp

        return ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=self.keep,
                create=True,
                enable_async_checkpointing=True,
                cleanup_tmp_directories=True,
            ),
        )

    def due(self, step: int) -> bool:
        return bool(self.every) and step > 0 and step % self.every == 0

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    # -- saving ---------------------------------------------------------------

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> float:
        """Starts saving ``state`` and ``meta`` as ``step``; returns the seconds it blocked.

        Waits for the previous save first (at most one is in flight). The
        arrays may be donated or changed right after this returns.
        """
        import orbax.checkpoint as ocp

        start = time.perf_counter()
        self.wait()
        named, _ = _describe(state)
        flat = {_key(i): leaf for i, (_, leaf) in enumerate(named)}
        sizes = [int(np.prod(np.shape(x))) * np.dtype(x.dtype).itemsize for _, x in named]
        meta = dict(
            meta,
            format=FORMAT,
            step=step,
            saved_at=time.time(),
            leaves=[[n, list(np.shape(x)), str(np.dtype(x.dtype))] for n, x in named],
        )
        if step in self._manager.all_steps():  # a step redone after a crash: replace it
            self._set_aside(step, "redone")
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(flat), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )
        errors: list[BaseException] = []
        thread = threading.Thread(
            target=self._finish,
            args=(step, sizes, errors),
            name=f"rlax-checkpoint-{step}",
            daemon=True,
        )
        thread.start()
        self._pending = (step, thread, errors)
        self.last_blocking_s = time.perf_counter() - start
        return self.last_blocking_s

    def poll(self) -> bool:
        """Completes the save in flight if it is done (without blocking); True if none is left."""
        if self._pending is not None and not self._pending[1].is_alive():
            self.wait()
        return self._pending is None

    def wait(self) -> None:
        """Blocks until the save in flight (if any) is complete on disk; re-raises its error."""
        if self._pending is None:
            return
        (step, thread, errors), self._pending = self._pending, None
        thread.join()
        if errors:
            raise RuntimeError(f"checkpoint {self.directory / str(step)}: save failed") from errors[
                0
            ]
        if self.on_saved is not None:
            self.on_saved(step, str(self.directory / str(step)))

    def _finish(self, step: int, sizes: list[int], errors: list) -> None:
        try:
            self._manager.wait_until_finished()
            if multihost.is_lead():
                self._write_checksums(step, sizes)
        except BaseException as err:  # noqa: BLE001 -- handed to wait() in the caller's thread
            errors.append(err)

    def _write_checksums(self, step: int, sizes: list[int]) -> None:
        """Adds each leaf's CRC32 beside the checkpoint (read back from disk, after orbax)."""
        path = self.directory / str(step)
        sums: dict[str, int] = {}
        for group in self._read_alone(step, sizes):
            sums.update((k, crc32(a)) for k, a in group.items())
        tmp = path / "crc32.json.tmp"
        tmp.write_text(json.dumps(sums))
        tmp.replace(path / "crc32.json")

    def close(self) -> None:
        self.wait()
        self._manager.close()

    # -- restoring -------------------------------------------------------------

    def restore_latest(self, template: Any, *, start_over: bool = True) -> Restored | None:
        """The newest checkpoint that restores cleanly into ``template``'s structure, or None.

        Checkpoints newer than the one restored that fail are moved aside with a
        :class:`CorruptCheckpointWarning`. When none restores, ``start_over`` moves
        them all aside (None: training starts over); otherwise nothing is moved and
        :class:`~rlax.core.errors.NothingToResume` is raised.
        """
        self.wait()
        failed: list[tuple[int, str]] = []
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                restored = self._restore(step, template)
            except Exception as err:  # noqa: BLE001 -- orbax/tensorstore raise many types
                failed.append((step, _short(err)))
                continue
            self._set_aside_failed(failed)
            return restored
        if failed and not start_over:
            raise NothingToResume(self.directory, *failed[0])
        self._set_aside_failed(failed)
        return None

    def _set_aside_failed(self, failed: list[tuple[int, str]]) -> None:
        for step, why in failed:
            aside = self._set_aside(step, "corrupt")
            # One report: the CLI shows rlax's warnings as one 'rlax: warning:' line.
            message = f"checkpoint {self.directory / str(step)} cannot be restored ({why}); "
            warnings.warn(f"{message}moved to {aside} and skipped", CorruptCheckpointWarning, 3)

    def _read_alone(self, step: int, sizes: list[int]) -> Iterator[dict[str, np.ndarray]]:
        """``step``'s arrays, whole, as numpy, read by this process alone (no barrier).

        Yields them by leaf key in groups of about :data:`READ_GROUP_BYTES`
        (``sizes``: each leaf's bytes), so that no more than a group is held.
        """
        import jax
        import orbax.checkpoint as ocp

        alone = ocp.options.MultiprocessingOptions(
            primary_host=None, active_processes={jax.process_index()}
        )
        handler = ocp.PyTreeCheckpointHandler(multiprocessing_options=alone)
        with ocp.Checkpointer(handler, multiprocessing_options=alone) as reader:
            for group in _groups(sizes, READ_GROUP_BYTES):
                keys = [_key(i) for i in group]
                args = ocp.args.PyTreeRestore(
                    item=dict.fromkeys(keys, 0),
                    restore_args={k: ocp.RestoreArgs(restore_type=np.ndarray) for k in keys},
                    partial_restore=True,
                )
                yield reader.restore(self.directory / str(step) / "state", args=args)

    def _verify(self, step: int, named: list[tuple[str, Any]]) -> dict[str, Any]:
        """``step``'s metadata, once its format, leaves and CRC32s check out (process 0)."""
        import jax
        import orbax.checkpoint as ocp

        path = self.directory / str(step)
        alone = ocp.options.MultiprocessingOptions(
            primary_host=None, active_processes={jax.process_index()}
        )
        meta = ocp.JsonCheckpointHandler(multiprocessing_options=alone).restore(path / "meta")
        sizes = [int(np.prod(np.shape(x))) * np.dtype(x.dtype).itemsize for _, x in named]
        _check(path, meta, named, lambda: self._read_alone(step, sizes))
        return meta

    def _restore(self, step: int, template: Any) -> Restored:
        import jax
        import orbax.checkpoint as ocp

        if jax.process_count() > 1:
            return self._restore_shards(step, template)
        path = self.directory / str(step)
        named, treedef = _describe(template)
        abstract = {
            _key(i): jax.ShapeDtypeStruct(np.shape(x), x.dtype) for i, (_, x) in enumerate(named)
        }
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
            ),
        )
        meta, flat = restored["meta"], restored["state"]
        _check(path, meta, named, lambda: [flat])
        state = jax.tree_util.tree_unflatten(treedef, [flat[_key(i)] for i in range(len(named))])
        return Restored(step=step, state=state, meta=meta, path=path)

    def _restore_shards(self, step: int, template: Any) -> Restored:
        """Several processes: process 0 checks the checkpoint, then each restores its shards."""
        import jax
        import orbax.checkpoint as ocp

        named, treedef = _describe(template)
        meta = multihost.run_on_lead(lambda: self._verify(step, named))
        abstract = {
            _key(i): jax.ShapeDtypeStruct(
                np.shape(x), x.dtype, sharding=getattr(x, "sharding", None)
            )
            for i, (_, x) in enumerate(named)
        }
        flat = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
        )["state"]
        state = jax.tree_util.tree_unflatten(treedef, [flat[_key(i)] for i in range(len(named))])
        return Restored(step=step, state=state, meta=meta, path=self.directory / str(step))

    def _set_aside(self, step: int, why: str) -> pathlib.Path:
        src = self.directory / str(step)
        # Process 0 picks the name and moves it (the directory is shared); the others wait.
        dst = multihost.run_on_lead(
            lambda: self.directory / f"{step}.{why}-{int(time.time() * 1000)}"
        )
        if multihost.is_lead() and src.exists():
            shutil.move(src, dst)
        multihost.barrier(f"rlax-checkpoint-aside-{step}")
        # orbax caches the steps it has seen: reopen so it forgets the moved one.
        self._manager.close()
        self._manager = self._open()
        return dst
