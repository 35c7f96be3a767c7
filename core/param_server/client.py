"""Client of the parameter server: weights in and out, leases, submits, takes, acks.

Unary calls follow the one retry policy (:mod:`rlax.core.param_server.retry`):
bounded exponential backoff while the server is unreachable (a restarting
server is normal), a line in the log per retry; every mutating call is
idempotent on the server, so a retry after a lost reply is safe. Weight
bytes go over the bulk lane (a plain TCP transfer beside gRPC, see
transport/transfer.py) unless TLS is configured or the server has it off; then over gRPC
streams of hand-encoded chunks (those are not retried here: the trainer
repeats a whole push, :mod:`rlax.core.trainer.client`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator

import grpc
import numpy as np

from rlax.core.parallel.host_memory import keep_message_buffers
from rlax.core.param_server import codec
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.retry import RetryPolicy
from rlax.core.param_server.settings import MB, ServerSettings
from rlax.core.param_server.transport import transfer
from rlax.core.param_server.transport.relay import Relay, pull_relayed
from rlax.core.param_server.transport.transfer import checksum, decode_chunk, encode_chunk
from rlax.core.param_server.weights.split import ShardedWeights
from rlax.core.types import Group, PartialGroup, Prompt
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
        shard_address: str | None = None,
        reuse_pull_buffer: bool = True,
    ):
        """``retry_s``: how long a call retries an unreachable server; ``give_up``:
        when it returns True a failing call stops retrying at once (a worker's
        run has finished, so the server it waits for is gone for good);
        ``relay``: serve what this client pulls to other pullers when the
        settings' ``relay_fanout`` is above 0 (workers do, see relay.py);
        ``shard_address``: a client of that weight-only server (weights/split.py);
        ``reuse_pull_buffer``: pull into the last pull's buffer (False: a new one
        each time, so arrays sharing the last one, :meth:`WirePlan.alias`, stay)."""
        self.settings = settings.resolved()
        if shard_address is not None:  # not the environment's address: a weight shard's
            self.settings = dataclasses.replace(
                self.settings, address=shard_address, weight_shards=()
            )
        self.retry = RetryPolicy(deadline_s=retry_s, give_up=give_up or (lambda: False))
        keep_message_buffers()
        self._channel = self.settings.channel()
        self._auth = (("authorization", f"Bearer {self.settings.token}"),)
        ch = self._channel
        self._push: grpc.StreamUnaryMultiCallable[bytes, pb.PushReply] = ch.stream_unary(
            "/rlax.v1.WeightStore/Push",
            request_serializer=None,
            response_deserializer=pb.PushReply.FromString,
        )
        self._pull: grpc.UnaryStreamMultiCallable[pb.PullRequest, bytes] = ch.unary_stream(
            "/rlax.v1.WeightStore/Pull", request_serializer=pb.PullRequest.SerializeToString,
            response_deserializer=None,
        )  # fmt: skip
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
        self.bulk = self.settings.bulk_lane and not self.settings.tls_cert
        self._host = transfer.split_address(self.settings.address)
        self._fleet(relay, retry_s)

    def _fleet(self, relay: bool, retry_s: float) -> None:
        """The sharded weight store's other servers, and this client's relay (if any)."""
        settings = self.settings
        self.shards: ShardedWeights | None = None
        if settings.weight_shards:
            self.shards = ShardedWeights(self, settings.weight_shards, lambda address:
                ParamServerClient(settings, retry_s=retry_s, shard_address=address))  # fmt: skip
        self.relay: Relay | None = None
        self.relay_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if relay and settings.relay_fanout > 0 and self.bulk and self.shards is None:
            assert settings.token is not None  # resolved() raises without one
            self.relay = Relay(settings.token, settings.relay_host,
                               max_connections=settings.relay_fanout + 4)  # fmt: skip

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        if self.shards is not None:
            self.shards.close()
        self._channel.close()

    def _call(self, name: str, request, timeout: float | None = None):
        call = self._calls[name]
        return self.retry.call(name, lambda: call(request, metadata=self._auth, timeout=timeout))

    def unary(self, method: str, request: bytes, *, timeout: float = 30.0,
              retry: RetryPolicy | None = None) -> bytes:  # fmt: skip
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

    def header(self, plan: WirePlan, version: int) -> pb.PartHeader:
        """The header of a whole-model push (part 0 of 1) of ``plan``'s tree."""
        header = pb.PartHeader(
            version=version, part=0, num_parts=1, nbytes=plan.nbytes, push_id=uuid.uuid4().hex
        )
        for i, t in enumerate(plan.tensors):
            header.tensors.add(
                name=t.name, dtype=plan.wire_dtype.name, shape=t.shape, offset=t.offset,
                nbytes=t.nbytes, index=i,
            )  # fmt: skip
        return header

    def _pieces(self, plan: WirePlan, tree_or_buffer) -> Iterator[tuple[int, memoryview]]:
        chunk = self.settings.chunk_mb * MB
        if isinstance(tree_or_buffer, np.ndarray) and tree_or_buffer.dtype == np.uint8:
            return chunks(tree_or_buffer, chunk)  # already packed
        return stream(plan, tree_or_buffer, chunk)

    def push_messages(self, plan: WirePlan, tree_or_buffer, version: int) -> Iterator[bytes]:
        """The gRPC wire messages of one whole-model push (part 0 of 1)."""
        yield pb.WeightChunk(header=self.header(plan, version), part=0).SerializeToString()
        for offset, view in self._pieces(plan, tree_or_buffer):
            yield encode_chunk(0, offset, view)

    def push(self, plan: WirePlan, tree_or_buffer, version: int) -> pb.PushReply:
        """Publishes a parameter tree (or its packed uint8 buffer) as ``version``."""
        return self.push_part(self.header(plan, version), self._pieces(plan, tree_or_buffer))

    def push_part(self, header: pb.PartHeader, pieces,
                  sizes: list[int] | None = None) -> pb.PushReply:  # fmt: skip
        """Pushes one part: ``header`` and its bytes as (offset, view) pairs in order.

        A multi-host trainer calls this once per host with that host's shards
        (``slice_start``/``slice_shape`` set); the version is committed when
        every part has arrived, and pulled as whole tensors. With
        ``weight_shards`` the part is split by tensor over the servers
        (weights/split.py; ``sizes``: each whole tensor's bytes, for a part that
        does not name every tensor).
        Raises grpc.RpcError (transfer.BulkError on the bulk lane) if refused.
        """
        if self.shards is not None:
            return self.shards.push_part(header, pieces, sizes)
        return self.push_one(header, pieces)

    def push_one(self, header: pb.PartHeader, pieces) -> pb.PushReply:
        """:meth:`push_part` to this client's server alone."""
        if self.bulk:
            try:
                ticket = self._call("Stage", header, timeout=60)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                log.info("parameter server has no bulk lane; pushing over gRPC")
                self.bulk = False
            else:
                if ticket.duplicate:
                    return pb.PushReply(version=ticket.version, duplicate=True)
                reply = transfer.send_part(self._host, ticket.port, ticket.ticket, pieces)
                return pb.PushReply.FromString(reply)

        def messages():
            yield pb.WeightChunk(header=header, part=header.part).SerializeToString()
            for offset, view in pieces:
                yield encode_chunk(header.part, offset, view)

        return self._push(messages(), metadata=self._auth)

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
        with ``reuse_pull_buffer=False``.
        """
        if self.shards is not None:
            pulled = self.shards.pull(have_version)
            return None if pulled is None else (pulled[0], _tensor_list(pulled[1]), pulled[2])
        if self.bulk and self.relay is not None:
            try:
                relayed = pull_relayed(self, have_version)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                log.info("parameter server has no bulk lane; pulling over gRPC (no relay)")
                self.bulk = False
                return self._pull_grpc(have_version)
            if relayed is None:
                return None
            return relayed[0].header.version, _tensor_list(relayed[0].header), relayed[1]
        if self.bulk:
            try:
                ticket = self._call(
                    "OpenPull", pb.PullRequest(have_version=have_version), timeout=60
                )
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                log.info("parameter server has no bulk lane; pulling over gRPC")
                self.bulk = False
            else:
                if not ticket.ticket:
                    return None
                header = ticket.header
                buf = self._buffer(header.nbytes)
                segments = self.segments_of(ticket)
                transfer.receive_into(self._host, ticket.port, ticket.ticket, buf, segments)
                return header.version, _tensor_list(header), buf
        return self._pull_grpc(have_version)

    @staticmethod
    def segments_of(ticket: pb.PullTicket) -> list[tuple[int, int, int]]:
        """A pull ticket's (offset, length, checksum) segments, checked to tile its buffer."""
        header = ticket.header
        segments = [(s.offset, s.length, s.checksum) for s in ticket.segments]
        if [o for o, _, _ in segments] != list(
            np.cumsum([0] + [n for _, n, _ in segments])[:-1]
        ) or sum(n for _, n, _ in segments) != header.nbytes:
            raise ValueError(f"pull of version {header.version}: segments do not cover "
                             f"its {header.nbytes} bytes")  # fmt: skip
        return segments

    def _pull_grpc(self, have_version: int):
        header, buf, received = None, None, 0
        for raw in self._pull(pb.PullRequest(have_version=have_version)):
            decoded = decode_chunk(raw)
            if decoded is None:
                header = pb.WeightChunk.FromString(raw).header
                buf = self._buffer(header.nbytes)
                continue
            _, offset, data, digest = decoded
            if (header is None or buf is None or offset != received
                    or offset + len(data) > header.nbytes):  # fmt: skip
                raise ValueError(f"pull: chunk at {offset}, expected {received}")
            if checksum(data) != digest:
                raise ValueError(f"pull of version {header.version}: checksum mismatch at {offset}")
            buf[offset : offset + len(data)] = data
            received += len(data)
        if header is None:
            return None
        if received != header.nbytes:
            raise ValueError(
                f"pull of version {header.version}: {received} of {header.nbytes} bytes"
            )
        return header.version, _tensor_list(header), buf

    def wait_for_version(self, after_version: int, timeout_s: float) -> int:
        req = pb.WaitRequest(after_version=after_version, timeout_s=timeout_s)
        return self._call("WaitForVersion", req, timeout=timeout_s + 30).version

    def stat(self) -> pb.StatReply:
        return self._call("Stat", pb.StatRequest(), timeout=30)

    # -- rollouts -----------------------------------------------------------

    def lease(self, worker: str, max_prompts: int, *, wait_s: float = 5.0, idle_s: float = 0.0,
              busy_s: float = 0.0, reward_errors: int = 0, reward_timeouts: int = 0,
              generate_s: float = 0.0, score_s: float = 0.0,
              ) -> Leases:  # fmt: skip
        """Up to ``max_prompts`` (lease id, prompt) pairs; [] if no room came within ``wait_s``.

        The reply's ``partials`` maps a lease id to the partial work its prompt
        carries (a preempted worker's rows, to be continued). The worker's
        cumulative idle/busy/generate/score seconds and verifier failures ride along
        for Stat.
        """
        req = pb.LeaseRequest(
            worker=worker, max_prompts=max_prompts, wait_s=wait_s, idle_s=idle_s, busy_s=busy_s,
            reward_errors=reward_errors, reward_timeouts=reward_timeouts,
            generate_s=generate_s, score_s=score_s,
        )  # fmt: skip
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

    def take(self, max_groups: int, *, current_version: int, max_staleness: int,
             wait_s: float = 5.0) -> tuple[str, list[Group | np.ndarray], int]:  # fmt: skip
        """(take id, groups — just the rewards for a filtered one — and how many were stale)."""
        req = pb.TakeRequest(
            max_groups=max_groups,
            current_version=current_version,
            max_staleness=max_staleness,
            wait_s=wait_s,
        )
        reply = self._call("Take", req, timeout=wait_s + 60)
        groups = [
            np.asarray(m.rewards, np.float32) if m.filtered else codec.msg_to_group(m)
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


def _tensor_list(header: pb.PartHeader) -> list[dict]:
    return [
        {"name": t.name, "shape": list(t.shape), "offset": t.offset, "nbytes": t.nbytes,
         "dtype": t.dtype}
        for t in header.tensors
    ]  # fmt: skip
