"""Client of the parameter server: weights in and out, leases, submits, takes, acks.

Unary calls follow the one retry policy (:mod:`rlax.core.param_server.retry`):
bounded exponential backoff while the server is unreachable (a restarting
server is normal), a line in the log per retry; every mutating call is
idempotent on the server, so a retry after a lost reply is safe. Weight
bytes go through the client's weight lanes (``rlax.ps_settings.weight_lanes``,
transport/lanes.py): each push or pull through the first lane that carries it,
and the client never asks which (pushes are not retried here: the trainer
repeats a whole push, :mod:`rlax.core.trainer.client`).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np

from rlax.core.parallel.host_memory import keep_message_buffers
from rlax.core.param_server import codec
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.retry import RetryPolicy
from rlax.core.param_server.settings import MB, ServerSettings
from rlax.core.param_server.transport import grpc_lane, lanes
from rlax.core.rollout.probe import Probe
from rlax.core.types import DroppedGroup, Group, PartialGroup, Prompt
from rlax.core.wire import WirePlan, chunks, pull_buffer, stream

log = logging.getLogger("rlax.client")


class ParamServerClient:
    """One connection to the parameter server (thread-safe, like its gRPC channel)."""

    def __init__(
        self,
        settings: ServerSettings,
        *,
        retry_s: float = 60.0,
        give_up: Callable[[], bool] | None = None,
        relay: bool = False,
        reuse_pull_buffer: bool = True,
    ):
        """``retry_s``: how long a call retries an unreachable server; ``give_up``:
        when it returns True a failing call stops retrying at once (a worker's
        run has finished, so the server it waits for is gone for good);
        ``relay``: serve what this client pulls to other pullers when the relay
        lane's ``fanout`` is above 0 (workers do, see transport/relay_lane.py);
        ``reuse_pull_buffer``: pull into the last pull's buffer (False: a new one
        each time, so arrays sharing the last one, :meth:`WirePlan.alias`, stay)."""
        self.settings = lanes.pinned(settings.resolved())
        self.retry = RetryPolicy(deadline_s=retry_s, give_up=give_up or (lambda: False))
        keep_message_buffers()
        self._channel = self.settings.channel()
        self._auth = (("authorization", f"Bearer {self.settings.token}"),)
        ch = self._channel
        self._calls = {
            name: ch.unary_unary(
                f"/rlax.v1.{service}/{name}",
                request_serializer=req.SerializeToString,
                response_deserializer=rep.FromString,
            )
            for service, name, req, rep in (
                ("WeightStore", "Stage", pb.PartHeader, pb.BulkTicket),
                ("WeightStore", "OpenPull", pb.PullRequest, pb.PullTicket),
                ("WeightStore", "WaitForVersion", pb.WaitRequest, pb.VersionInfo),
                ("WeightStore", "Stat", pb.StatRequest, pb.StatReply),
                ("RolloutQueue", "Lease", pb.LeaseRequest, pb.LeaseReply),
                ("RolloutQueue", "Submit", pb.SubmitRequest, pb.SubmitReply),
                ("RolloutQueue", "SubmitPartial", pb.SubmitPartialRequest, pb.SubmitReply),
                ("RolloutQueue", "Take", pb.TakeRequest, pb.TakeReply),
                ("RolloutQueue", "Ack", pb.AckRequest, pb.AckReply),
            )
        }
        self._buffers: dict[int, memoryview] = {}
        self.reuse_pull_buffer = reuse_pull_buffer
        self.relay_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        link = lanes.Link(self.settings, ch, self._auth, self.retry, relay, self.relay_id)
        self.lanes = lanes.open_lanes(link, self.settings.lanes)

    def close(self) -> None:
        self.lanes.close()
        self._channel.close()

    def lane(self, name: str) -> Any:
        """The opened weight lane ``name`` (None: not listed, or nothing to carry here)."""
        return self.lanes.get(name)

    def _call(self, name: str, request, timeout: float | None = None):
        call = self._calls[name]
        return self.retry.call(name, lambda: call(request, metadata=self._auth, timeout=timeout))

    def unary(
        self,
        method: str,
        request: bytes,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
    ) -> bytes:
        """A raw call (bytes both ways) to ``method`` of a service served beside the protocol's.

        Used by :mod:`rlax.core.param_server.queue.recovery`; sent with this client's
        connection and token, retried by ``retry`` (None: this client's policy).
        """
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(
            method, request_serializer=None, response_deserializer=None
        )
        policy = retry or self.retry
        return policy.call(method, lambda: call(request, metadata=self._auth, timeout=timeout))

    # -- weights ------------------------------------------------------------

    def header(self, plan: WirePlan, version: int, probe: Probe | None = None) -> pb.PartHeader:
        """The header of a whole-model push (part 0 of 1) of ``plan``'s tree, carrying the
        version's ``probe`` (:mod:`rlax.core.rollout.probe`; None: none)."""
        header = pb.PartHeader(
            version=version, part=0, num_parts=1, nbytes=plan.nbytes, push_id=uuid.uuid4().hex
        )
        for i, t in enumerate(plan.tensors):
            header.tensors.add(
                name=t.name,
                dtype=plan.wire_dtype.name,
                shape=t.shape,
                offset=t.offset,
                nbytes=t.nbytes,
                index=i,
            )
        return codec.set_probe(header, probe)

    def _pieces(self, plan: WirePlan, tree_or_buffer) -> Iterator[tuple[int, memoryview]]:
        chunk = self.settings.chunk_mb * MB
        if isinstance(tree_or_buffer, np.ndarray) and tree_or_buffer.dtype == np.uint8:
            return chunks(tree_or_buffer, chunk)  # already packed
        return stream(plan, tree_or_buffer, chunk)

    def push_messages(self, plan: WirePlan, tree_or_buffer, version: int) -> Iterator[bytes]:
        """The gRPC wire messages of one whole-model push (part 0 of 1)."""
        return grpc_lane.messages(self.header(plan, version), self._pieces(plan, tree_or_buffer))

    def push(
        self, plan: WirePlan, tree_or_buffer, version: int, probe: Probe | None = None
    ) -> pb.PushReply:
        """Publishes a parameter tree (or its packed uint8 buffer) as ``version`` (with its
        ``probe``: the weight-load check's, None: none)."""
        header = self.header(plan, version, probe)
        return self.push_part(header, self._pieces(plan, tree_or_buffer))

    def push_part(
        self, header: pb.PartHeader, pieces, sizes: list[int] | None = None
    ) -> pb.PushReply:
        """Pushes one part: ``header`` and its bytes as (offset, view) pairs in order.

        A multi-host trainer calls this once per host with that host's shards
        (``slice_start``/``slice_shape`` set); the version is committed when
        every part has arrived, and pulled as whole tensors. Over a split
        store (the ``split`` lane) the part is split by tensor over the servers
        (weights/split.py; ``sizes``: each whole tensor's bytes, for a part that
        does not name every tensor). Goes through the first weight lane that
        carries it. Raises grpc.RpcError (transfer.BulkError on the bulk lane) if refused.
        """
        return self.lanes.push(header, pieces, sizes)

    def _buffer(self, nbytes: int) -> memoryview:
        if not self.reuse_pull_buffer:
            return pull_buffer(nbytes)
        buf = self._buffers.get(nbytes)
        if buf is None:
            buf = pull_buffer(nbytes)
        self._buffers = {nbytes: buf}
        return buf

    def pull(self, have_version: int = -1) -> tuple[int, list[dict], memoryview] | None:
        """(version, tensor list, buffer) of the newest version, or None if we have it.

        The buffer holds whole tensors (the server assembles multi-host pushes)
        and is page-aligned (:func:`~rlax.core.wire.pull_buffer`);
        it is reused between pulls of the same size unless the client was made
        with ``reuse_pull_buffer=False``. Goes through the first weight lane that carries it.
        """
        return self.lanes.pull(have_version, self._buffer)

    def wait_for_version(self, after_version: int, timeout_s: float) -> int:
        req = pb.WaitRequest(after_version=after_version, timeout_s=timeout_s)
        return self._call("WaitForVersion", req, timeout=timeout_s + 30).version

    def stat(self) -> pb.StatReply:
        return self._call("Stat", pb.StatRequest(), timeout=30)

    # -- rollouts -----------------------------------------------------------

    def lease(
        self,
        worker: str,
        max_prompts: int,
        *,
        wait_s: float = 5.0,
        idle_s: float = 0.0,
        busy_s: float = 0.0,
        reward_errors: int = 0,
        reward_timeouts: int = 0,
        generate_s: float = 0.0,
        score_s: float = 0.0,
        probe_refused: int = 0,
    ) -> Leases:
        """Up to ``max_prompts`` (lease id, prompt) pairs; [] if no room came within ``wait_s``.

        The reply's ``partials`` maps a lease id to the partial work its prompt
        carries (a preempted worker's rows, to be continued). The worker's
        cumulative idle/busy/generate/score seconds, verifier failures and versions
        refused by the weight-load check ride along for Stat.
        """
        req = pb.LeaseRequest(
            worker=worker,
            max_prompts=max_prompts,
            wait_s=wait_s,
            idle_s=idle_s,
            busy_s=busy_s,
            reward_errors=reward_errors,
            reward_timeouts=reward_timeouts,
            generate_s=generate_s,
            score_s=score_s,
            probe_refused=probe_refused,
        )
        reply = self._call("Lease", req, timeout=wait_s + 30)
        leases = Leases((x.lease_id, codec.msg_to_prompt(x.prompt)) for x in reply.leases)
        for x in reply.leases:
            partial = codec.msgs_to_partial(x.partial)
            if partial is not None:
                leases.partials[x.lease_id] = partial
        return leases

    def submit(self, group: Group, lease_id: str, *, filtered: bool = False) -> bool:
        """Submits a scored group for its lease; returns True if it was a duplicate."""
        req = pb.SubmitRequest(group=codec.group_to_msg(group, lease_id, filtered))
        return self._call("Submit", req, timeout=60).duplicate

    def submit_partial(self, lease_id: str, prompt: Prompt, partial: PartialGroup) -> bool:
        """Hands in a group cut off by a preemption, ending its lease; True if a duplicate.

        The prompt goes back to the front of the pool with ``partial``
        attached: whoever leases it next continues its unfinished rows.
        """
        req = codec.partial_to_msg(partial, lease_id, prompt.id)
        return self._call("SubmitPartial", req, timeout=60).duplicate

    def take(
        self, max_groups: int, *, current_version: int, max_staleness: int, wait_s: float = 5.0
    ) -> tuple[str, list[Group | DroppedGroup], int]:
        """(take id, groups — a DroppedGroup, its rewards, for a filtered one — and how many
        were stale)."""
        req = pb.TakeRequest(
            max_groups=max_groups,
            current_version=current_version,
            max_staleness=max_staleness,
            wait_s=wait_s,
        )
        reply = self._call("Take", req, timeout=wait_s + 60)
        groups = [
            DroppedGroup(np.asarray(m.rewards, np.float32)) if m.filtered else codec.msg_to_group(m)
            for m in reply.groups
        ]
        return reply.take_id, groups, reply.dropped_stale

    def ack(self, take_id: str) -> int:
        return self._call("Ack", pb.AckRequest(take_id=take_id), timeout=60).consumed


class Leases(list[tuple[str, Prompt]]):
    """What ``lease`` returns: (lease id, prompt) pairs, plus ``partials`` (lease id ->
    the partial work that prompt carries, for the leases that carry some)."""

    def __init__(self, pairs=()):
        super().__init__(pairs)
        self.partials: dict[str, PartialGroup] = {}
