"""One gRPC server process hosting WeightStore and RolloutQueue, and the bulk lane.

Weight chunks on the gRPC path travel as raw serialized messages (identity
(de)serializers, the chunk codec of transport/chunk_codec.py). Without TLS the server also
runs the bulk lane (transport/transfer.py): ``Stage`` and ``OpenPull`` hand out tickets
for a plain TCP transfer of the bytes, which is what clients use by default.
Mutating calls need the shared token in the ``authorization`` metadata;
a missing or wrong token is UNAUTHENTICATED and touches nothing.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hmac
import logging
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import NoReturn

import grpc

from rlax.core.parallel.host_memory import keep_message_buffers
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.queue import recovery
from rlax.core.param_server.queue.service import RolloutQueue
from rlax.core.param_server.queue.state import QueueError
from rlax.core.param_server.settings import MB, ServerSettings
from rlax.core.param_server.transport import transfer
from rlax.core.param_server.transport.relay import Limiter, relay_key, send_file, send_view
from rlax.core.param_server.transport.relay_routes import RelayDirectory
from rlax.core.param_server.weights.parts import Part, PushRejected
from rlax.core.param_server.weights.store import Served, WeightStore
from rlax.core.types import Prompt

log = logging.getLogger("rlax.param_server")

PROTECTED = {
    *recovery.METHODS,
    "/rlax.v1.WeightStore/Push",
    "/rlax.v1.WeightStore/Stage",
    "/rlax.v1.RolloutQueue/Lease",
    "/rlax.v1.RolloutQueue/Submit",
    "/rlax.v1.RolloutQueue/SubmitPartial",
    "/rlax.v1.RolloutQueue/Take",
    "/rlax.v1.RolloutQueue/Ack",
}


class _TokenCheck(grpc.ServerInterceptor):
    def __init__(self, token: str | None):
        if not token:  # ServerSettings.resolved() reads it, or raises
            raise ValueError("parameter server: no token to check calls against")
        self._expected = f"Bearer {token}".encode()

        def deny(request, context: grpc.ServicerContext) -> NoReturn:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")

        self._deny: dict[bool, grpc.RpcMethodHandler] = {
            False: grpc.unary_unary_rpc_method_handler(deny),
            True: grpc.stream_unary_rpc_method_handler(deny),
        }

    def intercept_service(self, continuation, details):
        if details.method in PROTECTED:
            given = dict(details.invocation_metadata).get("authorization", "")
            if not hmac.compare_digest(given.encode(), self._expected):
                log.warning("rejected %s: missing or wrong token", details.method)
                return self._deny[details.method.endswith("/Push")]
        return continuation(details)


class ParamServer:
    """The services' state plus the gRPC glue. ``start()`` binds; ``stop()`` shuts down."""

    def __init__(
        self,
        settings: ServerSettings,
        prompts: Iterator[Prompt],
        *,
        capacity: int,
        lease_ttl_s: float = 120.0,
        threads: int = 64,
        curricula: Sequence = (),
        queue_db=None,
    ):
        self.settings = settings.resolved()
        keep_message_buffers()
        self.weights = WeightStore(
            max_version_bytes=self.settings.max_version_mb * MB,
            chunk_bytes=self.settings.chunk_mb * MB,
        )
        self.bulk: transfer.BulkLane | None = None
        self.relays = RelayDirectory(self.settings.relay_fanout, self.settings.relay_direct)
        self.egress: Limiter | None = None  # a simulated uplink (benchmarks/fanout.py)
        self.bytes_served = 0
        self._count_lock = threading.Lock()
        self.queue = RolloutQueue(
            prompts,
            capacity=capacity,
            lease_ttl_s=lease_ttl_s,
            version_fn=lambda: self.weights.version,
            curricula=curricula,
            db=queue_db,  # a persist.QueueDB: the queue's state survives a restart
        )
        self._server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=threads),
            interceptors=[_TokenCheck(self.settings.token)],
            options=self.settings.grpc_options(),
        )
        self._server.add_generic_rpc_handlers(
            [self._weight_handlers(), self._queue_handlers(), recovery.handlers(self.queue)]
        )
        self.port = 0

    def start(self) -> int:
        creds = self.settings.server_credentials()
        address = self.settings.address
        if creds is None:
            self.port = self._server.add_insecure_port(address)
        else:
            self.port = self._server.add_secure_port(address, creds)
        if not self.port:
            raise OSError(f"parameter server: cannot bind {address}")
        if self.settings.bulk_lane:
            self.bulk = transfer.BulkLane(transfer.split_address(address))
            self.bulk.start()
        self._server.start()
        log.info(
            "parameter server listening on %s (port %d, tls=%s, bulk lane port %s)",
            address,
            self.port,
            bool(creds),
            self.bulk.port if self.bulk else None,
        )
        return self.port

    def stop(self, grace: float | None = 1.0) -> None:
        self._server.stop(grace).wait()
        if self.bulk is not None:
            self.bulk.stop()

    def wait(self) -> None:
        self._server.wait_for_termination()

    # -- WeightStore --------------------------------------------------------

    def _push(self, request_iterator, context):
        try:
            return self.weights.push(request_iterator)
        except PushRejected as err:
            log.warning("push rejected: %s", err)
            context.abort(err.code, str(err))

    def _pull(self, request: pb.PullRequest, context):
        yield from self.weights.messages_for(request.have_version)

    def _no_bulk(self, context: grpc.ServicerContext) -> NoReturn:
        context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "the bulk lane is off (TLS is configured, or weight_lanes omits it): use Push/Pull",
        )

    def _stage(self, header: pb.PartHeader, context):
        if self.bulk is None:
            self._no_bulk(context)
        try:
            started = self.weights.begin(header)
        except PushRejected as err:
            self.weights.note_rejected()
            log.warning("push rejected: %s", err)
            context.abort(err.code, str(err))
        if isinstance(started, pb.PushReply):
            return pb.BulkTicket(duplicate=True, version=started.version)
        ticket = self.bulk.issue(
            functools.partial(self._receive, started),
            functools.partial(self.weights.abandon, started, rejected=False),
        )
        return pb.BulkTicket(ticket=ticket, port=self.bulk.port)

    def _receive(self, part: Part, conn: socket.socket) -> None:
        """A staged part's bytes, frame by frame, straight into its buffer; then the commit."""
        max_frame = self.settings.max_message_mb * MB - 4096  # servable by gRPC Pull as well
        try:
            while not part.complete:
                length, digest = transfer.read_frame_header(conn)
                part.check_segment(part.received, length)
                if length > max_frame:
                    raise PushRejected(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"frame of {length} bytes exceeds the limit of {max_frame}",
                    )
                transfer.recv_into(conn, part.landing(length))
                part.accept(length, digest)
            reply = self.weights.commit([part])
        except PushRejected as err:
            self.weights.abandon(part)
            log.warning("push rejected: %s", err)
            left = part.header.nbytes - part.received + 64 * (1 + part.header.nbytes // max_frame)
            transfer.reply(conn, err.code, str(err).encode(), drain_bytes=left)
            return
        except BaseException:
            self.weights.abandon(part)  # cut off mid-transfer: the served version stays
            raise
        transfer.reply(conn, None, reply.SerializeToString())

    def _open_pull(self, request: pb.PullRequest, context):
        if self.bulk is None:
            self._no_bulk(context)
        served = self.weights.open_pull(request.have_version)
        if served is None:
            return pb.PullTicket()
        port = request.relay_port if self._authorized(context) else 0  # relays need the token
        source = self.relays.assign(
            served.number, request.worker, request.relay_host, port, request.failed_source
        )
        if not source.direct:
            self.weights.close_pull(served)  # the bytes come from a relay
            reply = pb.PullTicket(
                header=served.header,
                relay_host=source.host,
                relay_port=source.port,
                source=source.name,
                relay_key=relay_key(self.settings.token or "", served.number),
            )
            reply.segments.extend(
                pb.Segment(offset=o, length=n, checksum=d) for o, n, d in served.segments
            )
            return reply
        ticket = self.bulk.issue(
            functools.partial(self._send, served),
            functools.partial(self.weights.close_pull, served),
        )
        reply = pb.PullTicket(ticket=ticket, port=self.bulk.port, header=served.header)
        for offset, length, digest in served.segments:
            reply.segments.add(offset=offset, length=length, checksum=digest)
        return reply

    def _send(self, served: Served, conn: socket.socket) -> None:
        try:
            if served.buffer is not None:
                send_view(conn, memoryview(served.buffer), self.egress, self._count)
            else:  # served from its saved file: straight from the page cache
                assert served.fd is not None
                send_file(conn, served.fd, served.header.nbytes, self.egress, self._count)
        finally:
            self.weights.close_pull(served)

    def _count(self, nbytes: int) -> None:
        with self._count_lock:
            self.bytes_served += nbytes

    def _authorized(self, context: grpc.ServicerContext) -> bool:
        given = dict(context.invocation_metadata()).get("authorization", "")
        return hmac.compare_digest(str(given).encode(), f"Bearer {self.settings.token}".encode())

    def _wait(self, request: pb.WaitRequest, context):
        return pb.VersionInfo(
            version=self.weights.wait_for(request.after_version, request.timeout_s)
        )

    def _stat(self, request, context):
        return pb.StatReply(
            version=self.weights.version,
            version_bytes=self.weights.version_bytes,
            pushes_rejected=self.weights.rejected,
            bytes_served=self.bytes_served,
            relay_assignments=self.relays.assigned,
            queue=self.queue.stats(),
        )

    def _weight_handlers(self):
        return grpc.method_handlers_generic_handler(
            "rlax.v1.WeightStore",
            {
                "Push": grpc.stream_unary_rpc_method_handler(
                    self._push,
                    request_deserializer=None,
                    response_serializer=pb.PushReply.SerializeToString,
                ),
                "Pull": grpc.unary_stream_rpc_method_handler(
                    self._pull,
                    request_deserializer=pb.PullRequest.FromString,
                    response_serializer=None,
                ),
                "Stage": _unary(self._stage, pb.PartHeader, pb.BulkTicket),
                "OpenPull": _unary(self._open_pull, pb.PullRequest, pb.PullTicket),
                "WaitForVersion": _unary(self._wait, pb.WaitRequest, pb.VersionInfo),
                "Stat": _unary(self._stat, pb.StatRequest, pb.StatReply),
            },
        )

    # -- RolloutQueue -------------------------------------------------------

    def _queue_call(self, method):
        def call(request, context):
            try:
                return method(request)
            except QueueError as err:
                context.abort(err.code, str(err))

        return call

    def _queue_handlers(self):
        q = self.queue
        return grpc.method_handlers_generic_handler(
            "rlax.v1.RolloutQueue",
            {
                "Lease": _unary(self._queue_call(q.lease), pb.LeaseRequest, pb.LeaseReply),
                "Submit": _unary(self._queue_call(q.submit), pb.SubmitRequest, pb.SubmitReply),
                "SubmitPartial": _unary(
                    self._queue_call(q.submit_partial), pb.SubmitPartialRequest, pb.SubmitReply
                ),
                "Take": _unary(self._queue_call(q.take), pb.TakeRequest, pb.TakeReply),
                "Ack": _unary(self._queue_call(q.ack), pb.AckRequest, pb.AckReply),
            },
        )


def _unary(fn, request_cls, reply_cls):
    return grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=request_cls.FromString,
        response_serializer=reply_cls.SerializeToString,
    )
