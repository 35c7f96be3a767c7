"""The parameter server's newest weights on disk, served again after a restart.

:class:`WeightPersister` runs beside the server in its process: a thread
waits for each new committed version and writes the served buffer as it is
(``DIR/<version>/buffer/buffer.bin``, with the tensor list, size and xxh3_64
in ``DIR/<version>/meta/metadata``, JSON), into a temporary directory renamed
into place once complete; the newest ``keep`` are kept. Versions that arrive
while a save runs are skipped: only the newest matters. On start,
:meth:`WeightPersister.restore` pushes the newest saved version back into the
freshly started server, so workers that start or reload before the trainer's
next push get the weights the server last served. A saved version that cannot
be read, or whose bytes do not match their checksum, is skipped with a
warning naming it; a version saved by an older rlax (orbax) is still read.

Given the server's own :class:`~rlax.core.param_server.weights.store.WeightStore`
(``store``, as the parameter-server role does), it writes the served buffer
in place, held for reading while the write runs, then has the store serve
that version from the saved file (its memory buffer goes back to the pool
for the next push); a version the store received into its spool (the role
spools into ``DIR/.spool``) is saved as a hard link of that file. A restore
serves the saved file directly, its checksum read chunk by chunk. The
process holds at most one version's buffer, none with the spool
(docs/param_server.md § Memory and disk). Without a store it pulls the
version over loopback like any client and restores by pushing. Either way
the buffer goes to the file with one ``write`` of the buffer itself: no copy
(orbax made one of the whole buffer, the size of the model, on every save).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import threading
import uuid
import warnings
from typing import Any

import grpc
import numpy as np
import xxhash

from rlax.core.param_server import codec
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.settings import ServerSettings
from rlax.core.param_server.transport.transfer import checksum
from rlax.core.param_server.weights.parts import PushRejected
from rlax.core.rollout.probe import Probe
from rlax.core.wire import WIRE_DTYPES, TensorSpec, WirePlan

log = logging.getLogger("rlax.param_server")


def _plan(tensors: list[dict], nbytes: int) -> WirePlan:
    wire = {t["dtype"] for t in tensors}
    if len(wire) != 1 or next(iter(wire)) not in WIRE_DTYPES:
        raise ValueError(f"saved weights: unexpected wire dtypes {sorted(wire)}")
    dtype = WIRE_DTYPES[next(iter(wire))]
    specs = tuple(
        TensorSpec(t["name"], tuple(t["shape"]), dtype, int(t["offset"]), int(t["nbytes"]))
        for t in tensors
    )
    return WirePlan(None, specs, dtype, nbytes)


class WeightPersister:
    """Saves each newest served version; pushes the newest saved one back on start.

    Args:
      directory: where the versions go.
      settings: the server's settings (address with the bound port, token).
      keep: how many saved versions to keep.
      store: the server's weight store, read in place (None: pull over the client).
    """

    def __init__(
        self,
        directory: str | pathlib.Path,
        settings: ServerSettings,
        *,
        keep: int = 2,
        store: Any = None,
    ):
        self.directory = pathlib.Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.client = ParamServerClient(settings, retry_s=10.0)
        self.store = store
        self.keep = max(1, keep)
        self.saved = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _versions(self) -> list[int]:
        return sorted(
            (int(d.name) for d in self.directory.iterdir() if d.is_dir() and d.name.isdigit()),
            reverse=True,
        )

    def restore(self) -> int:
        """Pushes the newest readable saved version into the server; returns it (-1: none)."""
        for version in self._versions():
            try:
                if self.store is not None and self._file(version).exists():
                    return self._restore_in_place(version)
                buffer, tensors = _read(self.directory / str(version))
                plan = _plan(tensors, buffer.nbytes)
                probe = _probe_at(self.directory / str(version))
            except PushRejected as err:  # the trainer pushed something newer first: fine
                log.info("saved weights v%d not re-served: %s", version, err)
                return -1
            except Exception as err:  # noqa: BLE001 -- a damaged save, whatever the error
                message = (
                    f"saved weights {self.directory / str(version)} unreadable ({err}); skipped"
                )
                log.warning(message)
                warnings.warn(message, stacklevel=2)
                continue
            try:
                self.client.push(plan, buffer, version, probe)
            except grpc.RpcError as err:  # the trainer pushed something newer first: fine
                log.info("saved weights v%d not re-served: %s", version, err.details())
                return -1
            self.saved = version
            log.info("weights v%d restored from %s", version, self.directory)
            return version
        return -1

    def _restore_in_place(self, version: int) -> int:
        """Serves a saved version from its file; its bytes are checked, never held in memory."""
        meta = json.loads((self.directory / str(version) / "meta" / "metadata").read_text())
        tensors = meta["tensors"]
        _plan(tensors, meta["nbytes"])  # raises on unexpected dtypes
        segments, whole = _segments(self._file(version), self.store.chunk_bytes)
        if whole != (meta["nbytes"], meta["xxh3_64"]):
            raise ValueError(
                f"{self._file(version)}: {whole[0]} bytes that do not match their checksum"
            )
        header = pb.PartHeader(version=version, part=0, num_parts=1, nbytes=meta["nbytes"])
        for i, t in enumerate(tensors):
            header.tensors.add(
                name=t["name"],
                dtype=t["dtype"],
                shape=t["shape"],
                offset=t["offset"],
                nbytes=t["nbytes"],
                index=i,
            )
        codec.set_probe(header, _saved_probe(meta))
        self.store.restore_file(header, self._file(version), segments)
        self.saved = version
        log.info("weights v%d restored from %s (served from the file)", version, self.directory)
        return version

    def start(self) -> WeightPersister:
        self._thread = threading.Thread(target=self._run, name="rlax-weight-persist", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30.0)
        self.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                latest = self.client.wait_for_version(self.saved, 1.0)
                if latest > self.saved:
                    self.save_newest()
            except Exception as err:  # noqa: BLE001 -- keep serving; say why saving failed
                log.warning("saving the served weights failed: %s", err)
                self._stop.wait(1.0)

    def save_newest(self) -> int:
        """Saves the newest served version (if newer than the last saved)."""
        if self.store is None:
            pulled = self.client.pull(self.saved)
            if pulled is None:
                return self.saved
            version, tensors, buffer = pulled
            self._save(version, tensors, np.frombuffer(buffer, np.uint8))
            self._prune()
            return version
        served = self.store.open_pull(self.saved)  # held: not recycled while it is written
        if served is None:
            return self.saved
        try:
            tensors = codec.tensor_list(served.header)  # and the version's probe
            if served.buffer is not None:
                self._save(served.number, tensors, np.frombuffer(served.buffer, np.uint8))
            elif served.path is not None:  # received into the spool: the file is linked
                self._save(served.number, tensors, None, linked=(served.fd, served.path))
                self._prune()
                return served.number
            else:  # served from a saved file already
                return self.saved
        finally:
            self.store.close_pull(served)
        # From now on the version is read from its file; its buffer returns to the pool.
        self.store.serve_from_file(served.number, self._file(served.number))
        self._prune()  # after the swap: deleting a large file takes a while
        return served.number

    def _file(self, version: int) -> pathlib.Path:
        return self.directory / str(version) / "buffer" / "buffer.bin"

    def _save(
        self,
        version: int,
        tensors: list[dict],
        array: np.ndarray | None,
        *,
        linked: tuple[int | None, str] | None = None,
    ) -> int:
        """Writes ``array`` (no copy) — or links the file ``linked`` (fd, path), which
        holds the bytes already — and its metadata, renamed into place when complete."""
        tmp = self.directory / f".tmp-{version}-{uuid.uuid4().hex[:8]}"
        (tmp / "buffer").mkdir(parents=True)
        (tmp / "meta").mkdir()
        raw = tmp / "buffer" / "buffer.bin"
        if array is not None:
            with open(raw, "wb") as f:
                f.write(array.data)
                f.flush()
                os.fsync(f.fileno())
            nbytes, digest = array.nbytes, checksum(array.data)
        else:
            assert linked is not None and linked[0] is not None
            os.fsync(linked[0])
            os.link(linked[1], raw)  # same file system: the spool is inside the directory
            _, (nbytes, digest) = _segments(raw, 8 << 20)
        meta = {
            "version": version,
            "tensors": json.loads(json.dumps(tensors)),
            "nbytes": nbytes,
            "xxh3_64": digest,
        }
        probe = getattr(tensors, "probe", None)  # the weight-load check's, served again
        if probe is not None:
            meta["probe"] = {"tokens": list(probe.tokens), "logprobs": list(probe.logprobs)}
        (tmp / "meta" / "metadata").write_text(json.dumps(meta))
        final = self.directory / str(version)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        self.saved = version
        return version

    def _prune(self) -> None:
        """Deletes all but the newest ``keep`` saved versions (only once the newer is complete)."""
        for old in self._versions()[self.keep :]:
            shutil.rmtree(self.directory / str(old), ignore_errors=True)


def _segments(path: pathlib.Path, chunk_bytes: int) -> tuple[list, tuple[int, int]]:
    """((offset, length, xxh3_64) per ``chunk_bytes`` of a file, (size, xxh3_64 of it all)),
    read through one reused chunk-sized buffer."""
    whole, segments, offset = xxhash.xxh3_64(), [], 0
    scratch = bytearray(chunk_bytes)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(scratch):
            view = memoryview(scratch)[:n]
            whole.update(view)
            segments.append((offset, n, checksum(view)))
            offset += n
    return segments, (offset, whole.intdigest())


def _saved_probe(meta: dict) -> Probe | None:
    """The probe a saved version's metadata holds (None: saved without one)."""
    probe = meta.get("probe")
    return Probe(tuple(probe["tokens"]), tuple(probe["logprobs"])) if probe else None


def _probe_at(path: pathlib.Path) -> Probe | None:
    """The probe saved with the version at ``path`` (None: none, or an orbax save)."""
    metadata = path / "meta" / "metadata"
    return _saved_probe(json.loads(metadata.read_text())) if metadata.is_file() else None


def _read(path: pathlib.Path) -> tuple[np.ndarray, list[dict]]:
    """(buffer, tensor list) of one saved version; raises if it is damaged."""
    meta = json.loads((path / "meta" / "metadata").read_text())
    raw = path / "buffer" / "buffer.bin"
    if not raw.exists():  # saved by an older rlax, with orbax
        return _read_orbax(path)
    buffer = np.fromfile(raw, np.uint8)
    if buffer.nbytes != meta["nbytes"] or checksum(buffer.data) != meta["xxh3_64"]:
        raise ValueError(f"{raw}: {buffer.nbytes} bytes that do not match their checksum")
    return buffer, meta["tensors"]


def _read_orbax(path: pathlib.Path) -> tuple[np.ndarray, list[dict]]:
    import orbax.checkpoint as ocp  # only for versions saved before the raw format

    with ocp.CheckpointManager(path.parent) as manager:
        got = manager.restore(
            int(path.name),
            args=ocp.args.Composite(buffer=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()),
        )
    return np.asarray(got["buffer"]["buffer"], np.uint8), got["meta"]["tensors"]
