"""The parameter-server role and the local cluster that runs every role on one machine.

``rlax run --gin F`` (role ``all``) is :func:`local_cluster`: it starts the
parameter server, then the trainer and ``num_workers`` workers as child
processes of this one — each is ``rlax run`` with the same gin files and
bindings and its own ``--role`` — and supervises them. The server's address
and a fresh token reach the children through the environment. A child that
dies is reported by name, pid and status, and the run fails; when the trainer
finishes, the workers and the server are stopped and the trainer's status is
the run's.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from rlax.core.errors import ConfigError
from rlax.core.models.tokenizer import load_tokenizer
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.server import ParamServer
from rlax.core.param_server.settings import ADDRESS_ENV, TOKEN_ENV, ServerSettings
from rlax.core.worker import WORKER_ID_ENV

log = logging.getLogger("rlax.roles")


def param_server(
    *,
    hook: Any = None,
    task: Any,
    init_checkpoint: str,
    settings: ServerSettings,
    prompts_per_step: int,
    max_staleness: int = 0,
    reload_staleness: int = 0,
    capacity: int | None = None,
    lease_ttl_s: float = 120.0,
    curricula: Sequence[Any] = (),
    seed: int = 0,
) -> int:
    """Serves weights and the rollout queue until SIGTERM/SIGINT; returns the exit code.

    ``capacity`` (prompts leased, queued or being trained on) defaults to
    ``prompts_per_step * max(1, max_staleness + 1 - reload_staleness)``: one
    batch in synchronous mode, and otherwise as many batches ahead as the
    staleness rule can accept — a group generated with weights up to
    ``reload_staleness`` versions old waits behind at most that many batches,
    so deeper queues would only produce groups the trainer must drop.
    ``curricula`` (e.g. ``@curation.pass_rate_curriculum()``) see every
    submitted group and keep retired prompts from being leased again.
    """
    try:
        tokenizer = load_tokenizer(init_checkpoint)
    except (OSError, ValueError) as err:
        raise ConfigError(f"rlax.param_server.init_checkpoint: {err}") from err
    prompts = task.prompts("train", tokenizer=tokenizer, seed=seed)
    server = ParamServer(
        settings, prompts,
        capacity=capacity or prompts_per_step * max(1, max_staleness + 1 - reload_staleness),
        lease_ttl_s=lease_ttl_s, curricula=curricula,
    )  # fmt: skip
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    server.start()
    while not stopping:
        time.sleep(0.2)
    server.stop(grace=1.0)
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


try:  # resolved here, in the parent: the child between fork and exec only calls it
    _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the supervisor dies (PR_SET_PDEATHSIG)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)


class _Child:
    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], cores: Sequence[int] | None
    ):
        self.name = name
        self.proc = subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent)  # noqa: PLW1509 -- no locks taken in it
        if cores:
            os.sched_setaffinity(self.proc.pid, set(cores))

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _wait_ready(settings: ServerSettings, server: _Child, timeout_s: float = 120.0) -> None:
    client = ParamServerClient(settings, retry_s=0.0)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if server.proc.poll() is not None:
                raise RuntimeError(
                    f"parameter server exited with status {server.proc.returncode} at start"
                )
            try:
                client.stat()
                return
            except Exception:  # noqa: BLE001 -- not listening yet
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"parameter server not reachable after {timeout_s:.0f}s"
                    ) from None
                time.sleep(0.2)
    finally:
        client.close()


def local_cluster(
    *,
    argv: Sequence[str],
    settings: ServerSettings,
    num_workers: int = 2,
    trainer_cores: Sequence[int] | None = None,
    worker_cores: Sequence[int] | None = None,
) -> int:
    """Runs parameter server, trainer and workers as supervised child processes.

    Args:
      argv: the ``rlax run`` arguments without ``--role``; each child gets them
        plus its role.
      settings: where the server listens; the port is replaced by a free one
        unless RLAX_PS_ADDRESS is set.
      num_workers: worker processes to start.
      trainer_cores / worker_cores: pin the trainer / the workers to these CPU
        cores (as if they were separate machines); None leaves them free.
    """
    if num_workers < 1:
        raise ConfigError(f"rlax.local_cluster.num_workers must be >= 1, got {num_workers}")
    env = dict(os.environ)
    env.setdefault(ADDRESS_ENV, f"127.0.0.1:{_free_port()}")
    env.setdefault(TOKEN_ENV, secrets.token_hex(16))
    base = [sys.executable, "-m", "rlax.core.cli", "run", *argv]
    server = _Child("param_server", [*base, "--role", "param_server"], env, None)
    children = [server]
    try:
        _wait_ready(
            dataclasses.replace(settings, address=env[ADDRESS_ENV], token=env[TOKEN_ENV]), server
        )
        trainer = _Child("trainer", [*base, "--role", "trainer"], env, trainer_cores)
        children.append(trainer)
        for i in range(num_workers):
            worker_env = dict(env, **{WORKER_ID_ENV: f"worker-{i}"})
            children.append(
                _Child(f"worker-{i}", [*base, "--role", "worker"], worker_env, worker_cores)
            )
        return _supervise(trainer, children)
    finally:
        for child in reversed(children):
            child.stop()


def _supervise(trainer: _Child, children: list[_Child]) -> int:
    while True:
        status = trainer.proc.poll()
        if status is not None:
            if status:
                print(
                    f"rlax: trainer (pid {trainer.proc.pid}) exited with status {status}",
                    file=sys.stderr,
                )
            return status
        for child in children:
            code = child.proc.poll()
            if child is not trainer and code is not None:
                print(f"rlax: {child.name} (pid {child.proc.pid}) died with status {code}; stopping the run",
                      file=sys.stderr)  # fmt: skip
                return 1
        time.sleep(0.2)
