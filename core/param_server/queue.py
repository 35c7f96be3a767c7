"""The RolloutQueue service: prompt leases, submitted groups, takes and acks.

Every prompt is in exactly one place: the pool (waiting), a lease (a worker
is generating), the queue (a scored group waits for the trainer), a take (the
trainer is training on it) or consumed (acknowledged). Capacity bounds
leases + queue + takes together, so producers wait at ``Lease`` when the
trainer falls behind — nothing is ever dropped to make room. An expired
lease returns its prompt to the front of the pool; a group too stale for the
trainer's rule is dropped, counted, and its prompt returns to the pool too.
With capacity = one batch and ``max_staleness = 0`` this is synchronous
on-policy RL; larger capacity lets workers run ahead.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

import grpc
import numpy as np

from rlax.core.param_server import codec
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.types import Prompt


class QueueError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass
class _Lease:
    prompt: Prompt
    worker: str
    expires: float


class RolloutQueue:
    """State and logic of the RolloutQueue service (the gRPC glue is in server.py)."""

    def __init__(
        self,
        prompts: Iterator[Prompt],
        *,
        capacity: int,
        lease_ttl_s: float,
        max_completions: int = 1024,
        max_tokens: int = 1 << 16,
        version_fn=lambda: 0,
        curricula: Sequence = (),
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
        self._leases: dict[str, _Lease] = {}
        self._queue: collections.deque[pb.GroupMsg] = collections.deque()
        self._taken: dict[str, list[pb.GroupMsg]] = {}
        # Lease ids submitted and not yet acknowledged (a retried Submit is a no-op),
        # and recent take ids (a retried Ack is a no-op): both bounded, so memory stays flat.
        self._submitted: set[str] = set()
        self._acked: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._workers: dict[str, tuple[float, float, int, int]] = {}
        self.counts = collections.Counter()

    # -- helpers (hold the lock) --------------------------------------------

    def _in_flight(self) -> int:
        return len(self._leases) + len(self._queue) + sum(len(t) for t in self._taken.values())

    def _expire(self) -> None:
        now = time.monotonic()
        for lease_id in [k for k, v in self._leases.items() if v.expires <= now]:
            self._pool.appendleft(self._leases.pop(lease_id).prompt)
            self.counts["expired_leases"] += 1
            self._cv.notify_all()

    def _next_prompt(self) -> Prompt:
        if self._pool:
            return self._pool.popleft()
        for _ in range(100_000):
            self.counts["cursor"] += 1
            prompt = next(self._source)
            if all(c.admit([prompt]) for c in self._curricula):
                return prompt
            self.counts["retired_skipped"] += 1
        raise QueueError(grpc.StatusCode.RESOURCE_EXHAUSTED, "the curriculum retired every prompt")

    def _wait(self, ready, wait_s: float) -> bool:
        deadline = time.monotonic() + max(0.0, min(wait_s, 600.0))
        while not ready():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._cv.wait(min(remaining, 0.5))  # wake up to expire leases
            self._expire()
        return True

    # -- the four calls -----------------------------------------------------

    def lease(self, req: pb.LeaseRequest) -> pb.LeaseReply:
        if not 0 < req.max_prompts <= 65536:
            raise QueueError(
                grpc.StatusCode.INVALID_ARGUMENT, f"max_prompts {req.max_prompts} out of range"
            )
        with self._cv:
            self._workers[req.worker] = (
                req.idle_s,
                req.busy_s,
                req.reward_errors,
                req.reward_timeouts,
            )
            self._expire()
            self._wait(lambda: self._in_flight() < self.capacity, req.wait_s)
            n = min(req.max_prompts, self.capacity - self._in_flight())
            reply = pb.LeaseReply()
            expires = time.monotonic() + self.lease_ttl_s
            for _ in range(max(0, n)):
                prompt = self._next_prompt()
                lease_id = uuid.uuid4().hex
                self._leases[lease_id] = _Lease(prompt, req.worker, expires)
                reply.leases.append(
                    pb.Lease(
                        lease_id=lease_id,
                        prompt=codec.prompt_to_msg(prompt),
                        ttl_s=self.lease_ttl_s,
                    )
                )
            return reply

    def submit(self, req: pb.SubmitRequest) -> pb.SubmitReply:
        group = req.group
        with self._cv:
            if group.lease_id in self._submitted:
                return pb.SubmitReply(duplicate=True)
            self._expire()
            lease = self._leases.get(group.lease_id)
            if lease is None:
                raise QueueError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"lease {group.lease_id[:12]!r} is unknown or expired (its prompt was handed out again)",
                )
            if lease.prompt.id != group.prompt.id:
                raise QueueError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"lease {group.lease_id[:12]!r} is for prompt {lease.prompt.id!r}, not {group.prompt.id!r}",
                )
            try:
                codec.check_group(
                    group, max_completions=self.max_completions, max_tokens=self.max_tokens,
                    newest_version=self._version(),
                )  # fmt: skip
            except codec.WireError as err:
                raise QueueError(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None
            del self._leases[group.lease_id]
            for c in self._curricula:
                c.observe(group.prompt.id, np.asarray(group.rewards, np.float32))
            self._submitted.add(group.lease_id)
            self._queue.append(group)
            self.counts["filtered" if group.filtered else "submitted"] += 1
            self._cv.notify_all()
            return pb.SubmitReply()

    def take(self, req: pb.TakeRequest) -> pb.TakeReply:
        if not 0 < req.max_groups <= 65536 or req.max_staleness < 0:
            raise QueueError(
                grpc.StatusCode.INVALID_ARGUMENT, "max_groups or max_staleness out of range"
            )
        with self._cv:
            self._wait(lambda: len(self._queue) >= req.max_groups, req.wait_s)
            reply = pb.TakeReply(take_id=uuid.uuid4().hex)
            taken = []
            while self._queue and len(taken) < req.max_groups:
                group = self._queue.popleft()
                oldest = min(
                    (c.policy_version for c in group.completions), default=req.current_version
                )
                if not group.filtered and req.current_version - oldest > req.max_staleness:
                    self._pool.appendleft(codec.msg_to_prompt(group.prompt))
                    self._submitted.discard(group.lease_id)
                    reply.dropped_stale += 1
                    continue
                taken.append(group)
            self.counts["dropped_stale"] += reply.dropped_stale
            if taken:
                self._taken[reply.take_id] = taken
                reply.groups.extend(taken)
            self._cv.notify_all()
            return reply

    def ack(self, req: pb.AckRequest) -> pb.AckReply:
        with self._cv:
            if req.take_id in self._acked:
                return pb.AckReply(duplicate=True)
            taken = self._taken.pop(req.take_id, None)
            if taken is None:
                raise QueueError(
                    grpc.StatusCode.NOT_FOUND, f"no take {req.take_id[:12]!r} to acknowledge"
                )
            self._acked[req.take_id] = None
            while len(self._acked) > 4096:
                self._acked.popitem(last=False)
            self._submitted.difference_update(g.lease_id for g in taken)
            self.counts["consumed"] += len(taken)
            self._cv.notify_all()
            return pb.AckReply(consumed=len(taken))

    def stats(self) -> pb.QueueStats:
        with self._cv:
            self._expire()
            reports = list(self._workers.values()) or [(0.0, 0.0, 0, 0)]
            idle, busy, reward_errors, reward_timeouts = (sum(x) for x in zip(*reports))
            return pb.QueueStats(
                pool=len(self._pool),
                leased=len(self._leases),
                queued=len(self._queue),
                taken=sum(len(t) for t in self._taken.values()),
                capacity=self.capacity,
                cursor=self.counts["cursor"],
                consumed=self.counts["consumed"],
                expired_leases=self.counts["expired_leases"],
                dropped_stale=self.counts["dropped_stale"],
                filtered=self.counts["filtered"],
                retired_skipped=self.counts["retired_skipped"],
                worker_idle_s=idle,
                worker_busy_s=busy,
                reward_errors=int(reward_errors),
                reward_timeouts=int(reward_timeouts),
            )
