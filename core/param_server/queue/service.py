"""The RolloutQueue service: prompt leases, submitted groups, takes and acks.

Each call is one transaction over :class:`~rlax.core.param_server.queue.state.QueueState`
(where every prompt is, in memory and on disk). Capacity bounds leases + queue
+ takes together, so producers wait at ``Lease`` when the trainer falls
behind — nothing is ever dropped to make room. An expired lease returns its
prompt to the front of the pool; a group too stale for the trainer's rule is
dropped, counted, and its prompt returns to the pool too. With capacity = one
batch and ``max_staleness = 0`` this is synchronous on-policy RL; larger
capacity lets workers run ahead.

A preempted worker hands its unfinished rows in with ``SubmitPartial``: that
ends the lease, the prompt goes back to the front of the pool with the rows
attached, and the next Lease of it carries them, to be continued instead of
generated again. Partial work never becomes a group by itself, and its rows
keep the versions of their tokens: the trainer's staleness rule judges the
finished group by its oldest token.

A restarted trainer calls :meth:`RolloutQueue.resume_trainer`: prompts
consumed after its checkpoint and prompts it had taken are served again, and
groups (and partial work) from weight versions older than its new one are
dropped.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence

import grpc
import numpy as np

from rlax.core.param_server import codec
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.queue.state import (
    Lease,
    QueueError,
    QueueState,
    prompt_from_bytes,
)

log = logging.getLogger("rlax.queue")


class RolloutQueue(QueueState):
    """State and logic of the RolloutQueue service (the gRPC glue is in server.py)."""

    # -- the calls ------------------------------------------------------------

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
                req.generate_s,
                req.score_s,
                req.probe_refused,
            )
            self._expire()
            self._wait(lambda: self._in_flight() < self.capacity, req.wait_s)
            n = min(req.max_prompts, self.capacity - self._in_flight())
            reply = pb.LeaseReply()
            expires = time.monotonic() + self.lease_ttl_s
            with self._tx():
                for _ in range(max(0, n)):
                    prompt = self._next_prompt()
                    lease_id = uuid.uuid4().hex
                    self._leases[lease_id] = Lease(prompt, req.worker, expires)
                    msg = codec.prompt_to_msg(prompt)
                    if self._db is not None:
                        self._db.lease_add(lease_id, req.worker, msg.SerializeToString())
                    reply.leases.append(
                        pb.Lease(
                            lease_id=lease_id,
                            prompt=msg,
                            ttl_s=self.lease_ttl_s,
                            partial=self._resume_rows(prompt),
                        )
                    )
                self._save_counts()
            return reply

    def submit(self, req: pb.SubmitRequest) -> pb.SubmitReply:
        group = req.group
        with self._cv:
            if group.lease_id in self._submitted:
                return pb.SubmitReply(duplicate=True)
            self._live_lease(group.lease_id, group.prompt.id)
            try:
                codec.check_group(
                    group,
                    max_completions=self.max_completions,
                    max_tokens=self.max_tokens,
                    newest_version=self._version(),
                )
            except codec.WireError as err:
                raise QueueError(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None
            with self._tx():
                del self._leases[group.lease_id]
                for c in self._curricula:
                    c.observe(group.prompt.id, np.asarray(group.rewards, np.float32))
                self._submitted.add(group.lease_id)
                self._detach(group.prompt.id)  # the group supersedes any partial work
                self._queue.append(group)
                self.counts["filtered" if group.filtered else "submitted"] += 1
                if self._db is not None:
                    self._db.lease_del(group.lease_id)
                    self._db.queued_push(group.SerializeToString())
                    self._save_counts()
                    self._save_curricula()
            self._cv.notify_all()
            return pb.SubmitReply()

    def submit_partial(self, req: pb.SubmitPartialRequest) -> pb.SubmitReply:
        """Ends a lease with its partial work: the prompt is the next one leased, with it."""
        with self._cv:
            if req.lease_id in self._ended:
                return pb.SubmitReply(duplicate=True)
            lease = self._live_lease(req.lease_id, req.prompt_id)
            earlier = self._partials.get(req.prompt_id)
            try:
                codec.check_partial(
                    req,
                    rows=len(earlier.rows) if earlier else None,
                    max_completions=self.max_completions,
                    max_tokens=self.max_tokens,
                    newest_version=self._version(),
                )
            except codec.WireError as err:
                raise QueueError(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None
            tokens = sum(len(c.tokens) // 4 for c in req.rows)
            with self._tx():
                del self._leases[req.lease_id]
                if self._db is not None:
                    self._db.lease_del(req.lease_id)
                self._return(lease.prompt)
                if tokens:
                    self._attach(req)
                else:  # nothing new: the earlier partial work, if any, stays attached
                    self._end(req.lease_id)
                self.counts["partial_submitted"] += 1
                self.counts["partial_tokens"] += tokens
                self._save_counts()
            self._cv.notify_all()
            return pb.SubmitReply()

    def _live_lease(self, lease_id: str, prompt_id: str) -> Lease:
        """The unexpired lease ``lease_id`` of ``prompt_id``, or the QueueError to answer."""
        self._expire()
        lease = self._leases.get(lease_id)
        if lease is None:
            ended = (
                "ended with its partial work"
                if lease_id in self._ended
                else "already fulfilled"
                if lease_id in self._submitted
                else "unknown or expired"
            )
            raise QueueError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"lease {lease_id[:12]!r} is {ended} (its prompt was handed out again)",
            )
        if lease.prompt.id != prompt_id:
            raise QueueError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"lease {lease_id[:12]!r} is for prompt {lease.prompt.id!r}, not {prompt_id!r}",
            )
        return lease

    def take(self, req: pb.TakeRequest) -> pb.TakeReply:
        if not 0 < req.max_groups <= 65536 or req.max_staleness < 0:
            raise QueueError(
                grpc.StatusCode.INVALID_ARGUMENT, "max_groups or max_staleness out of range"
            )
        with self._cv:
            self._wait(lambda: len(self._queue) >= req.max_groups, req.wait_s)
            reply = pb.TakeReply(take_id=uuid.uuid4().hex)
            taken: list[pb.GroupMsg] = []
            with self._tx():
                while self._queue and len(taken) < req.max_groups:
                    group = self._queue.popleft()
                    if self._db is not None:
                        self._db.queued_pop_front()
                    if not group.filtered and not self._usable(group, req):
                        self._return(codec.msg_to_prompt(group.prompt))
                        self._submitted.discard(group.lease_id)
                        reply.dropped_stale += 1
                        continue
                    taken.append(group)
                self.counts["dropped_stale"] += reply.dropped_stale
                if taken:
                    self._taken[reply.take_id] = taken
                    self._take_versions[reply.take_id] = req.current_version
                    reply.groups.extend(taken)
                    if self._db is not None:
                        self._db.take_add(
                            reply.take_id,
                            req.current_version,
                            [g.SerializeToString() for g in taken],
                        )
                self._save_counts()
            self._cv.notify_all()
            return reply

    def _usable(self, group: pb.GroupMsg, req: pb.TakeRequest) -> bool:
        """The staleness rule, plus: no weights older than the floor, none from the future.

        A completion is as old as its oldest token (weights loaded between
        decode steps give its tokens several versions) and as new as its newest.
        """
        ranges = [codec.version_range(c) for c in group.completions]
        oldest = min((lo for lo, _ in ranges), default=req.current_version)
        newest = max((hi for _, hi in ranges), default=req.current_version)
        return (
            req.current_version - oldest <= req.max_staleness
            and oldest >= self.version_floor
            and newest <= req.current_version
        )

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
            version = self._take_versions.pop(req.take_id, 0)
            if self._db is not None:
                with self._tx():
                    self._db.take_del(req.take_id)
                    self._db.consumed_add(
                        [
                            (
                                g.prompt.id,
                                req.take_id,
                                version,
                                g.lease_id,
                                g.prompt.SerializeToString(),
                            )
                            for g in taken
                        ]
                    )
                    self._save_counts()
            self._cv.notify_all()
            return pb.AckReply(consumed=len(taken))

    def resume_trainer(self, restored_version: int, new_version: int) -> dict[str, int]:
        """A trainer restarted from its checkpoint at ``restored_version``; it now publishes
        ``new_version`` (>= ``restored_version``).

        Everything the lost trainer did after that checkpoint is undone so no
        prompt is lost or trained on twice: prompts consumed by takes at
        ``restored_version`` or later return to the pool (front, in their
        order) and leave the consumed log; takes never acknowledged return
        their prompts too; groups from weights older than ``new_version``
        are dropped when taken (the version floor); and partial work with a
        token older than ``new_version`` is dropped now (its prompt stays
        where it is, to be generated afresh). Idempotent.

        Returns:
          How many prompts came back from the consumed log and from open takes.
        """
        if new_version < restored_version:
            raise QueueError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"new version {new_version} is older than the restored {restored_version}",
            )
        with self._cv, self._tx():
            if self._db is not None:
                unconsumed = [
                    prompt_from_bytes(b) for _, b in self._db.consumed_since(restored_version)
                ]
                self._db.consumed_drop_since(restored_version)
            else:  # without a database the consumed log is not kept: nothing to roll back
                unconsumed = []
            opened = [codec.msg_to_prompt(g.prompt) for t in self._taken.values() for g in t]
            for take_id, groups in self._taken.items():
                self._submitted.difference_update(g.lease_id for g in groups)
                if self._db is not None:
                    self._db.take_del(take_id)
            self._taken.clear()
            self._take_versions.clear()
            for prompt in reversed(unconsumed + opened):
                self._return(prompt)
            self.counts["consumed"] -= len(unconsumed)
            self.counts["trainer_resumes"] += 1
            self.version_floor = max(self.version_floor, new_version)
            dropped = self._drop_partials_below(self.version_floor)
            self._save_counts()
            self._cv.notify_all()
        log.info(
            "trainer resumed at version %d (publishing %d): %d consumed and %d taken prompts "
            "returned, %d partial work dropped",
            restored_version,
            new_version,
            len(unconsumed),
            len(opened),
            dropped,
        )
        return {"unconsumed": len(unconsumed), "untaken": len(opened)}

    def release_takes(self, keep: Sequence[str]) -> int:
        """Puts the groups of every open take not in ``keep`` back at the front of the queue.

        The trainer calls this after a Take whose reply it never got (the
        server restarted): that take may have been recorded, and nobody would
        ever acknowledge it. Returns how many groups went back.
        """
        kept = set(keep)
        with self._cv, self._tx():
            orphans = [t for t in self._taken if t not in kept]
            back = [g for t in orphans for g in self._taken[t]]
            for take_id in orphans:
                del self._taken[take_id]
                self._take_versions.pop(take_id, None)
                if self._db is not None:
                    self._db.take_del(take_id)
            for group in reversed(back):
                self._queue.appendleft(group)
                if self._db is not None:
                    self._db.queued_push_front(group.SerializeToString())
            self.counts["released_groups"] += len(back)
            self._save_counts()
            self._cv.notify_all()
        if back:
            log.info(
                "%d groups of %d unacknowledged takes back in the queue", len(back), len(orphans)
            )
        return len(back)

    def accounting(self) -> dict[str, list[str]]:
        """Prompt ids in each place (for tests and audits): pool, leased, queued, taken, consumed."""
        with self._cv:
            return {
                "pool": [p.id for p in self._pool],
                "leased": [lease.prompt.id for lease in self._leases.values()],
                "queued": [g.prompt.id for g in self._queue],
                "taken": [g.prompt.id for t in self._taken.values() for g in t],
                "consumed": self._db.consumed_ids() if self._db is not None else [],
            }

    def partial_ids(self) -> list[str]:
        """Ids of the prompts with partial work attached (wherever the prompt is)."""
        with self._cv:
            return list(self._partials)

    def stats(self) -> pb.QueueStats:
        with self._cv:
            self._expire()
            reports = list(self._workers.values()) or [(0.0, 0.0, 0, 0, 0.0, 0.0, 0)]
            idle, busy, reward_errors, reward_timeouts, generate, score, refused = (
                sum(x) for x in zip(*reports)
            )
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
                partial_submitted=self.counts["partial_submitted"],
                partial_resumed=self.counts["partial_resumed"],
                partial_tokens=self.counts["partial_tokens"],
                worker_idle_s=idle,
                worker_busy_s=busy,
                reward_errors=int(reward_errors),
                reward_timeouts=int(reward_timeouts),
                worker_generate_s=generate,
                worker_score_s=score,
                probe_refused=int(refused),
            )
