"""The trainer loop between two steps: checkpoints, resume, and a restart-proof client.

:class:`TrainingRun` holds what a checkpoint saves beyond the arrays — the
loop's step, the weight-version offset, the data position, the evaluation
before training — and does the resume (DESIGN.md §5): restore the newest good
checkpoint, continue the metrics log, roll the rollout queue back to the
checkpoint (or fast-forward the inline source), re-publish the weights.
:class:`TrainerClient` is the parameter-server client as the trainer uses it.

With several trainer processes (docs/mesh.md) the loop runs on every process
and process 0 leads: it alone talks to the rollout queue (taking, acking,
rolling back), writes the metrics log and calls the step hooks; every process
trains, pushes its part of the weights and checkpoints (orbax coordinates
them). After each step the processes agree on one outcome — whether any of
them saw a preemption notice or lost its step — so all of them checkpoint
and stop at the same step.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from tqdm import tqdm

from rlax.core.errors import ConfigError, Preempted
from rlax.core.evaluation.metrics import MetricsLog
from rlax.core.launch.preemption import Preemption
from rlax.core.parallel import multihost as distributed
from rlax.core.param_server import recovery
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.trainer.checkpoint import Restored
from rlax.core.trainer.sources import RemoteRollouts
from rlax.core.trainer.step import Trainer, TrainState

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


# CANCELLED: a server shutting down cancels the calls in flight (all safe to repeat).
_RECONNECT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
}


class TrainerClient:
    """The parameter-server client as the trainer uses it, made restart-proof.

    Every call is retried with bounded backoff while the server is
    unreachable (restarting), and says so in the log. The queue's calls are
    idempotent (a retried Ack or a duplicate push is recognised), except a
    Take whose reply was lost: it may have been recorded, and nobody would
    acknowledge it, so before a Take is retried every open take but the ones
    the trainer holds goes back to the queue (``ReleaseTakes``). A Take also
    gives up once a preemption notice came: waiting for rollouts is a safe
    point (nothing of the step is trained yet; the takes left open are
    returned to the queue when the trainer resumes).
    """

    def __init__(self, client: Any, preemption: Preemption, retry_s: float = 300.0):
        self._client, self._preemption, self.retry_s = client, preemption, retry_s
        self._held: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _retry(self, what: str, fn, on_retry=None) -> Any:
        delay, deadline, retried = 0.2, time.monotonic() + self.retry_s, False
        while True:
            try:
                if retried and on_retry is not None:
                    on_retry()
                return fn()
            except grpc.RpcError as err:
                if err.code() in _RECONNECT and self._preemption.requested:
                    # The server is gone too (the machine is being taken): stop now.
                    if what == "Take":  # nothing of the step trained yet: a safe point
                        raise Preempted("stopped while waiting for rollouts") from err
                    raise LostStep(f"{what} failed after the notice ({err.code().name})") from err
                if err.code() not in _RECONNECT or time.monotonic() > deadline:
                    if retried and err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                        raise _AlreadyDone from err
                    raise
                _log.warning(
                    "%s: parameter server unreachable (%s); reconnecting in %.1fs",
                    what, err.code().name, delay,
                )  # fmt: skip
                time.sleep(delay)
                delay, retried = min(2 * delay, 5.0), True

    def stat(self) -> Any:
        return self._retry("Stat", self._client.stat)

    def take(self, *args: Any, **kwargs: Any) -> Any:
        if self._preemption.requested:
            raise Preempted("stopped while waiting for rollouts")
        release = lambda: recovery.release_takes(self._client, keep=self._held)
        take_id, groups, stale = self._retry(
            "Take", lambda: self._client.take(*args, **kwargs), on_retry=release
        )
        if groups:
            self._held.append(take_id)
        return take_id, groups, stale

    def ack(self, take_id: str) -> int:
        consumed = self._retry("Ack", lambda: self._client.ack(take_id))
        if take_id in self._held:
            self._held.remove(take_id)
        return consumed

    def push(self, plan: Any, tree: Any, version: int) -> Any:
        try:
            return self._retry("Push", lambda: self._client.push(plan, tree, version))
        except _AlreadyDone:  # an earlier try got through before the connection broke
            if self._client.stat().version >= version:
                return pb.PushReply(version=version, committed=True)
            raise

    def push_part(self, header: Any, pieces: Any) -> Any:
        """One trainer process's part of a version, retried like :meth:`push`.

        A retry sends the same ``push_id``, so a part that got through is
        answered as a duplicate.
        """
        pieces = list(pieces)  # views into one buffer: a retry sends them again
        try:
            return self._retry("Push", lambda: self._client.push_part(header, iter(pieces)))
        except _AlreadyDone:  # the version was committed meanwhile: our part had arrived
            if self._client.stat().version >= header.version:
                return pb.PushReply(version=header.version, duplicate=True)
            raise


class LostStep(Preempted):
    """After a notice the server went away mid-step: stop without saving; the step is redone."""


class _AlreadyDone(Exception):
    """A retried call was refused as already done (FAILED_PRECONDITION after a retry)."""


class Counted:
    """An iterator that counts what was drawn from it (the inline source's data position)."""

    def __init__(self, items: Any, drawn: int = 0):
        self._items, self.drawn = iter(items), drawn

    def __iter__(self) -> Counted:
        return self

    def __next__(self) -> Any:
        item = next(self._items)
        self.drawn += 1
        return item


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
                self._first, step, n, self.names, self._stale,
            )  # fmt: skip


class TrainingRun:
    """The trainer loop's state between steps: what a checkpoint saves and a resume restores."""

    def __init__(self, run_dir, trainer, source, ckpt, preemption, restored, deterministic, seed,
                 train_step: Callable[..., dict]):  # fmt: skip
        self.train_step = train_step
        self.run_dir, self.trainer, self.source = run_dir, trainer, source
        self.ckpt, self.preemption = ckpt, preemption
        self.deterministic, self.seed = deterministic, seed
        meta = restored.meta if restored is not None else {}
        self.restored = restored
        self.step = restored.step if restored is not None else 0
        self._saved_step = restored.step if restored is not None else None
        self.version_offset = int(meta.get("version_offset", 0))
        self.eval_before = meta.get("eval_before")
        self.lead = distributed.is_lead()  # process 0 of the trainer (always, with one process)
        # Every process keeps the rows (the same on each); process 0 writes the file.
        self.log = MetricsLog(run_dir / "metrics.jsonl" if self.lead else pathlib.Path(os.devnull))
        self.empty_steps = EmptyStepWatch(source.curation)
        self.remote = isinstance(source, RemoteRollouts)
        if self.remote:
            source.client = TrainerClient(source.client, preemption)
        else:
            source.prompts = Counted(source.prompts)

    @property
    def version(self) -> int:
        return self.trainer.state.step + self.version_offset

    def resume(self) -> None:
        """Continues the metrics log, the data position and the served weights."""
        self._check_same_source()
        self._continue_metrics()
        if self.restored is not None:
            for f, state in zip(self.source.curation, self.restored.meta.get("curation", [])):
                if state is not None:
                    f.load_state_dict(state)
        if not self.remote:
            self._fast_forward_inline()
            self.source.publish(self.trainer.state.params, self.version)
            return
        restored_version = self.version
        served, new_version, back = distributed.run_on_lead(
            lambda: self._roll_back_queue(restored_version)
        )
        self.version_offset += new_version - restored_version
        if served != new_version:
            self.source.publish(self.trainer.state.params, new_version)
        if self.restored is not None:
            print(
                f"weight version {new_version} published (server had {served}); "
                f"{back['unconsumed']} consumed and {back['untaken']} taken prompts returned "
                "to the queue",
                flush=True,
            )

    def _check_same_source(self) -> None:
        """ConfigError if the checkpoint's data position belongs to the other kind of source.

        An inline run records how many prompts it drew; a run fed by a parameter
        server keeps its position in the server's queue. Neither can continue the other.
        """
        data = (self.restored.meta.get("data") or {}) if self.restored is not None else {}
        made_inline, made_remote = "drawn" in data, "consumed" in data
        if (self.remote and made_inline) or (not self.remote and made_remote):
            how = ("--role inline (an in-process sampler)" if made_inline
                   else "a parameter server and workers (--role all, or trainer)")  # fmt: skip
            raise ConfigError(
                f"{self.run_dir}: its checkpoint at step {self.step} was trained with {how}; "
                "resume it the same way"
            )

    def _roll_back_queue(self, restored_version: int) -> tuple[int, int, dict]:
        """(served version, the version to publish, what went back to the queue); process 0."""
        served = self.source.client.stat().version
        # Versions only grow: if a lost trainer published past our checkpoint, skip past it.
        new_version = restored_version if served <= restored_version else served + 1
        back = recovery.resume_trainer(
            self.source.client._client,  # the plain client
            restored_version=restored_version, new_version=new_version,
        )  # fmt: skip
        return served, new_version, back

    def _continue_metrics(self) -> None:
        path = self.log.path
        if not self.lead or not path.exists():  # process 0 keeps the file
            return
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        kept = [r for r in rows if r.get("step", 0) <= self.step]  # steps 1..k are in the state
        if len(kept) != len(rows):
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
            tmp.replace(path)
        self.log.rows = kept

    def _fast_forward_inline(self) -> None:
        """Inline source: skip the prompts the restored steps drew, continue its seeds."""
        if self.restored is None:
            return
        meta, source = self.restored.meta, self.source
        drawn = int(meta["data"]["drawn"])
        source.prompts = Counted(itertools.islice(source.prompts, drawn, None), drawn)
        source._step = int(meta["rng"]["sampler_step"])  # its sampling-seed counter

    def loop(self, steps: int, hook, progress: bool, **step_args) -> None:
        # Steps are numbered from 1: step k is the k-th update, after which trainer.state.step
        # == k. The hooks, metrics.jsonl, checkpoints and the bar all use that number.
        bar = tqdm(range(self.step + 1, steps + 1), desc="rl",
                   disable=not (progress and self.lead), initial=self.step, total=steps)  # fmt: skip
        if self._agree(None, None)[1]:
            self._stop()
        for step in bar:
            lost = None
            try:
                metrics = self.train_step(
                    step, self.source, self.trainer, version_offset=self.version_offset,
                    deterministic=self.deterministic, **step_args,
                )  # fmt: skip
            except LostStep as err:  # the state holds half a step: keep the last checkpoint
                metrics, lost = None, str(err)
            except Preempted as err:  # on every process: process 0 stopped waiting for rollouts
                if not self.preemption.requested:
                    self.preemption.notify(f"trainer process 0: {err}")
                self._stop()
            lost, stop, metrics = self._agree(lost, metrics)
            if lost is not None:
                print(f"rlax: trainer: {lost}; step {step} is redone after the restart",
                      flush=True)  # fmt: skip
                self.ckpt.wait()
                self.preemption.stop_now()
            self.step = step
            # The save started a step ago must be complete before this step counts, so a
            # crash never redoes more than checkpoint_every steps (it rarely has to wait).
            self.ckpt.wait()
            self.log.write(metrics)
            if self.lead:
                bar.set_postfix(
                    reward=f"{metrics['reward']:.2f}", kl=f"{metrics.get('kl_old', 0):.1e}",
                    refresh=False,
                )  # fmt: skip
                hook.rlax_on_step_end(step=step, metrics=metrics)
                self.empty_steps.see(step, metrics)
                hook.rlax_on_weights_published(version=self.version)
            if self.ckpt.due(self.step) or self.step == steps or stop:
                self.save()
            self.ckpt.poll()
            if stop:
                self._stop()

    def _agree(self, lost: str | None, metrics: dict | None) -> tuple[str | None, bool, Any]:
        """(why a step was lost, whether to stop, the step's metrics), the same on every process.

        With several processes a notice reaches one of them, or all at
        different moments; they exchange what each saw at this step boundary
        (one small all-gather), so all checkpoint and stop after the same
        step, and all keep process 0's metrics (its timings and the queue's
        figures). A process that learns of another's notice records it as its own.
        """
        notice = self.preemption.reason if self.preemption.requested else None
        if not self.lead:
            metrics = None  # process 0's are the ones kept
        everyone = distributed.allgather_objects((lost, notice, metrics))
        lost = next((f"trainer process {i}: {x}" if i else x
                     for i, (x, _, _) in enumerate(everyone) if x is not None), None)  # fmt: skip
        notice = next(((i, x) for i, (_, x, _) in enumerate(everyone) if x is not None), None)
        if notice is not None and not self.preemption.requested:
            self.preemption.notify(f"trainer process {notice[0]}: {notice[1]}")
        return lost, notice is not None or lost is not None, everyone[0][2]

    def save(self) -> float:
        """Checkpoints the whole state (every process: orbax writes each one's shards)."""
        if not self.lead:  # orbax writes process 0's metadata
            data: dict = {}
        elif self.remote:  # the queue keeps the data position; this is for the record
            try:
                data = {"consumed": self.source.client.stat().queue.consumed}
            except Preempted:  # the server is gone after a notice
                data = {"consumed": None}
        else:
            data = {"drawn": self.source.prompts.drawn}
        meta = {
            "train_step": self.trainer.state.step,
            "version": self.version,
            "version_offset": self.version_offset,
            "data": data,
            "rng": {"seed": self.seed, "sampler_step": getattr(self.source, "_step", None)},
            # The trainer's own curation filters' state (a curriculum's history).
            "curation": [
                f.state_dict() if hasattr(f, "state_dict") else None for f in self.source.curation
            ],
            "eval_before": self.eval_before,
            "metrics_rows": len(self.log.rows),
            "deterministic": self.deterministic,
        }
        self._saved_step = self.step
        return self.ckpt.save(self.step, state_tree(self.trainer.state), meta)

    def _stop(self) -> None:
        """At a safe point after a notice: make sure the state is on disk, then stop."""
        if self._saved_step != self.step:
            self.save()
        self.ckpt.wait()
        self.preemption.stop_now()
