"""The trainer loop's progress: a bar on a terminal, a line every so many steps elsewhere.

On a terminal, tqdm's bar redraws in place: the phase the trainer is in (``rl [waiting for
rollouts]``) and the last step's figures. Written to a file or a pipe (a log, ``rlax run``'s
children, CI), the same redraws become a ``\\r``-joined line per phase and step, which
buries everything else in the log. There the loop writes one plain line every
``every`` steps instead (``rlax.watch.progress_every``), and one for the last step::

    rl 40/100 [31.2s, 0.78s/step] reward=0.52, queue=3, dlogp=1.2e-02, oob=0.4%
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from tqdm import tqdm

__all__ = ["PipeProgress", "progress_bar"]


class PipeProgress:
    """tqdm's place where the output is not a terminal: a line every ``every`` steps.

    The loop calls it as it calls tqdm: iterates over it, names each phase
    (:meth:`set_description_str`: not written) and hands each step's figures to
    :meth:`set_postfix`; the line of step k is written once step k's body is done.
    """

    def __init__(self, steps: range, *, total: int, every: int, stream: TextIO, desc: str = "rl"):
        self.steps, self.total, self.every, self.stream, self.desc = (
            steps,
            total,
            every,
            stream,
            desc,
        )
        self.postfix: dict[str, Any] = {}
        self.lines = 0
        self._start = time.perf_counter()
        self._first = steps.start - 1  # steps done before this loop (a resumed run)

    def __iter__(self) -> Iterator[int]:
        for step in self.steps:
            yield step
            if step == self.total or (self.every and step % self.every == 0):
                self._write(step)

    def set_description_str(self, desc: str) -> None:
        """A phase's name: shown on a terminal only."""

    def set_postfix(self, refresh: bool = False, **figures: Any) -> None:
        """The last step's figures, written with the next line."""
        self.postfix = figures

    def _write(self, step: int) -> None:
        elapsed = time.perf_counter() - self._start
        rate = elapsed / max(1, step - self._first)
        shown = ", ".join(f"{k}={v}" for k, v in self.postfix.items())
        line = f"{self.desc} {step}/{self.total} [{elapsed:.1f}s, {rate:.2f}s/step]"
        print(f"{line} {shown}".rstrip(), file=self.stream, flush=True)
        self.lines += 1


def progress_bar(
    steps: range, *, total: int, show: bool, every: int, stream: TextIO | None = None
) -> Any:
    """The loop's progress over ``steps`` (of ``total``): tqdm's bar where ``stream``
    (default: stderr, where tqdm writes) is a terminal, else a :class:`PipeProgress` line
    every ``every`` steps (0: the last step's only); nothing written unless ``show``."""
    stream = stream if stream is not None else sys.stderr
    if show and not stream.isatty():
        return PipeProgress(steps, total=total, every=every, stream=stream)
    return tqdm(
        steps, desc="rl", disable=not show, initial=steps.start - 1, total=total, file=stream
    )
