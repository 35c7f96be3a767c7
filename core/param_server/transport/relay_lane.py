"""The relay lane: a worker pulls where the server points it, and relays what it pulls.

With ``weight_lanes.relay.fanout = k > 0`` a relaying client (a worker)
opens a :class:`~rlax.core.param_server.transport.relay.Relay` beside it and
offers it on every ``OpenPull``; the server answers with a bulk-lane ticket
or the address of a relay already holding the version (the tree:
transport/relay_routes.py). The server half (:class:`RelayServer`) keeps
that tree and routes the bulk lane's ``OpenPull`` through it. Every segment is checked against the checksums
the *server* gave, so a failing relay costs a retry from another source,
never a corrupt version. Pulls only (a push steps aside), bulk-lane
tickets only (off under TLS; a server without the bulk lane makes it step
aside for good). Over a split store (``split`` before it) each server of the
store has its own tree and this client one relay per server.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable
from typing import Annotated

import grpc

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, check_fields
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.codec import tensor_list
from rlax.core.param_server.transport import transfer
from rlax.core.param_server.transport.bulk_lane import ABSENT, BulkServer, segments_of
from rlax.core.param_server.transport.relay import Relay, relay_hello, relay_key
from rlax.core.param_server.transport.relay_routes import RelayDirectory
from rlax.core.param_server.weights.served import Served
from rlax.core.weight_lane import LaneHost, LaneLink, LaneServer, Pulled, StepAside

log = logging.getLogger("rlax.relay")

HOST_ENV = "RLAX_RELAY_HOST"  # where a worker's relay binds and is reached (wins over host)
MAX_SOURCES = 4  # sources a pull tries (relays, then whatever the server says) before failing


@dataclasses.dataclass(frozen=True)
class RelayLane:
    """The relay lane's settings (``weight_lanes.relay``).

    Args:
      fanout: workers relay the version they pull to up to this many other
        workers each (a tree, transport/relay_routes.py); 0: every worker
        pulls from the server. Needs the bulk lane.
      direct: how many pullers of a version the server feeds itself while
        relays have room.
      host: the address a worker's relay binds and is reached at
        (``RLAX_RELAY_HOST`` wins).
    """

    fanout: Annotated[int, AtLeast(0, means="0: no relays")] = 0
    direct: Annotated[int, AtLeast(1)] = 1
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        check_fields(self)

    def open(self, link: LaneLink) -> OpenRelayLane | None:
        if not link.relay or self.fanout <= 0 or link.settings.tls_cert:
            return None
        return OpenRelayLane(self, link)

    def serve(self, host: LaneHost) -> RelayServer | None:
        return RelayServer(self, host) if self.fanout > 0 else None


class RelayServer(LaneServer):
    """The relay tree on a parameter server: the bulk lane's pulls routed through it.

    Attributes:
      directory: who pulls the served version from whom (transport/relay_routes.py).
    """

    def __init__(self, lane: RelayLane, host: LaneHost):
        self.host = host
        self.directory = RelayDirectory(lane.fanout, lane.direct)

    def start(self) -> None:
        bulk = self.host.half("bulk")
        if isinstance(bulk, BulkServer):  # without it there is nothing to route
            bulk.route = self.route

    def stat(self, reply: pb.StatReply) -> None:
        reply.relay_assignments = self.directory.assigned

    def route(
        self, served: Served, request: pb.PullRequest, context: grpc.ServicerContext
    ) -> pb.PullTicket | None:
        """A ticket pointing the puller to a relay, or None when the server feeds it."""
        port = request.relay_port if self.host.authorized(context) else 0  # relays need the token
        source = self.directory.assign(
            served.number, request.worker, request.relay_host, port, request.failed_source
        )
        if source.direct:
            return None
        reply = pb.PullTicket(
            header=served.header,
            relay_host=source.host,
            relay_port=source.port,
            source=source.name,
            relay_key=relay_key(self.host.settings.token or "", served.number),
        )
        reply.segments.extend(
            pb.Segment(offset=o, length=n, checksum=d) for o, n, d in served.segments
        )
        return reply


class OpenRelayLane:
    """A client's relayed pulls from one server; ``relay`` is its listener."""

    def __init__(self, lane: RelayLane, link: LaneLink):
        settings = link.settings
        self.link, self.host = link, transfer.split_address(settings.address)
        self.absent = False
        host = os.environ.get(HOST_ENV) or lane.host
        self.relay = Relay(settings.token, host, max_connections=lane.fanout + 4)

    def push(
        self,
        header: pb.PartHeader,
        pieces: Iterable[tuple[int, memoryview]],
        sizes: list[int] | None = None,
    ) -> pb.PushReply:
        raise StepAside("a relay carries pulls only")

    def pull(self, have_version: int, buffer: Callable[[int], memoryview]) -> Pulled | None:
        if self.absent:
            raise StepAside(ABSENT)
        try:
            relayed = self._pull(have_version, buffer)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self.absent = True
            raise StepAside(ABSENT) from None
        if relayed is None:
            return None
        return relayed[0].header.version, tensor_list(relayed[0].header), relayed[1]

    def _pull(self, have_version: int, buffer: Callable[[int], memoryview]):
        """(ticket, buffer) of a verified version, or None if the caller has the newest.

        A relay that fails (connection lost, wrong bytes) is reported on the
        next ``OpenPull``, which points elsewhere; after ``MAX_SOURCES`` tries it
        raises the last error (UNAVAILABLE: the caller's retry policy takes over).
        """
        relay, failed, error = self.relay, "", None
        for _ in range(MAX_SOURCES):
            request = pb.PullRequest(
                have_version=have_version,
                worker=self.link.relay_id,
                relay_host=relay.host,
                relay_port=relay.port,
                failed_source=failed,
            )
            ticket = self.link.call("OpenPull", request, 60, pb.PullTicket)
            if not ticket.ticket and not ticket.relay_port:
                return None
            segments = segments_of(ticket)
            buf = buffer(ticket.header.nbytes)
            relay.begin(ticket.header.version, buf)
            try:
                if ticket.relay_port:
                    hello = relay_hello(ticket.header.version, ticket.relay_key)
                    transfer.receive_into(
                        ticket.relay_host,
                        ticket.relay_port,
                        b"",
                        buf,
                        segments,
                        hello=hello,
                        on_progress=relay.progress,
                    )
                else:
                    transfer.receive_into(
                        self.host,
                        ticket.port,
                        ticket.ticket,
                        buf,
                        segments,
                        on_progress=relay.progress,
                    )
            except transfer.BulkError as err:
                relay.fail()
                if not ticket.relay_port:
                    raise  # the server itself: the caller's policy retries
                log.warning(
                    "pull of version %d from relay %s failed (%s); asking for another source",
                    ticket.header.version,
                    ticket.source,
                    err.details(),
                )
                failed, error = ticket.source, err
                continue
            relay.done()
            return ticket, buf
        assert error is not None
        raise transfer.BulkError(grpc.StatusCode.UNAVAILABLE, f"relayed pull: {error.details()}")

    def close(self) -> None:
        self.relay.close()


@hookimpl
def rlax_register_weight_lanes():
    return {"relay": RelayLane}
