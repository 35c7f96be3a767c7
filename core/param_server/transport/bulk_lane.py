"""The bulk lane: weight bytes over a plain TCP connection beside gRPC.

Control stays on gRPC: ``Stage`` (push) or ``OpenPull`` hands out a one-use
ticket and the lane's port, and the bytes flow over the lane's socket
(transport/transfer.py: ``send_part`` / ``receive_into``, every segment
checked against its xxh3_64). Off under TLS (its bytes are not encrypted).

Both halves live here: :class:`BulkLane` is the lane as configured (its
settings); ``open`` gives a client its :class:`OpenBulkLane`, ``serve`` gives
a parameter server its :class:`BulkServer` (the listener, ``Stage`` and
``OpenPull``). A server that does not serve it (TLS, or ``weight_lanes``
without ``bulk``) answers UNIMPLEMENTED, and the client's lane steps aside
for good. Another lane may route a pull elsewhere (:attr:`BulkServer.route`:
the relay lane points pullers to relays).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any, NoReturn

import grpc

from rlax.core import hookimpl
from rlax.core.constraints import Positive, check_fields
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.codec import tensor_list
from rlax.core.param_server.settings import MB
from rlax.core.param_server.transport import transfer
from rlax.core.param_server.transport.relay import Limiter, send_file, send_view
from rlax.core.param_server.weights.parts import Part, PushRejected
from rlax.core.param_server.weights.served import Served
from rlax.core.weight_lane import LaneHost, LaneLink, LaneServer, Pulled, StepAside

log = logging.getLogger("rlax.param_server")

ABSENT = "the parameter server has no bulk lane"
SERVICE = "rlax.v1.WeightStore"
# A pull's other route: (served version, request, call context) -> a ticket that sends the
# puller elsewhere, or None for a ticket of this lane.
Route = Callable[[Served, pb.PullRequest, grpc.ServicerContext], pb.PullTicket | None]


@dataclasses.dataclass(frozen=True)
class BulkLane:
    """The bulk lane's settings (``weight_lanes.bulk``).

    Args:
      timeout_s: a transfer's socket timeout, on the client.
    """

    timeout_s: Annotated[float, Positive] = 120.0

    def __post_init__(self) -> None:
        check_fields(self)

    def open(self, link: LaneLink) -> OpenBulkLane | None:
        if link.settings.tls_cert:
            return None  # the lane's bytes are not encrypted
        return OpenBulkLane(self, link)

    def serve(self, host: LaneHost) -> BulkServer | None:
        if host.settings.tls_cert:
            return None
        return BulkServer(host)


class OpenBulkLane:
    """A client's bulk lane to one server."""

    def __init__(self, lane: BulkLane, link: LaneLink):
        self.timeout_s = lane.timeout_s
        self.link = link
        self.host = transfer.split_address(link.settings.address)
        self.absent = False  # the server answered UNIMPLEMENTED

    def control(self, name: str, request, reply):
        """A ticket call; StepAside (for good) if the server does not serve the lane."""
        if self.absent:
            raise StepAside(ABSENT)
        try:
            return self.link.call(name, request, 60, reply)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self.absent = True
            raise StepAside(ABSENT) from None

    def push(
        self,
        header: pb.PartHeader,
        pieces: Iterable[tuple[int, memoryview]],
        sizes: list[int] | None = None,
    ) -> pb.PushReply:
        ticket = self.control("Stage", header, pb.BulkTicket)
        if ticket.duplicate:
            return pb.PushReply(version=ticket.version, duplicate=True)
        reply = transfer.send_part(
            self.host, ticket.port, ticket.ticket, pieces, timeout_s=self.timeout_s
        )
        return pb.PushReply.FromString(reply)

    def pull(self, have_version: int, buffer: Callable[[int], memoryview]) -> Pulled | None:
        request = pb.PullRequest(have_version=have_version)
        ticket = self.control("OpenPull", request, pb.PullTicket)
        if not ticket.ticket:
            return None
        segments = segments_of(ticket)
        buf = buffer(ticket.header.nbytes)
        transfer.receive_into(
            self.host, ticket.port, ticket.ticket, buf, segments, timeout_s=self.timeout_s
        )
        return ticket.header.version, tensor_list(ticket.header), buf

    def close(self) -> None:
        pass  # a transfer's socket closes with it


def segments_of(ticket: pb.PullTicket) -> list[tuple[int, int, int]]:
    """A pull ticket's (offset, length, checksum) segments, checked to tile its buffer."""
    header = ticket.header
    segments = [(s.offset, s.length, s.checksum) for s in ticket.segments]
    at = 0
    for offset, length, _ in segments:
        if offset != at:
            break
        at += length
    else:
        if at == header.nbytes:
            return segments
    raise ValueError(
        f"pull of version {header.version}: segments do not cover its {header.nbytes} bytes"
    )


class BulkServer(LaneServer):
    """The bulk lane on a parameter server: its listener and the ``Stage`` and
    ``OpenPull`` calls that hand out its tickets.

    Attributes:
      listener: the TCP listener (transport/transfer.py), bound on ``start``.
      route: set by another lane's half to send some pulls elsewhere (None: all here).
      egress: a simulated uplink for what this server sends (benchmarks/fanout.py).
      bytes_served: the bytes this server sent to pullers (``Stat``'s ``bytes_served``).
    """

    protected: Sequence[str] = (f"/{SERVICE}/Stage",)

    def __init__(self, host: LaneHost):
        self.host, self.weights = host, host.weights
        self.listener: transfer.BulkLane | None = None
        self.route: Route | None = None
        self.egress: Limiter | None = None
        self.bytes_served = 0
        self._count_lock = threading.Lock()

    def handlers(self) -> Sequence[grpc.GenericRpcHandler]:
        methods = {
            "Stage": _unary(self._stage, pb.PartHeader, pb.BulkTicket),
            "OpenPull": _unary(self._open_pull, pb.PullRequest, pb.PullTicket),
        }
        return [grpc.method_handlers_generic_handler(SERVICE, methods)]

    def start(self) -> None:
        self.listener = transfer.BulkLane(transfer.split_address(self.host.settings.address))
        self.listener.start()

    def stop(self) -> None:
        if self.listener is not None:
            self.listener.stop()

    def stat(self, reply: pb.StatReply) -> None:
        reply.bytes_served = self.bytes_served

    def _ready(self, context: grpc.ServicerContext) -> transfer.BulkLane:
        if self.listener is None:  # a call that raced the server's start
            context.abort(grpc.StatusCode.UNAVAILABLE, "the bulk lane is starting")
        return self.listener

    def _stage(self, header: pb.PartHeader, context):
        listener = self._ready(context)
        try:
            started = self.weights.begin(header)
        except PushRejected as err:
            self.weights.note_rejected()
            _refuse(context, err)
        if isinstance(started, pb.PushReply):
            return pb.BulkTicket(duplicate=True, version=started.version)
        ticket = listener.issue(
            functools.partial(self._receive, started),
            functools.partial(self.weights.abandon, started, rejected=False),
        )
        return pb.BulkTicket(ticket=ticket, port=listener.port)

    def _receive(self, part: Part, conn: socket.socket) -> None:
        """A staged part's bytes, frame by frame, straight into its buffer; then the commit."""
        max_frame = self.host.settings.max_message_mb * MB - 4096  # servable by gRPC Pull too
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
        listener = self._ready(context)
        served = self.weights.open_pull(request.have_version)
        if served is None:
            return pb.PullTicket()
        elsewhere = self.route(served, request, context) if self.route is not None else None
        if elsewhere is not None:
            self.weights.close_pull(served)  # the bytes come from elsewhere
            return elsewhere
        ticket = listener.issue(
            functools.partial(self._send, served),
            functools.partial(self.weights.close_pull, served),
        )
        reply = pb.PullTicket(ticket=ticket, port=listener.port, header=served.header)
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


def _refuse(context: grpc.ServicerContext, err: PushRejected) -> NoReturn:
    log.warning("push rejected: %s", err)
    context.abort(err.code, str(err))


def _unary(fn: Callable[..., Any], request_cls: Any, reply_cls: Any) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=request_cls.FromString,
        response_serializer=reply_cls.SerializeToString,
    )


@hookimpl
def rlax_register_weight_lanes():
    return {"bulk": BulkLane}
