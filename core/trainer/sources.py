"""Where the trainer's batches come from and where its weights go: the rollout sources.

Both implement :class:`rlax.core.contracts.RolloutSource`, and the trainer
loop is the same for both. :class:`RemoteRollouts` is the parameter-server
system (docs/param_server.md): weights go to the parameter server, groups are
taken from its rollout queue under the staleness rule and acknowledged once
trained on. :class:`InlineRollouts` does the same in one process (a sampler
beside the trainer): for debugging and for tests that need the loop without
processes.

Each source owns its data position. The inline one records the prompts it
drew and its sampling-seed counter, and on resume skips those prompts and
continues the seeds; the remote one's position is the server's queue (its
consumed count is recorded for the record), and on resume it rolls the queue
back to the checkpoint (:mod:`rlax.core.param_server.queue.recovery`). A position
recorded by one kind is refused by the other (:func:`check_same_source`).

``next_batch`` returns one entry per prompt: a scored :class:`Group`, or a
:class:`DroppedGroup` (its rewards alone) for a group an online curation filter dropped.

With several trainer processes (docs/mesh.md) only process 0 calls
``next_batch``, ``done`` and ``position``; every process calls ``publish``,
and each pushes the shards it holds as its part of one multi-part version.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import jax

from rlax.core.contracts import Curriculum, Stateful
from rlax.core.errors import LostStep, Preempted, SourceMismatch
from rlax.core.models.lora import merged_state
from rlax.core.models.lora_wire import wire_tree
from rlax.core.parallel import multihost
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.queue import recovery
from rlax.core.rollout.groups import kept_by_filters, rollout
from rlax.core.rollout.probe import Probe
from rlax.core.trainer import publish_shards
from rlax.core.trainer.client import TrainerClient
from rlax.core.trainer.filling import Entry, extra_rounds, fill_batch
from rlax.core.trainer.queue_metrics import QueueMetrics, staleness_metrics
from rlax.core.types import Group, Prompt
from rlax.core.wire import WirePlan

# The key under which each kind of source records its position, and how a run of
# that kind is started (for the error when a run is resumed the other way).
MADE_WITH = {
    "drawn": "--role inline (an in-process sampler)",
    "consumed": "a parameter server and workers (--role all, or trainer)",
}


def check_same_source(position: dict[str, Any], key: str) -> None:
    """Raises SourceMismatch if ``position`` was recorded by a source other than ``key``'s."""
    for other, made_with in MADE_WITH.items():
        if other != key and other in position:
            raise SourceMismatch(made_with)


class Counted:
    """An iterator that counts what was drawn from it (the inline source's data position)."""

    def __init__(self, items: Iterable[Any], drawn: int = 0):
        self._items, self.drawn = iter(items), drawn

    def __iter__(self) -> Counted:
        return self

    def __next__(self) -> Any:
        item = next(self._items)
        self.drawn += 1
        return item

    def skip(self, n: int) -> None:
        """Skips the next ``n`` items (lazily: they are drawn when the next item is)."""
        self._items = itertools.islice(self._items, n, None)
        self.drawn += n


class _Curated:
    """The trainer's curation filters of a source, and their checkpointed state."""

    curation: list[Any]

    def curation_state(self) -> list[dict[str, Any] | None]:
        return [f.state_dict() if isinstance(f, Stateful) else None for f in self.curation]

    def load_curation_state(self, states: Sequence[dict[str, Any] | None]) -> None:
        for f, state in zip(self.curation, states):
            if state is not None and isinstance(f, Stateful):
                f.load_state_dict(state)


class _TimedReward:
    """A reward whose ``score`` calls are timed (the inline source's scoring time)."""

    def __init__(self, reward):
        self.reward, self.seconds = reward, 0.0

    def score(self, prompt, completion_text):
        start = time.perf_counter()
        try:
            return self.reward.score(prompt, completion_text)
        finally:
            self.seconds += time.perf_counter() - start


class InlineRollouts(_Curated):
    """Samples in the trainer's process; every group is on-policy.

    A batch is one round of sampling, or more when a curation filter asks for
    ``extra_rounds`` (DAPO's dynamic sampling): see :func:`fill_batch`. Its
    position is the prompts drawn from ``prompts`` and the number of rounds
    sampled (each round's sampler seed is ``seed * 1_000_003 + round``).
    """

    def __init__(
        self,
        prompts: Iterator[Prompt],
        sampler,
        reward,
        curation: Sequence[Any],
        *,
        group_size: int,
        prompts_per_step: int,
        seed: int,
    ):
        self.prompts, self.sampler, self.reward = Counted(prompts), sampler, reward
        self.curation = list(curation)
        self._curricula = [f for f in self.curation if isinstance(f, Curriculum)]
        self.extra_rounds = extra_rounds(self.curation)
        self.group_size, self.prompts_per_step, self.seed = group_size, prompts_per_step, seed
        self._round = 0  # rounds sampled so far: the sampler seeds' counter
        self._timed = _TimedReward(reward)

    def publish(self, params, version: int) -> dict[str, float]:
        self.sampler.load_weights(merged_state(params), version)  # LoRA: the merged weights
        return {}

    def next_batch(self, version: int) -> tuple[list[Entry], dict[str, float]]:
        self._timed = _TimedReward(self.reward)
        start = time.perf_counter()
        entries, info = fill_batch(
            self._sample_round, target=self.prompts_per_step, extra_rounds=self.extra_rounds
        )
        # Where the wait for rollouts went: sampling, and scoring (the reward's calls).
        info["score_s"] = self._timed.seconds
        info["generate_s"] = time.perf_counter() - start - self._timed.seconds
        return entries, info

    def _sample_round(self, n: int) -> list[Entry]:
        # A curriculum among the filters keeps retired prompts out.
        admitted = (p for p in self.prompts if all(f.admit([p]) for f in self._curricula))
        batch = list(itertools.islice(admitted, n))
        groups = rollout(
            batch, self.sampler, self._timed, self.group_size, self.seed * 1_000_003 + self._round
        )
        self._round += 1  # one sampler seed per round
        kept = kept_by_filters(groups, self.curation)
        return [g if keep else g.dropped() for g, keep in zip(groups, kept)]

    def done(self) -> None:
        pass

    def close(self) -> None:
        pass

    def position(self) -> dict[str, Any]:
        return {"drawn": self.prompts.drawn, "sampler_step": self._round}

    def restore(self, position: dict[str, Any]) -> None:
        """Skips the prompts the restored steps drew and continues their sampler seeds."""
        check_same_source(position, "drawn")
        self.prompts.skip(int(position["drawn"]) - self.prompts.drawn)
        self._round = int(position["sampler_step"])

    def resume(self, params, version: int) -> int:
        self.publish(params, version)
        return version


class RemoteRollouts(_Curated):
    """Pushes weights to and takes groups from the parameter server.

    Workers run the online curation filters before they submit; the trainer
    runs its own (``curation``) on what it takes as well, so a filter set only
    on the trainer still applies. When a filter asks for ``extra_rounds``
    (DAPO's dynamic sampling) the batch is filled by :func:`fill_batch`: a
    round is ``prompts_per_step`` more entries from the queue, ending early
    once the batch is full (the queue is a stream, so no surplus is taken).
    ``client`` is the trainer's restart-proof one (:class:`TrainerClient`), or
    a plain client where no retries are wanted (tests).

    A parameter server that keeps no saved weights
    (``rlax.param_server.saved_weights = 0``: the trainer's checkpoint has
    them) comes back from a restart serving none; when a wait for rollouts
    finds it behind the version the trainer published, the trainer publishes
    that version again (one process only: a multi-process trainer's push is
    collective, so it needs a server that keeps its weights).
    """

    def __init__(
        self,
        client: TrainerClient | ParamServerClient,
        plan: WirePlan,
        *,
        prompts_per_step: int,
        max_staleness: int,
        curation: Sequence[Any] = (),
        probe: Callable[[Any], Probe | None] | None = None,
    ):
        self.client, self.plan = client, plan
        # The weight-load check's probe of each published version (rlax.core.rollout.probe):
        # params -> Probe (None: versions are published without one).
        self.probe = probe
        self._probed: tuple[int, Probe | None] | None = None
        self.prompts_per_step, self.max_staleness = prompts_per_step, max_staleness
        self.curation = list(curation)
        self.extra_rounds = extra_rounds(self.curation)
        self._takes: list[str] = []
        self._kept = self._stale = 0
        self._restored = False
        self._queue_metrics = QueueMetrics()  # keeps the last Stat's summed worker seconds
        self._published: tuple[Any, int] | None = None  # the newest (params, version) pushed

    def publish(self, params, version: int) -> dict[str, float]:
        """Pushes ``params`` as ``version``; every trainer process calls it.

        One process pushes the whole tree; several push one part each (the
        shards they hold), and the server commits the version when the last
        part arrives.
        """
        self._published = (params, version)  # alive until the next step: only it donates them
        probe = self.probe_of(params, version)
        probed = time.perf_counter()
        params = wire_tree(params)  # LoRA: only the adapters (and the base they are for) travel
        if jax.process_count() == 1:
            # push streams host-resident leaves from their own memory; it packs only when needed.
            reply = self.client.push(self.plan, params, version, probe)
            if not reply.committed:
                raise RuntimeError(f"parameter server did not commit version {version}")
        else:
            self._push_part(params, version, probe)
        seconds = time.perf_counter() - probed  # the probe's forward is the publish phase's
        return {"weight_sync_s": seconds, "weight_sync_mb_s": self.plan.nbytes / 2**20 / seconds}

    def probe_of(self, params, version: int) -> Probe | None:
        """``version``'s probe (None: no probe is published), computed once per version
        (the in-process handoff offers the one that is pushed)."""
        if self.probe is None:
            return None
        if self._probed is None or self._probed[0] != version:
            self._probed = (version, self.probe(params))
        return self._probed[1]

    def _push_part(self, params, version: int, probe: Probe | None = None) -> None:
        """This process's part of ``version``; raises on every process if any part failed."""
        error: Exception | None = None
        try:
            reply = publish_shards.push_local_shards(
                self.client,
                params,
                version,
                wire_dtype=self.plan.wire_dtype.name,
                chunk_bytes=self.client.settings.chunk_mb << 20,
                probe=probe,
            )
            # The last part to arrive commits; a part retried after it got through is a duplicate.
            mine: tuple = ("ok", bool(reply.committed or reply.duplicate))
        except Preempted as err:  # the server went away after a notice
            error, mine = err, ("lost", str(err))
        except Exception as err:  # noqa: BLE001 -- every process must learn of it, then raise
            error, mine = err, ("error", f"{type(err).__name__}: {err}")
        outcomes = multihost.allgather_objects(mine)
        if error is not None:
            raise error
        for process, (kind, detail) in enumerate(outcomes):
            if kind != "ok":
                raise (LostStep if kind == "lost" else RuntimeError)(
                    f"trainer process {process} could not push its part of version {version}: "
                    f"{detail}"
                )
        if not any(done for _, done in outcomes):
            raise RuntimeError(f"parameter server did not commit version {version}")

    def next_batch(self, version: int) -> tuple[list[Entry], dict[str, float]]:
        self._kept = self._stale = 0
        start = time.perf_counter()
        entries, info = fill_batch(
            functools.partial(self._take_round, version),
            target=self.prompts_per_step,
            extra_rounds=self.extra_rounds,
        )
        info["take_wait_s"] = time.perf_counter() - start
        info["dropped_stale"] = self._stale
        info.update(staleness_metrics(entries, version, self.max_staleness))
        info.update(self._queue_metrics(self.client.stat().queue))
        return entries, info

    def _take_round(self, version: int, n: int) -> list[Entry]:
        """Takes ``n`` entries, or fewer once the batch holds ``prompts_per_step`` groups."""
        got: list[Entry] = []
        while len(got) < n and self._kept < self.prompts_per_step:
            # Refilling, take one group at a time: a dropped one is acknowledged at once, so
            # its room in the queue's capacity goes back to the workers for a replacement
            # (in synchronous mode the capacity is one batch: holding it would deadlock).
            take_id, taken, stale = self.client.take(
                1 if self.extra_rounds else n - len(got),
                current_version=version,
                max_staleness=self.max_staleness,
                wait_s=5.0,
            )
            self._stale += stale
            if not taken:
                self._republish_if_lost()
            taken = self._curate(taken)
            kept = sum(isinstance(e, Group) for e in taken)
            if kept:
                self._takes.append(take_id)
            elif taken:
                self.client.ack(take_id)  # nothing in it will be trained on
            self._kept += kept
            got.extend(taken)
        return got

    def _republish_if_lost(self) -> None:
        """Publishes the newest version again if the server came back without it."""
        if self._published is None:
            return
        params, version = self._published
        served = self.client.stat().version
        if served >= version:
            return
        if jax.process_count() > 1:
            raise RuntimeError(
                f"the parameter server serves version {served}, not {version}: it restarted "
                "without its weights, which a multi-process trainer cannot push again from one "
                "process; keep rlax.param_server.saved_weights >= 1"
            )
        print(
            f"parameter server restarted without weights (serving {served}); version "
            f"{version} published again",
            flush=True,
        )
        self.publish(params, version)

    def _curate(self, taken: list[Entry]) -> list[Entry]:
        """The trainer's own filters over the groups the workers kept."""
        groups = [e for e in taken if isinstance(e, Group)]
        keep = {id(g): k for g, k in zip(groups, kept_by_filters(groups, self.curation))}
        return [e.dropped() if isinstance(e, Group) and not keep[id(e)] else e for e in taken]

    def done(self) -> None:
        """Acknowledges the batch the trainer just trained on (after its new weights were pushed)."""
        for take_id in self._takes:
            self.client.ack(take_id)
        self._takes = []

    def close(self) -> None:
        self.client.close()

    def position(self) -> dict[str, Any]:
        """The queue's consumed count: for the record (the queue keeps the position itself)."""
        try:
            return {"consumed": self.client.stat().queue.consumed}
        except Preempted:  # the server is gone after a notice
            return {"consumed": None}

    def restore(self, position: dict[str, Any]) -> None:
        check_same_source(position, "consumed")
        self._restored = True

    def resume(self, params, version: int) -> int:
        """Rolls the server's queue back to the checkpoint and publishes the weights.

        Versions only grow: if a lost trainer published past our checkpoint,
        the restored weights are published as the next version after the
        served one. Process 0 talks to the queue; every process publishes.
        """
        served, new_version, back = multihost.run_on_lead(lambda: self._roll_back_queue(version))
        if served != new_version:
            self.publish(params, new_version)
        else:
            self._published = (params, new_version)
        if self._restored:
            print(
                f"weight version {new_version} published (server had {served}); "
                f"{back['unconsumed']} consumed and {back['untaken']} taken prompts returned "
                "to the queue",
                flush=True,
            )
        return new_version

    def _roll_back_queue(self, restored_version: int) -> tuple[int, int, dict]:
        """(served version, the version to publish, what went back to the queue); process 0."""
        served = self.client.stat().version
        new_version = restored_version if served <= restored_version else served + 1
        back = recovery.resume_trainer(
            self.client, restored_version=restored_version, new_version=new_version
        )
        return served, new_version, back
