"""Concurrent agent episodes share the sampler: their pending requests go in one ``generate`` call.

Each agent episode sends one request at a time, but many episodes run at
once. :class:`Batcher` gathers their requests and samples them together, as
:mod:`rlax.plugins.environments.runner` batches the turns of live episodes:

- the first request to arrive while no batch is being sampled leads the next
  batch: it waits for more until ``window_s`` passes with no new request, or
  less once every live episode (``live()``) has a request pending (the
  window counts from the last arrival: hundreds of episodes' requests come
  in one after another, a fraction of a millisecond apart each, and go in
  one batch);
- requests that arrive while a batch is being sampled wait for it to end and
  then go together in the next one.

A batch is ONE ``sampler.generate(prompts, 1, seed=...)`` call; each request
gets its own row's Completion (the sampler's ids, logprobs, versions). The
seed: a batch of one request is sampled with that request's seed (as the
endpoint derives it: the API's ``seed``, else the episode's name and turn);
a batch of several with a seed derived from all of theirs, in order. A
sampler that raises fails every request of its batch with that error.

In-flight weights (``rlax.worker.reload_in_flight``): while ``refresh`` is
set (the worker's, for one ``generate_groups`` call), each batch first asks
it for newer weights and loads what it returns into the sampler, so a turn
sampled after a load uses the new weights and its ids carry their version;
no batch is sampled while weights load (one batch at a time).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

from rlax.core.contracts import Sampler
from rlax.core.types import Completion, Prompt

__all__ = ["Batcher"]


@dataclasses.dataclass
class _Request:
    prompt: Prompt
    seed: int
    result: Completion | None = None
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


class Batcher:
    """Samples concurrent requests together (see the module docstring).

    Args:
      sampler: the policy's sampler.
      window_s: how long a batch's first request waits for others.
      live: how many episodes may send a request now (0: unknown, wait the window).
    """

    def __init__(
        self, sampler: Sampler, *, window_s: float = 0.01, live: Callable[[], int] | None = None
    ):
        self.sampler = sampler
        self.window_s = window_s
        self.live = live or (lambda: 0)
        self.refresh: Callable[[], tuple[Any, int] | None] | None = None
        self.loads = 0  # weights loaded from refresh
        self.calls = 0  # generate calls made
        self.requests = 0  # requests sampled
        # One lock, two conditions: an arrival wakes the gathering leader only, and the end
        # of a batch wakes the waiting requests (a notify_all per arrival would wake
        # hundreds of waiting threads hundreds of times a batch).
        lock = threading.Lock()
        self._arrived = threading.Condition(lock)
        self._finished = threading.Condition(lock)
        self._pending: list[_Request] = []
        self._busy = False

    def sample(self, prompt: Prompt, seed: int) -> Completion:
        """One completion of ``prompt``, sampled in a batch with whatever else is pending."""
        request = _Request(prompt, seed)
        batch: list[_Request] = []
        with self._arrived:
            self._pending.append(request)
            self._arrived.notify()
            while not request.done and self._busy:
                self._finished.wait()
            if not request.done:
                self._busy = True
                batch = self._gather()
        if batch:
            self._run(batch)
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def _gather(self) -> list[_Request]:
        """The batch, once the window has passed since the last arrival or every live
        episode has a request in."""
        deadline, seen = time.monotonic() + self.window_s, len(self._pending)
        while len(self._pending) < self.live():
            if len(self._pending) > seen:
                deadline, seen = time.monotonic() + self.window_s, len(self._pending)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._arrived.wait(left)
        batch, self._pending = self._pending, []
        return batch

    def _run(self, batch: list[_Request]) -> None:
        try:
            seed = batch[0].seed
            if len(batch) > 1:
                seed = zlib.crc32(",".join(str(r.seed) for r in batch).encode())
            newer = self.refresh() if self.refresh is not None else None
            if newer is not None:
                self.sampler.load_weights(*newer)
                self.loads += 1
            outs = self.sampler.generate([r.prompt for r in batch], 1, seed=seed)
            for r, (c,) in zip(batch, outs, strict=True):
                r.result = c
        except BaseException as err:  # noqa: BLE001 -- each request raises it in its own thread
            for r in batch:
                r.error = err
        finally:
            with self._finished:
                self.calls += 1
                self.requests += len(batch)
                self._busy = False
                self._finished.notify_all()
