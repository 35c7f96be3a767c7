"""One process, two meshes: the sampler hosted in the trainer's process.

With ``rlax.placement.mode`` ``"one_process"`` (or ``"colocated"``) the supervisor starts
the parameter server and one trainer process that sees every device of both roles, and
no worker processes (:mod:`rlax.core.parallel.placement`). This module is what that
trainer process does about it:

- :func:`in_process_placement` says which of the process's devices are the trainer's
  and which the sampler's: the supervisor's word (:mod:`rlax.core.parallel.in_process_env`)
  when it gave one, else -- only for an explicit ``mode`` of ``"one_process"`` or
  ``"colocated"`` -- ``place_roles`` over the devices this process sees (``--role
  trainer`` started alone). On a CPU-only host an explicit in-process mode divides XLA's
  host devices (``--xla_force_host_platform_device_count``) as it would accelerators.
- :class:`SamplerHost` runs in-process workers: threads running the worker role's own
  loop (:class:`~rlax.core.worker.role.Worker`), each with its own copy of the run's
  sampler on the sampler's devices. They lease, generate, submit and reload through the
  parameter server exactly as worker processes do, so versions, both staleness knobs,
  leases, in-flight reloads and partial work keep their meaning: the server still owns
  the queue and the versions. Only their weights come differently: device to device
  from the trainer (:class:`~rlax.core.trainer.handoff.DeviceHandoff`) whenever they hold
  the server's newest version.
- ``"colocated"``: the trainer and the sampler share every device and take turns
  (:mod:`rlax.core.trainer.turns`): the workers sample while the trainer waits for
  rollouts, and the trainer trains while no worker samples.

A preemption of the trainer process (SIGTERM) stops its workers at the next decode
chunk (a Resumable sampler hands its rows in as partial work) and the trainer
checkpoints as always; a SIGKILL loses the workers' leases, which expire and are served
again. Nothing of the queue lives in this process, so a resume restores as it does
with worker processes.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
from flax import nnx

from rlax.core.errors import ConfigError
from rlax.core.models.bundle import abstract_model
from rlax.core.parallel.in_process_env import IN_PROCESS_MODES, InProcessRoles, read_role_devices
from rlax.core.parallel.inventory import Inventory, detect_inventory
from rlax.core.parallel.placement import Placement, place_roles
from rlax.core.param_server.client import ParamServerClient
from rlax.core.runtime.preemption import Preemption
from rlax.core.trainer.handoff import DeviceHandoff, OfferingSource, sampler_placement
from rlax.core.trainer.turns import (
    ColocatedSource,
    IdleOptimizerState,
    Turns,
    TurnTakingWorker,
    host_memory,
)
from rlax.core.wire import WirePlan
from rlax.core.worker import role as worker_role
from rlax.core.worker.background_pool import BackgroundPool
from rlax.core.worker.rules import check_reload_in_flight

if TYPE_CHECKING:
    from rlax.core.spec import RunSpec

__all__ = ["InProcessPlacement", "SamplerHost", "in_process_placement"]

log = logging.getLogger("rlax.trainer")


@dataclasses.dataclass(frozen=True)
class InProcessPlacement:
    """Which of this process's devices are whose.

    Attributes:
      mode: ``"one_process"`` (disjoint devices) or ``"colocated"`` (the same ones).
      trainer: the trainer's devices (its mesh is ``rlax.train.mesh`` over them).
      sampler: the sampler's devices.
    """

    mode: str
    trainer: tuple[jax.Device, ...]
    sampler: tuple[jax.Device, ...]


def _host_inventory(devices: list[jax.Device]) -> Inventory:
    """The host as placement sees it; on a CPU-only host, XLA's host devices stand in for
    accelerators (no chip-count rule applies to them)."""
    found = detect_inventory()
    if found.platform != "cpu":
        return found
    return Inventory("gpu", len(devices), "cpu", cpu_cores=found.cpu_cores)


def _roles(placement: Placement, env: Mapping[str, str], devices: list[jax.Device]):
    told = read_role_devices(env)
    if told is not None and told.trainer:
        return told
    if placement.mode not in IN_PROCESS_MODES:
        # "auto" hosts the sampler only on the supervisor's word: a child whose environment
        # narrows its devices (a "processes" trainer sees only its own) would otherwise
        # read its one GPU as a one-device host, "colocated", beside the worker processes.
        return None
    inventory = _host_inventory(devices)
    roles = place_roles(inventory, placement, workers=0)
    if inventory.kind != "cpu" and len(devices) < inventory.count:
        raise ConfigError(
            f"rlax.placement.mode: '{roles.mode}' needs the host's {inventory.count} devices in "
            f"this process; it sees {len(devices)} (start it with `rlax run`, which sets "
            "RLAX_ROLE_DEVICES, or let it see every device)"
        )
    return InProcessRoles(roles.mode, *roles.in_process())


def in_process_placement(
    placement: Placement | None,
    *,
    inline: bool = False,
    env: Mapping[str, str] | None = None,
    devices: list[jax.Device] | None = None,
) -> InProcessPlacement | None:
    """The devices of a trainer that hosts the sampler, or None: it does not (worker
    processes sample; ``--role inline`` samples in the loop itself).

    Args:
      placement: the run's ``rlax.placement`` (None: not set, worker processes).
      inline: ``--role inline``.
      env: the environment (default ``os.environ``; ``RLAX_ROLE_DEVICES`` is read).
      devices: this process's devices (default ``jax.devices()``).

    Raises:
      ConfigError: an in-process mode with several trainer processes, or a split this
        process cannot see.
    """
    if placement is None or inline:
        return None
    devices = list(jax.devices() if devices is None else devices)
    roles = _roles(placement, os.environ if env is None else env, devices)
    if roles is None:
        return None
    if jax.process_count() > 1:
        raise ConfigError(
            f"rlax.placement.mode: '{roles.mode}' hosts the sampler in one trainer process; "
            f"this trainer runs as {jax.process_count()} processes (use mode='processes')"
        )
    if bad := [d for d in (*roles.trainer, *roles.sampler) if not 0 <= d < len(devices)]:
        raise ConfigError(
            f"{roles.mode}: device {bad[0]} is not one of this process's {len(devices)} devices"
        )
    pick = lambda positions: tuple(devices[d] for d in positions)
    return InProcessPlacement(roles.mode, pick(roles.trainer), pick(roles.sampler))


class _Stop:
    """An in-process worker's notice: the host's stop, or the trainer's preemption."""

    def __init__(self, preemption: Preemption):
        self._event, self._preemption = threading.Event(), preemption

    @property
    def requested(self) -> bool:
        return self._event.is_set() or self._preemption.requested

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout) or self._preemption.requested

    def set(self) -> None:
        self._event.set()

    def close(self) -> None:
        """Nothing to release: the trainer owns its preemption's sources."""


class SamplerHost:
    """In-process workers on the sampler's devices, fed weights by a :class:`DeviceHandoff`.

    Args:
      spec: the run; each worker samples with a copy of ``spec.sampler`` (taken before
        anything sets it up) placed on ``where.sampler``, and reads ``spec.worker``.
      where: the placement (:func:`in_process_placement`).
      workers: in-process workers (threads), each with its own sampler copy.

    Raises:
      ConfigError: a sampler that cannot be given devices.
    """

    def __init__(self, spec: RunSpec, where: InProcessPlacement, *, workers: int = 1):
        self.spec, self.where = spec, where
        check_reload_in_flight(spec.sampler, spec.worker.reload_in_flight)
        if not hasattr(spec.sampler, "devices"):
            raise ConfigError(
                f"rlax.placement.mode: '{where.mode}' places the sampler on its devices; "
                f"{type(spec.sampler).__name__} takes none (it has no `devices` attribute)"
            )
        self.samplers = [copy.deepcopy(spec.sampler) for _ in range(workers)]
        for sampler in self.samplers:
            sampler.devices = list(where.sampler)
        place = sampler_placement(getattr(spec.sampler, "mesh", None), where.sampler)
        self.handoff = DeviceHandoff(place, spec.server.wire_dtype)
        self.turns = Turns() if where.mode == "colocated" else None
        self.workers: list[worker_role.Worker] = []
        self._pools: list[BackgroundPool] = []
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._stop: _Stop | None = None

    def source(self, source: Any, trainer: Any) -> OfferingSource:
        """``source`` (the trainer's, from the parameter server) offering every published
        version to the handoff; colocated, also giving the devices up while it waits."""
        if self.turns is None:
            return OfferingSource(source, self.handoff)
        idle = IdleOptimizerState(trainer, host_memory(self.where.trainer))
        return ColocatedSource(source, self.handoff, self.turns, idle)

    def start(self, bundle_config: Any, tokenizer: Any, preemption: Preemption) -> None:
        """Sets each sampler up (an abstract model: weights come by handoff or pull) and
        starts the workers; a worker that fails stops the trainer at its next safe point
        (:meth:`close` raises its error)."""
        self._stop = stop = _Stop(preemption)
        if self.turns is not None:
            self.turns.take_trainer()  # the trainer's until it first waits for rollouts
        model = abstract_model(bundle_config)
        plan = WirePlan.for_tree(nnx.state(model), self.spec.server.wire_dtype)
        for i, sampler in enumerate(self.samplers):
            sampler.setup(model, tokenizer)
            w = self._worker(i, sampler, stop, worker_role.probe_check(self.spec, model))
            self.workers.append(w)
            args = (w, plan, stop, preemption, self._pools[-1])
            thread = threading.Thread(target=self._serve, args=args, name=w.worker_id, daemon=True)
            self._threads.append(thread)
        for thread in self._threads:
            thread.start()
        ids = lambda devices: [d.id for d in devices]
        print(
            f"{self.where.mode}: the trainer on devices {ids(self.where.trainer)}, "
            f"{len(self.workers)} in-process worker(s) sampling on {ids(self.where.sampler)}",
            flush=True,
        )

    def _worker(self, i: int, sampler: Any, stop: _Stop, probe: Any) -> worker_role.Worker:
        spec, own = self.spec, self.spec.worker
        client = ParamServerClient(
            spec.server,
            give_up=lambda: stop.requested,
            relay=True,
            reuse_pull_buffer=not own.reload_in_flight,
        )
        pool = BackgroundPool(
            spec.reward, workers=own.reward_workers, timeout_s=own.reward_timeout_s
        )
        self._pools.append(pool)
        kind = TurnTakingWorker if self.turns is not None else worker_role.Worker
        w = kind(
            client,
            sampler,
            pool,
            list(spec.curation),
            group_size=spec.group_size,
            prompts_per_lease=own.prompts_per_lease,
            reload_staleness=spec.reload_staleness,
            worker_id=f"in-process-{os.getpid()}-{i}",  # a restarted trainer's are new ones
            seed=spec.seed,
            deterministic=spec.deterministic,
            reload_in_flight=own.reload_in_flight,
            adapters=worker_role._adapters(spec.init_checkpoint),
            refresh_interval_s=own.refresh_interval_s,
            interrupt=lambda: stop.requested,
            handoff=self.handoff,
            probe=probe,  # the handed-over weights are checked as pulled ones are
        )
        if isinstance(w, TurnTakingWorker) and self.turns is not None:
            w.turns = self.turns
        return w

    def _serve(
        self, w: Any, plan: WirePlan, stop: _Stop, preemption: Preemption, pool: BackgroundPool
    ) -> None:
        try:
            worker_role._run(w, plan, stop, pool)  # type: ignore[arg-type]  # a notice like it
        except BaseException as err:
            if stop.requested:
                return  # stopping: the server may already be gone
            self._errors.append(err)
            log.exception("%s failed", w.worker_id)
            preemption.notify(f"in-process worker {w.worker_id} failed: {err}")

    def close(self, timeout_s: float = 60.0) -> None:
        """Stops the workers (each submits what it has, or hands it in as partial work) and
        waits for them; raises the first worker's error, if one failed."""
        if self._stop is not None:
            self._stop.set()
        if self.turns is not None:
            self.turns.release_trainer()  # a worker waiting for its turn must see the stop
        for thread in self._threads:
            thread.join(timeout_s)
        h = self.handoff
        print(
            f"in-process workers: {h.taken} versions handed over device to device, "
            f"{h.refused} pulled from the parameter server",
            flush=True,
        )
        if self._errors:
            raise RuntimeError(f"in-process worker failed: {self._errors[0]}") from self._errors[0]
