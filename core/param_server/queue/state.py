"""The rollout queue's state: where every prompt is, in memory and on disk.

Every prompt is in exactly one place: the pool (waiting), a lease (a worker
is generating), the queue (a scored group waits for the trainer), a take (the
trainer is training on it) or consumed (acknowledged). :class:`QueueState`
holds those places, the lock and condition every call waits on, and the
helpers that move a prompt between them under that lock (return it to the
pool, expire leases, draw the next prompt past the curricula).

With a database (``db``, :mod:`rlax.core.param_server.queue.store`) every call
that changes state is one SQLite transaction (:meth:`QueueState._tx`), and a
queue built on an existing database resumes where the last one stopped: the
data cursor (the task's prompts are drawn again up to it and checked), the
returned prompts, the leases (with a fresh time to live), the submitted
groups, the takes and the consumed log, the partial work, and the curricula's state.

Partial work (a preempted worker's unfinished rows, ``SubmitPartial``) is
not a place but an attachment: it belongs to a prompt id, whichever place
that prompt is in (the pool, then a lease that continues it), until a group
for that prompt is submitted. The last partial work handed in for a prompt
replaces the one before (it continued from it), and one with no token at all
leaves the earlier one attached.

The calls that change it are :class:`rlax.core.param_server.queue.service.RolloutQueue`'s.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Sequence

import grpc

from rlax.core.contracts import Curriculum, Stateful
from rlax.core.param_server import codec
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.queue.store import QueueDB, QueueDBError
from rlax.core.types import Prompt

log = logging.getLogger("rlax.queue")


class QueueError(Exception):
    """A queue call refused with gRPC status ``code`` (the server answers with it)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass
class Lease:
    """A prompt a worker is generating for, until ``expires`` (monotonic seconds)."""

    prompt: Prompt
    worker: str
    expires: float


class QueueState:
    """The places a prompt can be, their database mirror and the lock over both.

    Args:
      prompts: the task's prompts, drawn in order (and drawn again on restore).
      capacity: bound on leases + queue + takes together.
      lease_ttl_s: a lease's time to live.
      max_completions / max_tokens: the largest group a Submit may carry.
      version_fn: the newest weight version (a group from a newer one is refused).
      curricula: prompt curricula (``admit``, ``observe``); a retired prompt is
        never leased.
      db: the queue's database; None keeps nothing.
    """

    def __init__(
        self,
        prompts: Iterator[Prompt],
        *,
        capacity: int,
        lease_ttl_s: float,
        max_completions: int = 1024,
        max_tokens: int = 1 << 16,
        version_fn=lambda: 0,
        curricula: Sequence[Curriculum] = (),
        db: QueueDB | None = None,
    ):
        if capacity < 1 or lease_ttl_s <= 0:
            raise ValueError(
                f"rollout queue: need capacity >= 1 and lease_ttl_s > 0, got {capacity}, {lease_ttl_s}"
            )
        self._source = prompts
        # Prompt curricula (``admit(prompts)``, ``observe(prompt_id, rewards)``) live
        # here, where every worker's results meet: a retired prompt is never leased.
        self._curricula = list(curricula)
        self.capacity = capacity
        self.lease_ttl_s = lease_ttl_s
        self.max_completions = max_completions
        self.max_tokens = max_tokens
        self._version = version_fn
        self._cv = threading.Condition()
        self._pool: collections.deque[Prompt] = collections.deque()
        self._leases: dict[str, Lease] = {}
        self._queue: collections.deque[pb.GroupMsg] = collections.deque()
        self._taken: dict[str, list[pb.GroupMsg]] = {}
        # Lease ids submitted and not yet acknowledged (a retried Submit is a no-op),
        # and recent take ids (a retried Ack is a no-op): both bounded, so memory stays flat.
        self._submitted: set[str] = set()
        self._acked: collections.OrderedDict[str, None] = collections.OrderedDict()
        # Each worker's last report: idle, busy, reward errors, timeouts, generate, score.
        self._workers: dict[str, tuple[float, float, int, int, float, float, int]] = {}
        self._take_versions: dict[str, int] = {}
        # Partial work by prompt id, and the lease ids a SubmitPartial ended (recent ones,
        # bounded: a retried SubmitPartial is a no-op, a Submit on them is refused).
        self._partials: dict[str, pb.SubmitPartialRequest] = {}
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.version_floor: int = 0  # groups from older weights are dropped (set by resume_trainer)
        self.counts: collections.Counter[str] = collections.Counter()
        self._db = db
        self._closed = False
        if db is not None:
            self._restore(db)

    # -- persistence ----------------------------------------------------------

    def _tx(self):
        if self._closed:
            # A call still running as the server stops: nothing it does may be acknowledged
            # without being on disk, and UNAVAILABLE makes the client retry after the restart.
            raise QueueError(grpc.StatusCode.UNAVAILABLE, "the rollout queue is shutting down")
        return self._db.transaction() if self._db is not None else contextlib.nullcontext()

    def close(self) -> None:
        """Closes the database; calls still running after this fail with UNAVAILABLE."""
        with self._cv:
            self._closed = True
            if self._db is not None:
                self._db.close()
            self._cv.notify_all()

    def _save_counts(self) -> None:
        if self._db is not None:
            self._db.set_meta("counts", dict(self.counts))
            self._db.set_meta("version_floor", self.version_floor)

    def _save_curricula(self) -> None:
        if self._db is not None and self._curricula:
            self._db.set_meta(
                "curricula",
                [c.state_dict() if isinstance(c, Stateful) else None for c in self._curricula],
            )

    def _restore(self, db: QueueDB) -> None:
        """Rebuilds the in-memory state from ``db`` (empty: a fresh queue)."""
        self.counts.update(db.load_meta("counts", {}))
        self.version_floor = db.load_meta("version_floor", 0)
        for c, state in zip(self._curricula, db.load_meta("curricula", [])):
            if state is not None and isinstance(c, Stateful):
                c.load_state_dict(state)
        last = db.load_meta("last_drawn")
        for i in range(self.counts["cursor"]):
            prompt = next(self._source)
            if i == self.counts["cursor"] - 1 and last is not None and prompt.id != last:
                raise QueueDBError(
                    f"{db.path}: the task's prompt #{i} is {prompt.id!r}, but the saved queue "
                    f"drew {last!r} there (a different task or seed?); the database was left "
                    "as it is"
                )
        self._pool.extend(prompt_from_bytes(b) for b in db.pool())
        expires = time.monotonic() + self.lease_ttl_s
        for lease_id, worker, prompt_bytes in db.leases():
            self._leases[lease_id] = Lease(prompt_from_bytes(prompt_bytes), worker, expires)
        self._queue.extend(pb.GroupMsg.FromString(g) for g in db.queued())
        for take_id, (version, groups) in db.takes().items():
            self._taken[take_id] = [pb.GroupMsg.FromString(g) for g in groups]
            self._take_versions[take_id] = version
        self._submitted.update(g.lease_id for g in self._queue)
        self._submitted.update(g.lease_id for t in self._taken.values() for g in t)
        self._acked.update((t, None) for t in db.recent_take_ids(4096))
        for blob in db.partials():
            partial = pb.SubmitPartialRequest.FromString(blob)
            self._partials[partial.prompt_id] = partial
            self._ended[partial.lease_id] = None
        if self.counts["cursor"]:
            log.info(
                "rollout queue restored from %s: cursor %d, %d returned, %d leased, %d queued, "
                "%d taken, %d consumed",
                db.path,
                self.counts["cursor"],
                len(self._pool),
                len(self._leases),
                len(self._queue),
                self._n_taken(),
                self.counts["consumed"],
            )

    # -- helpers (hold the lock) --------------------------------------------

    def _n_taken(self) -> int:
        return sum(len(t) for t in self._taken.values())

    def _in_flight(self) -> int:
        return len(self._leases) + len(self._queue) + self._n_taken()

    def _return(self, prompt: Prompt) -> None:
        """Puts a prompt back at the front of the pool (served next)."""
        self._pool.appendleft(prompt)
        if self._db is not None:
            self._db.pool_push_front(prompt_bytes(prompt))

    def _attach(self, partial: pb.SubmitPartialRequest) -> None:
        """Attaches partial work to its prompt (replacing any earlier), recording its lease."""
        self._partials[partial.prompt_id] = partial
        self._end(partial.lease_id)
        if self._db is not None:
            self._db.partial_put(partial.prompt_id, partial.SerializeToString())

    def _end(self, lease_id: str) -> None:
        self._ended[lease_id] = None
        while len(self._ended) > 4096:
            self._ended.popitem(last=False)

    def _detach(self, prompt_id: str) -> None:
        if self._partials.pop(prompt_id, None) is not None and self._db is not None:
            self._db.partial_del(prompt_id)

    def _resume_rows(self, prompt: Prompt) -> list[pb.CompletionMsg]:
        """The partial work to hand out with ``prompt`` (kept attached until a group comes).

        Work with a token older than the version floor is dropped: its group
        could never be used (the prompt is generated afresh).
        """
        partial = self._partials.get(prompt.id)
        if partial is None:
            return []
        if _oldest(partial) < self.version_floor:
            self._detach(prompt.id)
            self.counts["partial_dropped"] += 1
            return []
        self.counts["partial_resumed"] += 1
        return list(partial.rows)

    def _drop_partials_below(self, floor: int) -> int:
        """Drops the partial work with a token older than ``floor``; returns how many."""
        old = [k for k, m in self._partials.items() if _oldest(m) < floor]
        for prompt_id in old:
            self._detach(prompt_id)
        self.counts["partial_dropped"] += len(old)
        return len(old)

    def _expire(self) -> None:
        now = time.monotonic()
        expired = [k for k, v in self._leases.items() if v.expires <= now]
        if not expired:
            return
        with self._tx():
            for lease_id in expired:
                self._return(self._leases.pop(lease_id).prompt)
                if self._db is not None:
                    self._db.lease_del(lease_id)
                self.counts["expired_leases"] += 1
            self._save_counts()
        self._cv.notify_all()

    def _next_prompt(self) -> Prompt:
        if self._pool:
            if self._db is not None:
                self._db.pool_pop_front()
            return self._pool.popleft()
        for _ in range(100_000):
            self.counts["cursor"] += 1
            prompt = next(self._source)
            if self._db is not None:
                self._db.set_meta("last_drawn", prompt.id)
            if all(c.admit([prompt]) for c in self._curricula):
                return prompt
            self.counts["retired_skipped"] += 1
        raise QueueError(grpc.StatusCode.RESOURCE_EXHAUSTED, "the curriculum retired every prompt")

    def _wait(self, ready, wait_s: float) -> bool:
        deadline = time.monotonic() + max(0.0, min(wait_s, 600.0))
        while not ready():
            if self._closed:
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._cv.wait(min(remaining, 0.5))  # wake up to expire leases
            self._expire()
        return True


def _oldest(partial: pb.SubmitPartialRequest) -> int:
    """The oldest weight version among partial work's tokens (rows not yet started have none)."""
    return min((codec.version_range(c)[0] for c in partial.rows if c.tokens), default=1 << 62)


def prompt_bytes(prompt: Prompt) -> bytes:
    """A prompt as the database stores it (a serialised PromptMsg)."""
    return codec.prompt_to_msg(prompt).SerializeToString()


def prompt_from_bytes(blob: bytes) -> Prompt:
    """The inverse of :func:`prompt_bytes`."""
    return codec.msg_to_prompt(pb.PromptMsg.FromString(blob))
