"""The parameter server's newest weights on disk (orbax), served again after a restart.

:class:`WeightPersister` runs beside the server in its process and talks to
it like any client, over loopback: a thread waits for each new committed
version, pulls it and saves the wire buffer with orbax (``DIR/<version>``, the
buffer as one uint8 array plus the tensor list as JSON; the newest two are
kept). Versions that arrive while a save runs are skipped: only the newest
matters. On start, :meth:`WeightPersister.restore` pushes the newest saved
version back into the freshly started server, so workers that start or reload
before the trainer's next push get the weights the server last served. A saved
version that cannot be read is skipped with a warning naming it.

Given the server's own :class:`~rlax.core.param_server.weights.WeightStore`
(``store``, as the parameter-server role does), it saves the served buffer
in place, held for reading while the save runs, instead of pulling a second
copy over loopback: the server then holds one copy of the served weights,
not three.
"""

from __future__ import annotations

import json
import logging
import pathlib
import threading
import warnings
from typing import Any

import grpc
import numpy as np
import orbax.checkpoint as ocp

from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.settings import ServerSettings
from rlax.core.param_server.wire import WIRE_DTYPES, TensorSpec, WirePlan

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
    """Saves each newest served version with orbax; pushes the newest saved one back on start.

    Args:
      directory: where the versions go.
      settings: the server's settings (address with the bound port, token).
      keep: how many saved versions to keep.
      store: the server's weight store, read in place (None: pull over the client).
    """

    def __init__(self, directory: str | pathlib.Path, settings: ServerSettings, *, keep: int = 2,
                 store: Any = None):  # fmt: skip
        self.directory = pathlib.Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.client = ParamServerClient(settings, retry_s=10.0)
        self.store = store
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                                 enable_async_checkpointing=False),
        )  # fmt: skip
        self.saved = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def restore(self) -> int:
        """Pushes the newest readable saved version into the server; returns it (-1: none)."""
        for version in sorted(self._manager.all_steps(), reverse=True):
            try:
                got = self._manager.restore(
                    version,
                    args=ocp.args.Composite(
                        buffer=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()
                    ),
                )
                buffer = np.asarray(got["buffer"]["buffer"], np.uint8)
                plan = _plan(got["meta"]["tensors"], buffer.nbytes)
            except Exception as err:  # noqa: BLE001 -- orbax raises many types
                message = (
                    f"saved weights {self.directory / str(version)} unreadable ({err}); skipped"
                )
                log.warning(message)
                warnings.warn(message, stacklevel=2)
                continue
            try:
                self.client.push(plan, buffer, version)
            except grpc.RpcError as err:  # the trainer pushed something newer first: fine
                log.info("saved weights v%d not re-served: %s", version, err.details())
                return -1
            self.saved = version
            log.info("weights v%d restored from %s", version, self.directory)
            return version
        return -1

    def start(self) -> WeightPersister:
        self._thread = threading.Thread(target=self._run, name="rlax-weight-persist", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30.0)
        self._manager.close()
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
            return self._save(version, tensors, np.frombuffer(buffer, np.uint8).copy())
        served = self.store.open_pull(self.saved)  # held: not recycled while it is written
        if served is None:
            return self.saved
        try:
            tensors = [
                {"name": t.name, "shape": list(t.shape), "offset": t.offset, "nbytes": t.nbytes,
                 "dtype": t.dtype}
                for t in served.header.tensors
            ]  # fmt: skip
            return self._save(served.number, tensors, np.frombuffer(served.buffer, np.uint8))
        finally:
            self.store.close_pull(served)

    def _save(self, version: int, tensors: list[dict], array: np.ndarray) -> int:
        self._manager.save(
            version,
            args=ocp.args.Composite(
                buffer=ocp.args.StandardSave({"buffer": array}),
                meta=ocp.args.JsonSave(
                    {"version": version, "tensors": json.loads(json.dumps(tensors))}
                ),
            ),
        )
        self._manager.wait_until_finished()
        self.saved = version
        return version
