"""Where a step's time goes: the phases of the trainer loop, timed, and shown on the progress line.

Every step's metrics hold the seconds of each phase (``<phase>_s``) and the
step's wall time ``step_s``, measured from the end of the step before (so the
loggers and hooks that ran in between are counted, in ``observe_s``): the
phases add up to the step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from rlax.core.runtime.recovery import FIGURES as RECOVERY_FIGURES

#: Each phase's metric name (``<phase>_s``) and what the progress line says during it.
PHASES: dict[str, str] = {
    "wait_rollouts": "waiting for rollouts",
    "train": "training",
    "publish": "publishing weights",
    "eval": "evaluating",
    "checkpoint": "checkpointing",
    "observe": "logging",
}
#: The metrics that depend on wall-clock time (two runs that train alike differ in these only).
WALL_CLOCK = frozenset(
    {
        "time",
        "step_s",
        "tokens_per_s",
        "generate_s",
        "score_s",
        *(f"{p}_s" for p in PHASES),
        # A restarted trainer's first row only: how it came back (rlax.core.runtime.recovery).
        *(f"recovery/{name}" for name in RECOVERY_FIGURES),
    }
)


class PhaseClock:
    """Times the phases of one step; ``on_phase(description)`` is told as each one starts.

    Args:
      on_phase: called with the phase's description (:data:`PHASES`) as it starts.
      start: when the step began (``time.perf_counter()``; default: now).
    """

    def __init__(self, on_phase: Callable[[str], None] | None = None, start: float | None = None):
        self.on_phase = on_phase or (lambda description: None)
        self.start = time.perf_counter() if start is None else start
        self.seconds = dict.fromkeys(PHASES, 0.0)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        """Times the ``with`` block as ``phase`` (the times of a phase entered twice add up)."""
        self.on_phase(PHASES[phase])
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - begin

    def metrics(self) -> dict[str, float]:
        """``<phase>_s`` for every phase, ``step_s`` since the start and ``time`` (Unix seconds)."""
        now = time.perf_counter()
        return {
            **{f"{phase}_s": s for phase, s in self.seconds.items()},
            "step_s": now - self.start,
            "time": time.time(),
        }
