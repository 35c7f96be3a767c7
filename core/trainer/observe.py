"""Watching a run while it runs: loggers, rollout traces, periodic evaluation, curves.

:class:`Observer` is what the trainer loop (:mod:`rlax.core.trainer.loop`)
calls between steps; its process 0 does the writing. It

- sends every step's metrics row to the loggers chosen in gin
  (``rlax.watch.loggers``: :class:`rlax.core.contracts.Logger`), whose
  failures are warnings, never the end of the run (:class:`Loggers`);
- every ``trace_every`` steps, writes ``trace_groups`` of the step's groups to
  ``RUN/rollouts.jsonl`` (:mod:`rlax.core.evaluation.traces`) and to the loggers;
- every ``eval_every`` steps, evaluates the policy on the held-out set, whose
  pass@k goes into that step's metrics as ``heldout/pass_at_<k>``;
- every ``plot_every`` steps, and at a preemption, redraws ``RUN/curves.png``
  (``curves = False``: never, for runs watched through their loggers alone);
  at a preemption it also writes ``RUN/eval.json`` with what was measured so far
  (:meth:`Observer.save_eval`, which writes it at the end too: its one writer).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import pathlib
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from rlax.core.constraints import AtLeast, check_fields
from rlax.core.contracts import Logger, Reward
from rlax.core.evaluation import traces
from rlax.core.evaluation.plot import HELDOUT, plot_curves
from rlax.core.runtime.run_dir import RunDir
from rlax.core.types import Group

_log = logging.getLogger("rlax.trainer")


# A period in steps (0 turns the thing off).
Every = Annotated[int, AtLeast(0, means="0: never")]


@dataclasses.dataclass(frozen=True)
class WatchSettings:
    """How the trainer's run is watched (the module doc; ``rlax.watch`` in gin)::

    rlax.watch.loggers = [@loggers.tensorboard()]
    rlax.watch.eval_every = 100   # held-out pass@k every 100 steps (0: before and after only)
    rlax.watch.trace_every = 10   # rollout traces every 10 steps (0: none)
    rlax.watch.trace_groups = 2   # groups per traced step
    rlax.watch.plot_every = 50    # curves.png every 50 steps (0: at a preemption and the end)
    rlax.watch.curves = True      # False: no curves.png at all
    rlax.watch.progress_every = 10  # progress to a file or pipe: a line every 10 steps
    """

    loggers: Sequence[Logger] = ()
    eval_every: Every = 0
    trace_every: Every = 10
    trace_groups: Annotated[int, AtLeast(1)] = 2
    plot_every: Every = 50
    curves: bool = True
    # Not a terminal (a log file, a pipe): one progress line every this many steps, and
    # the last step's (0: the last step's only); a terminal shows the bar.
    progress_every: Every = 10

    def __post_init__(self) -> None:
        object.__setattr__(self, "loggers", tuple(self.loggers))
        check_fields(self)

    def schedule(self) -> dict[str, Any]:
        """Every setting but the loggers, as :class:`Observer` takes them."""
        fields = dataclasses.fields(self)
        return {f.name: getattr(self, f.name) for f in fields if f.name != "loggers"}


def heldout_metrics(results: dict[str, float]) -> dict[str, float]:
    """``{"pass@1": x}`` -> ``{"heldout/pass_at_1": x}`` (names every logger takes as they are)."""
    return {HELDOUT + k.removeprefix("pass@"): v for k, v in results.items()}


def heldout_history(rows: Sequence[dict]) -> list[dict[str, float]]:
    """The periodic evaluations in ``rows``: ``[{"step": k, "pass@1": x, ...}, ...]``."""
    return [
        {
            "step": r["step"],
            **{f"pass@{n.removeprefix(HELDOUT)}": v for n, v in r.items() if n.startswith(HELDOUT)},
        }
        for r in rows
        if any(n.startswith(HELDOUT) for n in r)
    ]


def eval_results(before: dict | None, rows: Sequence[dict], after: dict | None = None) -> dict:
    """``eval.json``: before, the periodic evaluations ("during", when there were any), after."""
    results: dict[str, Any] = {"before": before}
    if history := heldout_history(rows):
        results["during"] = history
    if after is not None:
        results["after"] = after
    return results


class Loggers:
    """Calls every logger; one that raises is a warning, and the run goes on.

    The first failure of each logger's method is shown; later ones are counted,
    and the count is shown when the loggers close.
    """

    def __init__(self, loggers: Sequence[Logger]):
        self.loggers = list(loggers)
        self.failures: collections.Counter = collections.Counter()

    def call(self, method: str, *args: Any) -> None:
        for logger in list(self.loggers):
            try:
                getattr(logger, method)(*args)
            except Exception as err:  # noqa: BLE001 -- a logger never ends the run
                key = (type(logger).__name__, method)
                self.failures[key] += 1
                if method == "open":  # it has nowhere to write: leave it out from now on
                    self.loggers.remove(logger)
                if self.failures[key] == 1:
                    _log.warning(
                        "logger %s failed in %s: %s: %s; the run goes on%s",
                        key[0],
                        method,
                        type(err).__name__,
                        err,
                        " without it" if method == "open" else "",
                    )

    def close(self) -> None:
        self.call("close")
        for (name, method), n in sorted(self.failures.items()):
            if n > 1:
                _log.warning("logger %s failed in %s %d times in all", name, method, n)
        self.loggers = []


class Observer:
    """The loop's observer of one run (see the module doc); ``lead``: process 0, which writes."""

    def __init__(
        self,
        run_dir: RunDir | pathlib.Path,
        loggers: Sequence[Logger] = (),
        *,
        evaluate: Callable[[], dict[str, float]] | None = None,
        reward: Reward | None = None,
        eval_every: int = 0,
        trace_every: int = 0,
        trace_groups: int = 2,
        plot_every: int = 0,
        curves: bool = True,
        progress_every: int = 10,
        lead: bool = True,
    ):
        self.run_dir, self.loggers, self.lead = RunDir.of(run_dir), Loggers(loggers), lead
        self._evaluate, self.reward = evaluate, reward
        self.eval_every, self.trace_every, self.trace_groups = eval_every, trace_every, trace_groups
        self.plot_every, self.curves = plot_every, curves
        self.progress_every = progress_every  # read by the loop's progress line

    @property
    def traces_path(self) -> pathlib.Path:
        return self.run_dir.rollouts

    def open(self, step: int) -> None:
        """Before the first step; ``step``: the last step done (a resumed run's)."""
        if self.lead:
            traces.keep_until(self.traces_path, step)
            self.loggers.call("open", str(self.run_dir), step)

    def eval_due(self, step: int) -> bool:
        return bool(self._evaluate and self.eval_every and step % self.eval_every == 0)

    def evaluate(self) -> dict[str, float]:
        """The held-out pass@k of the current policy, as metrics (every process calls it)."""
        assert self._evaluate is not None
        return heldout_metrics(self._evaluate())

    def trace(self, step: int, groups: Sequence[Group]) -> None:
        """Writes the step's traces when due (process 0)."""
        if not (self.lead and self.trace_every and step % self.trace_every == 0 and groups):
            return
        rows = traces.trace_rows(step, traces.sample(groups, self.trace_groups), self.reward)
        traces.append(self.traces_path, rows)
        self.loggers.call("log_traces", step, rows)

    def step_end(self, step: int, metrics: dict, rows: Sequence[dict]) -> None:
        """After the step's row is written: the loggers, and the curves when due."""
        if not self.lead:
            return
        self.loggers.call("log_metrics", step, metrics)
        if self.plot_every and step % self.plot_every == 0:
            self.plot(rows)

    def plot(
        self, rows: Sequence[dict], before: dict | None = None, after: dict | None = None
    ) -> None:
        if self.lead and self.curves and rows:
            plot_curves(
                rows, self.run_dir.curves, title=self.run_dir.path.name, before=before, after=after
            )

    def stopped(self, rows: Sequence[dict], before: dict | None) -> None:
        """At a preemption's safe point: the curves and ``eval.json`` as they stand."""
        if not self.lead:
            return
        self.plot(rows, before)
        self.save_eval(rows, before)

    def save_eval(
        self, rows: Sequence[dict], before: dict | None, after: dict | None = None
    ) -> dict:
        """Writes ``eval.json`` (:func:`eval_results`) and returns it; process 0 alone calls it."""
        results = eval_results(before, rows, after)
        self.run_dir.write_eval(results)
        return results

    def close(self) -> None:
        if self.lead:
            self.loggers.close()
