"""The trainer loop between two steps: checkpoints and resume.

:class:`TrainingRun` holds what a checkpoint saves beyond the arrays — the
loop's step, the weight-version offset, the data position, the evaluation
before training — and does the resume (docs/preemption.md, "The trainer's
checkpoints"): restore the newest good checkpoint, continue the metrics log,
let the rollout source continue from its recorded position
(:class:`rlax.core.contracts.RolloutSource`: the inline one
fast-forwards its prompts, the remote one rolls the server's queue back),
re-publish the weights. The loop never asks which source it has; each step is
:func:`rlax.core.trainer.iteration.train_step`.

With several trainer processes (docs/mesh.md) the loop runs on every process
and process 0 leads: it alone talks to the rollout queue (taking, acking,
rolling back), writes the metrics log and calls the step hooks; every process
trains, pushes its part of the weights and checkpoints (orbax coordinates
them). After each step the processes agree on one outcome — whether any of
them saw a preemption notice or lost its step — so all of them checkpoint
and stop at the same step.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any

from rlax.core.contracts import RolloutSource
from rlax.core.errors import ConfigError, LostStep, Preempted, SourceMismatch
from rlax.core.evaluation.metrics import MetricsLog
from rlax.core.parallel import multihost
from rlax.core.rollout.groups import generated_tokens
from rlax.core.runtime import recovery
from rlax.core.runtime.preemption import Preemption
from rlax.core.runtime.run_dir import RunDir
from rlax.core.trainer.checkpoint import Checkpointer, Restored
from rlax.core.trainer.iteration import train_step
from rlax.core.trainer.observe import Observer
from rlax.core.trainer.phases import PhaseClock
from rlax.core.trainer.progress import progress_bar
from rlax.core.trainer.step import Trainer, TrainState
from rlax.core.types import Group

_log = logging.getLogger("rlax.trainer")


def state_tree(state: TrainState) -> tuple:
    """The arrays a checkpoint holds (the step and the rest go in its metadata)."""
    return (state.params, state.opt_state, state.critic)


def apply_restored(trainer: Trainer, restored: Restored) -> None:
    params, opt_state, critic = restored.state
    trainer.state = TrainState(params, opt_state, int(restored.meta["train_step"]), critic)
    print(
        f"resumed from {restored.path}: step {restored.step}, weight version "
        f"{restored.meta['version']}",
        flush=True,
    )


class EmptyStepWatch:
    """Says in the log when several steps in a row kept no group (so nothing was trained).

    A reward that scores every sample alike, with a filter such as
    ``zero_variance``, drops every group; without this the run would go on
    reporting ``groups_kept: 0`` in silence. It warns once a streak reaches
    ``after`` steps and again each time the streak doubles.
    """

    def __init__(self, filters: Sequence[Any], after: int = 3):
        self.names = ", ".join(type(f).__name__ for f in filters) or "none"
        self.after = after
        self._first, self._streak, self._stale = 0, 0, 0

    def see(self, step: int, metrics: dict) -> None:
        """Counts step ``step``'s outcome (its metrics row)."""
        if metrics.get("groups_kept", 1):
            self._streak = self._stale = 0
            return
        if not self._streak:
            self._first = step
        self._streak += 1
        self._stale += int(metrics.get("dropped_stale", 0))
        n = self._streak
        times, rest = divmod(n, self.after)
        if times and not rest and times & (times - 1) == 0:  # after, 2 * after, 4 * after, ...
            _log.warning(
                "steps %d-%d (%d in a row) kept no group, so nothing was trained: "
                "the curation filters (%s) dropped every group (%d more as stale); "
                "does the reward score every sample alike?",
                self._first,
                step,
                n,
                self.names,
                self._stale,
            )


def saved_position(meta: dict[str, Any]) -> dict[str, Any]:
    """The source's position in a checkpoint's metadata.

    Checkpoints written before the sources kept their own position held the
    inline source's sampler-seed counter under ``rng`` rather than ``data``;
    it is read from there, so those runs resume as they would have.
    """
    position = dict(meta.get("data") or {})
    legacy = (meta.get("rng") or {}).get("sampler_step")
    if "drawn" in position and "sampler_step" not in position and legacy is not None:
        position["sampler_step"] = legacy
    return position


class TrainingRun:
    """The trainer loop's state between steps: what a checkpoint saves and a resume restores."""

    def __init__(
        self,
        run_dir: RunDir | pathlib.Path,
        trainer: Trainer,
        source: RolloutSource,
        ckpt: Checkpointer,
        preemption: Preemption,
        restored: Restored | None,
        deterministic: bool,
        seed: int,
        observer: Observer | None = None,
    ):
        self.run_dir, self.trainer, self.source = RunDir.of(run_dir), trainer, source
        self.observer = observer or Observer(self.run_dir, lead=multihost.is_lead())
        self.ckpt, self.preemption = ckpt, preemption
        self.deterministic, self.seed = deterministic, seed
        meta = restored.meta if restored is not None else {}
        self.restored = restored
        self.step = restored.step if restored is not None else 0
        self._saved_step = restored.step if restored is not None else None
        self.version_offset = int(meta.get("version_offset", 0))
        self.eval_before = meta.get("eval_before")
        self.lead = multihost.is_lead()  # process 0 of the trainer (always, with one process)
        # Every process keeps the rows (the same on each); process 0 writes the file.
        self.log = MetricsLog(self.run_dir.metrics if self.lead else pathlib.Path(os.devnull))
        self.empty_steps = EmptyStepWatch(source.curation)
        # A restarted or resumed trainer's way back: its first step's row gets the figures.
        clock = recovery.current()  # the trainer role's (rlax.core.runtime.recovery.begin)
        resumed = clock is not None and (restored is not None or clock.is_restart)
        self.recovering: recovery.RecoveryClock | None = clock if resumed else None
        if self.recovering is not None:  # process 0 writes RUN/recovery.jsonl
            self.recovering.run_dir = self.run_dir if self.lead else None
            self.recovering.mark("restore")  # the checkpoint just restored (the role's _restore)
        self.redone = {"redone_steps": 0.0, "redone_tokens": 0.0}

    @property
    def version(self) -> int:
        return self.trainer.state.step + self.version_offset

    def resume(self) -> None:
        """Continues the data position, the metrics log and the served weights."""
        if self.restored is not None:
            self._check_same_source()  # before anything changes: a refused resume changes nothing
            self.source.load_curation_state(self.restored.meta.get("curation", []))
        self._continue_metrics()
        restored_version = self.version
        published = self.source.resume(self.trainer.state.params, restored_version)
        self.version_offset += published - restored_version
        if self.recovering is not None:
            self.recovering.mark("weights")  # republished; the queue rolled back

    def _check_same_source(self) -> None:
        """Restores the source's position; ConfigError if another kind of source recorded it.

        An inline run records how many prompts it drew; a run fed by a parameter
        server keeps its position in the server's queue. Neither can continue the other.
        """
        assert self.restored is not None
        try:
            self.source.restore(saved_position(self.restored.meta))
        except SourceMismatch as err:
            raise ConfigError(
                f"{self.run_dir}: its checkpoint at step {self.step} was trained with "
                f"{err.made_with}; resume it the same way"
            ) from None

    def _continue_metrics(self) -> None:
        path = self.log.path
        if not self.lead or not path.exists():  # process 0 keeps the file
            return
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        kept = [r for r in rows if r.get("step", 0) <= self.step]  # steps 1..k are in the state
        lost = [r for r in rows if r.get("step", 0) > self.step]  # trained again from here
        self.redone = {
            "redone_steps": float(len({r["step"] for r in lost})),
            "redone_tokens": float(sum(r.get("trained_tokens", 0) for r in lost)),
        }
        if len(kept) != len(rows):
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
            tmp.replace(path)
        self.log.rows = kept

    def loop(self, steps: int, hook, progress: bool, **step_args) -> None:
        """Runs steps ``self.step + 1 .. steps``; ``step_args`` go to each :func:`train_step`."""
        # Steps are numbered from 1: step k is the k-th update, after which trainer.state.step
        # == k. The hooks, metrics.jsonl, checkpoints and the bar all use that number.
        bar = progress_bar(
            range(self.step + 1, steps + 1),
            total=steps,
            show=progress and self.lead,
            every=self.observer.progress_every,  # where the output is not a terminal
        )
        self.observer.open(self.step)
        if self._agree(None, None)[1]:
            self._stop()
        mark = time.perf_counter()
        for step in bar:
            # The phase the trainer is in, on the progress line: a stalled fleet shows as
            # "waiting for rollouts" (with the queue's depth) for as long as it stalls.
            clock = PhaseClock(lambda phase: bar.set_description_str(f"rl [{phase}]"), mark)
            clock.seconds["observe"] += time.perf_counter() - mark  # the last step's loggers
            lost, groups = None, list[Group]()
            try:
                metrics = train_step(
                    step,
                    self.source,
                    self.trainer,
                    version_offset=self.version_offset,
                    deterministic=self.deterministic,
                    clock=clock,
                    groups=groups,
                    seed=self.seed,
                    **step_args,
                )
                metrics["trained_tokens"] = generated_tokens(groups)  # process 0's are kept
            except LostStep as err:  # the state holds half a step: keep the last checkpoint
                metrics, lost = None, str(err)
            except Preempted as err:  # on every process: process 0 stopped waiting for rollouts
                if not self.preemption.requested:
                    self.preemption.notify(f"trainer process 0: {err}")
                self._stop()
            lost, stop, metrics = self._agree(lost, metrics)
            if lost is not None:
                print(f"rlax: trainer: {lost}; step {step} is redone after the restart", flush=True)
                self.ckpt.wait()
                self.preemption.stop_now()
            mark = self._end_step(step, steps, metrics, hook, bar, stop, clock, groups)

    def _end_step(
        self,
        step: int,
        steps: int,
        metrics: dict,
        hook,
        bar,
        stop: bool,
        clock: PhaseClock,
        groups: list[Group],
    ) -> float:
        """Counts step ``step`` done: evaluates and checkpoints when due, logs it, calls the hooks.

        Returns the moment the step's row was complete: the next step's clock starts there.
        """
        self.step = step
        # The save started a step ago must be complete before this step counts, so a
        # crash never redoes more than checkpointing.every steps (it rarely has to wait).
        with clock("checkpoint"):
            self.ckpt.wait()
        if self.observer.eval_due(step):
            with clock("eval"):
                metrics.update(self.observer.evaluate())
        if self.ckpt.due(self.step) or self.step == steps or stop:
            with clock("checkpoint"):
                self.save(rows=len(self.log.rows) + 1)  # this step's row is written next
        with clock("observe"):
            self.observer.trace(step, groups)
        metrics.update(clock.metrics())
        if self.recovering is not None:  # the first step after a restart: useful again
            metrics.update(self._recovered(metrics))
        mark = time.perf_counter()
        self.log.write(metrics)
        if self.lead:
            shown: dict[str, object] = {}
            if "queue_depth" in metrics:
                shown["queue"] = int(metrics["queue_depth"])
            if "kl_old" in metrics:  # measured only with trainer_settings.post_update_kl
                shown["kl"] = f"{metrics['kl_old']:.1e}"
            if "mismatch_abs_logp" in metrics:  # train/rollout alignment (issue 53)
                shown["dlogp"] = f"{metrics['mismatch_abs_logp']:.1e}"
                shown["oob"] = f"{metrics.get('ratio_out_of_band', 0.0):.1%}"
            bar.set_postfix(reward=f"{metrics['reward']:.2f}", **shown, refresh=False)
            hook.rlax_on_step_end(step=step, metrics=metrics)
            self.empty_steps.see(step, metrics)
            hook.rlax_on_weights_published(version=self.version)
        self.observer.step_end(step, metrics, self.log.rows)
        self.ckpt.poll()
        if stop:
            self._stop()
        return mark

    def _recovered(self, metrics: dict) -> dict[str, float]:
        """The recovery's figures (:mod:`rlax.core.runtime.recovery`) as ``recovery/*``
        metrics; the step's wait for its rollouts is the recovery's ``refill``."""
        clock, self.recovering = self.recovering, None
        assert clock is not None
        row = clock.finish({"refill": metrics.get("wait_rollouts_s", 0.0)}, **self.redone)
        return {f"recovery/{k}": float(row[k]) for k in recovery.FIGURES if k in row}

    def _agree(self, lost: str | None, metrics: dict | None) -> tuple[str | None, bool, Any]:
        """(why a step was lost, whether to stop, the step's metrics), the same on every process.

        With several processes a notice reaches one of them, or all at
        different moments; they exchange what each saw at this step boundary
        (one small all-gather), so all checkpoint and stop after the same
        step, and all keep process 0's metrics (its timings and the queue's
        figures). A process that learns of another's notice records it as its own.
        """
        mine = self.preemption.reason if self.preemption.requested else None
        if not self.lead:
            metrics = None  # process 0's are the ones kept
        everyone = multihost.allgather_objects((lost, mine, metrics))
        lost = next(
            (
                f"trainer process {i}: {x}" if i else x
                for i, (x, _, _) in enumerate(everyone)
                if x is not None
            ),
            None,
        )
        notice = next(((i, x) for i, (_, x, _) in enumerate(everyone) if x is not None), None)
        if notice is not None and not self.preemption.requested:
            self.preemption.notify(f"trainer process {notice[0]}: {notice[1]}")
        return lost, notice is not None or lost is not None, everyone[0][2]

    def save(self, rows: int | None = None) -> float:
        """Checkpoints the whole state (every process: orbax writes each one's shards).

        ``rows``: the rows of ``metrics.jsonl`` the state covers (default: those written).
        """
        meta = {
            "train_step": self.trainer.state.step,
            "version": self.version,
            "version_offset": self.version_offset,
            # The source's data position and its curation filters' state (a curriculum's
            # history); orbax writes process 0's metadata.
            "data": self.source.position() if self.lead else {},
            "curation": self.source.curation_state(),
            "rng": {"seed": self.seed},
            "eval_before": self.eval_before,
            "metrics_rows": len(self.log.rows) if rows is None else rows,
            "deterministic": self.deterministic,
        }
        self._saved_step = self.step
        return self.ckpt.save(self.step, state_tree(self.trainer.state), meta)

    def _stop(self) -> None:
        """At a safe point after a notice: make sure the state is on disk, then stop."""
        if self._saved_step != self.step:
            self.save()
        self.observer.stopped(self.log.rows, self.eval_before)  # while the save writes
        self.ckpt.wait()
        self.preemption.stop_now()
