"""The parameter-server role (``--role param_server``): serves weights and the rollout queue.

The server keeps its state in ``state_dir`` (the run directory's
``param_server/`` under ``rlax run``): the rollout queue in SQLite and the
newest weights with orbax, so a restarted server loses nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rlax.core.errors import ConfigError
from rlax.core.models.tokenizer import load_tokenizer
from rlax.core.param_server.queue.store import QueueDB, QueueDBError
from rlax.core.param_server.server import ParamServer
from rlax.core.param_server.settings import ADDRESS_ENV, ServerSettings
from rlax.core.param_server.weights.persist import WeightPersister
from rlax.core.rollout.groups import task_prompts
from rlax.core.runtime.jax_free import record_jax_free
from rlax.core.runtime.preemption import Preemption
from rlax.core.runtime.run_dir import RunDir
from rlax.core.types import ConfigPath, Prompt

if TYPE_CHECKING:  # the spec sits above the roles; a role reads the value it is handed
    from rlax.core.spec import RunSpec

SPOOL = ".spool"  # in RUN/param_server/weights: the files pushes are received into

log = logging.getLogger("rlax.roles")


def param_server(
    spec: RunSpec, *, hook: Any = None, run_dir: RunDir | pathlib.Path | None = None
) -> int:
    """Serves weights and the rollout queue until a notice (SIGTERM/SIGINT by default).

    The queue holds the run's task's training prompts (``spec.task``, in the order
    ``spec.seed`` makes) and takes ``spec.queue_capacity`` prompts at once; the server
    listens as ``spec.server`` says; its own settings are ``spec.param_server``
    (:class:`rlax.core.param_server.spec.ParamServerSpec`): lease time, curricula and what
    is kept in ``state_dir`` (default: ``RUN/param_server`` when given a run directory;
    neither: nothing is kept) -- ``queue.sqlite`` and ``weights/``, where the newest
    ``saved_weights`` served versions are kept (an older one is deleted only once the
    newer is complete on disk; 0: none, the trainer publishes again after a restart,
    docs/preemption.md).

    Raises:
      Preempted: after a notice, once the server has stopped (exit status 75).
    """
    own = spec.param_server
    _check_listen(spec.server)
    prompts = _train_prompts(spec.task, spec.init_checkpoint, spec.seed)
    state_dir = own.state_dir
    if state_dir is None and run_dir is not None:
        state_dir = str(RunDir.of(run_dir).param_server)
    db = _queue_db(state_dir)
    stop = Preemption(own.preemption_notices, role="param_server", hook=hook).start()
    try:
        server = ParamServer(
            spec.server,
            prompts,
            capacity=spec.queue_capacity,
            lease_ttl_s=own.lease_ttl_s,
            curricula=own.curricula,
            queue_db=db,
        )
    except QueueDBError as err:  # the saved queue does not fit this task (a different seed?)
        stop.close()
        raise ConfigError(f"rlax.param_server.state_dir: {err}") from err
    try:
        _serve(stop, server, state_dir, own.saved_weights)
    finally:  # checked as it stops, whatever it served: the server never needs JAX
        record_jax_free(run_dir, "param_server")
    stop.stop_now()
    return 0


def _serve(
    stop: Preemption, server: ParamServer, state_dir: str | None, saved_weights: int
) -> None:
    """Starts the server (and its lanes' server halves) and the weights kept in ``state_dir``;
    serves until a notice, then stops them all (:func:`_serve_until`)."""
    port = server.start()
    _serve_until(stop, server, _keep_weights(server, port, state_dir, saved_weights))


def _train_prompts(task: Any, init_checkpoint: ConfigPath, seed: int) -> Iterator[Prompt]:
    """The task's training prompts, tokenised with the checkpoint's tokenizer."""
    try:
        tokenizer = load_tokenizer(init_checkpoint)
    except (OSError, ValueError) as err:
        raise ConfigError(f"rlax.run.init_checkpoint: {err}") from err
    return task_prompts(task, "train", tokenizer=tokenizer, seed=seed, setting="rlax.run.task")


def _serve_until(stop: Preemption, server: ParamServer, persister: WeightPersister | None) -> None:
    """Serves until a notice; then stops the persister, the server, the queue, the notices.

    Without a persister the spool's files are no saves: nothing in them is needed to resume.
    """
    try:
        while not stop.wait(0.5):
            pass
    finally:
        if persister is not None:
            persister.stop()
        server.stop(grace=1.0)
        server.queue.close()
        stop.close()
        if persister is None and server.weights.spool is not None:
            _clear_spool(pathlib.Path(server.weights.spool))


def _queue_db(state_dir: str | None) -> QueueDB | None:
    """The rollout queue's database in ``state_dir`` (None: the queue is not kept)."""
    try:
        return QueueDB(pathlib.Path(state_dir) / "queue.sqlite") if state_dir else None
    except QueueDBError as err:
        raise ConfigError(f"rlax.param_server.state_dir: {err}") from err


def _keep_weights(
    server: ParamServer, port: int, state_dir: str | None, saved_weights: int
) -> WeightPersister | None:
    """The persister of ``saved_weights`` versions, or (0) just the spool; None without one."""
    if state_dir and saved_weights > 0:
        return _start_persister(server, port, state_dir, saved_weights)
    if state_dir and server.holds_whole_versions:
        server.weights.spool_to(pathlib.Path(state_dir) / "weights" / SPOOL)
    return None


def _clear_spool(directory: pathlib.Path) -> None:
    """Deletes the files pushes were received into (an open one stays readable)."""
    for path in directory.glob("*.bin"):
        path.unlink(missing_ok=True)


def _start_persister(
    server: ParamServer, port: int, state_dir: str, keep: int = 1
) -> WeightPersister:
    """Restores the weights saved in ``state_dir/weights`` and keeps saving each new version.

    The persister talks to this server on the port it actually bound (the
    configured one may be 0, "any free port").
    """
    host = server.settings.address.rsplit(":", 1)[0]
    local = dataclasses.replace(server.settings, address=f"{host}:{port}")
    # The served buffer is saved in place; a sharded store is read whole through the client.
    store = server.weights if server.holds_whole_versions else None
    persister = WeightPersister(pathlib.Path(state_dir) / "weights", local, keep=keep, store=store)
    if store is not None:  # pushes land in files beside the saves, never in this process
        store.spool_to(persister.directory / SPOOL)
    persister.restore()
    persister.start()
    return persister


def _check_listen(settings: ServerSettings) -> None:
    """ConfigError unless the server has a token and its address can be bound (before any
    work)."""
    try:
        resolved = settings.resolved()
    except ValueError as err:
        raise ConfigError(f"--role param_server: {err}") from err
    host, _, port = resolved.address.rpartition(":")
    try:
        with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET) as s:
            # As gRPC binds: a restarted server's port in TIME_WAIT is free, a listener is not.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host.strip("[]"), int(port)))
    except ValueError:
        raise ConfigError(
            f"rlax.ps_settings.address: {resolved.address!r} is not host:port"
        ) from None
    except OSError as err:
        raise ConfigError(
            f"rlax.ps_settings.address: cannot listen on {resolved.address} ({err.strerror}); "
            f"{ADDRESS_ENV} overrides the address"
        ) from None
