"""Colocated placement: the trainer and the sampler take turns on the same devices.

In ``"colocated"`` placement (:mod:`rlax.core.parallel.placement`; the default on one
device) the trainer and its in-process workers share every device. They take turns
(:class:`Turns`): the trainer holds the devices from start-up and gives them up only
while it waits for rollouts (:class:`ColocatedSource`); a worker holds them while it
generates (:class:`TurnTakingWorker`). So the sampler samples between the trainer's
steps, and the trainer never trains while a worker samples.

While the trainer waits, its optimiser state is idle: where the backend has a host
memory kind apart from its device memory (``pinned_host`` on GPU and TPU), it is moved
there for the wait and back before the step (:class:`IdleOptimizerState`), so the
sampler has that memory for its weights and KV cache. On the CPU it stays where it is:
there the device memory *is* host memory, and a copy would gain nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import jax

from rlax.core.trainer.handoff import DeviceHandoff, OfferingSource
from rlax.core.worker.role import Worker

__all__ = ["ColocatedSource", "IdleOptimizerState", "TurnTakingWorker", "Turns", "host_memory"]


class Turns:
    """Whose turn it is on the shared devices: the trainer's or one worker's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trainer_holds = False

    def take_trainer(self) -> None:
        """The trainer's turn (waits for a worker to finish generating)."""
        self._lock.acquire()
        self._trainer_holds = True

    def release_trainer(self) -> None:
        """The trainer gives its turn up (nothing if it does not hold it)."""
        if self._trainer_holds:
            self._trainer_holds = False
            self._lock.release()

    def take_worker(self, stopping: Any) -> bool:
        """A worker's turn; False if ``stopping()`` became true while it waited."""
        while not self._lock.acquire(timeout=0.5):
            if stopping():
                return False
        return True

    def release_worker(self) -> None:
        self._lock.release()


class TurnTakingWorker(Worker):
    """A worker that generates only in its turn (``turns``, set by its host)."""

    turns: Turns

    def _generate(self, prompts, partials, plan):
        if not self.turns.take_worker(self.interrupt):
            return []  # stopping: the leases expire and are served again
        try:
            return super()._generate(prompts, partials, plan)
        finally:
            self.turns.release_worker()


def host_memory(devices: Sequence[jax.Device]) -> str | None:
    """The memory kind idle state moves to on ``devices``, or None: it stays (the CPU,
    whose device memory is host memory, or a backend without ``pinned_host``)."""
    device = devices[0]
    if device.platform == "cpu":
        return None
    kinds = {m.kind for m in device.addressable_memories()}
    return "pinned_host" if "pinned_host" in kinds else None


class IdleOptimizerState:
    """Moves a trainer's optimiser state to host memory for a wait, and back.

    Args:
      trainer: the :class:`~rlax.core.trainer.step.Trainer`.
      kind: the host memory kind (:func:`host_memory`); None: nothing moves.
    """

    def __init__(self, trainer: Any, kind: str | None):
        self.trainer, self.kind = trainer, kind
        self._shardings: Any = None
        self.moves = 0

    def park(self) -> None:
        if self.kind is None:
            return
        state = self.trainer.state
        self._shardings = jax.tree.map(lambda x: x.sharding, state.opt_state)
        host = jax.tree.map(lambda s: s.with_memory_kind(self.kind), self._shardings)
        state.opt_state = jax.device_put(state.opt_state, host)
        self.moves += 1

    def unpark(self) -> None:
        if self._shardings is None:
            return
        state = self.trainer.state
        state.opt_state = jax.device_put(state.opt_state, self._shardings)
        self._shardings = None


class ColocatedSource(OfferingSource):
    """An offering source that gives the devices to the workers while the trainer waits
    for rollouts, with its optimiser state parked in host memory meanwhile."""

    def __init__(self, source: Any, handoff: DeviceHandoff, turns: Turns, idle: IdleOptimizerState):
        super().__init__(source, handoff)
        self.turns, self.idle = turns, idle

    def next_batch(self, version: int) -> Any:
        self.idle.park()
        self.turns.release_trainer()
        try:
            return self.source.next_batch(version)
        finally:
            self.turns.take_trainer()
            self.idle.unpark()
