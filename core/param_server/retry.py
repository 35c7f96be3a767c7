"""The one retry policy for calls to the parameter server (client, worker and trainer).

A restarting parameter server is normal (preempted, rescheduled, upgraded),
so the roles wait for it instead of failing. A call that fails with a status
in :data:`RETRYABLE` is repeated after a delay that starts at ``first_s`` and
doubles up to ``max_s`` (bounded exponential backoff), for at most
``deadline_s`` after the first try, with one log line per retry. Every call
the server serves is idempotent (a repeated Submit, Ack or push part is
recognised as a duplicate: docs/param_server.md), so repeating one whose reply
was lost is safe. Any other status is an answer, not an outage: it is raised
at once.

What differs per role goes through hooks, never through a second loop:

- ``give_up()``: asked after each retryable failure; True raises that error
  at once (a worker after a notice: its leases expire and are served again,
  so nothing is lost by not waiting).
- ``stop(what, err)``: called after each retryable failure; an exception it
  raises ends the retries (the trainer after a notice: ``Preempted`` while it
  waits for rollouts, ``LostStep`` in the middle of a step).
- ``before_retry`` (one call's): runs before each repeat of that call (the
  trainer returns orphaned takes to the queue before it repeats a Take).
- ``sleep``: how to wait (a worker waits on its notice, so one ends the wait).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

log = logging.getLogger("rlax.retry")

T = TypeVar("T")

RETRYABLE = frozenset(
    {
        # Nobody listens at the address (the server is restarting) or the connection broke.
        grpc.StatusCode.UNAVAILABLE,
        # No reply within the call's timeout (each is its wait plus a margin): a server
        # that hangs, or one still loading its state after a restart.
        grpc.StatusCode.DEADLINE_EXCEEDED,
        # A server shutting down cancels the calls in flight.
        grpc.StatusCode.CANCELLED,
    }
)


def _never() -> bool:
    return False


def _go_on(what: str, err: grpc.RpcError) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How a role retries its calls to an unreachable parameter server.

    Attributes:
      deadline_s: how long after the first try a call is still repeated
        (``0``: never; ``math.inf``: until ``give_up`` or ``stop`` ends it). A
        retry that would start after the deadline is not made.
      first_s: the first delay; each next one is twice the last, at most ``max_s``.
      max_s: the longest delay between two tries.
      give_up: True ends the retries with the last error (asked after each failure).
      stop: raises to end the retries its own way (called after each failure).
      sleep: waits the given seconds.
      clock: monotonic seconds (the deadline's clock).
    """

    deadline_s: float = 60.0
    first_s: float = 0.2
    max_s: float = 5.0
    give_up: Callable[[], bool] = _never
    stop: Callable[[str, grpc.RpcError], None] = _go_on
    sleep: Callable[[float], object] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def delays(self) -> Iterator[float]:
        """The waits before the 2nd, 3rd, ... try: ``first_s``, doubling, capped at ``max_s``."""
        delay = self.first_s
        while True:
            yield delay
            delay = min(2 * delay, self.max_s)

    def call(
        self, what: str, fn: Callable[[], T], *, before_retry: Callable[[], object] | None = None
    ) -> T:
        """``fn()``, repeated while it fails with a retryable status; ``what`` names it in the log.

        Raises:
          grpc.RpcError: a status outside :data:`RETRYABLE` (at once), or the
            last retryable one once ``give_up`` said so or the deadline passed.
          Exception: whatever ``stop`` or ``before_retry`` raised.
        """
        deadline, delays, retried = self.clock() + self.deadline_s, self.delays(), False
        while True:
            try:
                if retried and before_retry is not None:
                    before_retry()
                return fn()
            except grpc.RpcError as err:
                code = err.code()
                if code not in RETRYABLE:
                    raise
                self.stop(what, err)
                delay = next(delays)
                if self.give_up() or self.clock() + delay > deadline:
                    raise
                log.warning(
                    "%s: %s; retrying in %.1fs (the parameter server is unreachable)",
                    what,
                    code.name,
                    delay,
                )
            self.sleep(delay)
            retried = True
