"""The relay lane: a worker pulls where the server points it, and relays what it pulls.

With ``rlax.ps_settings.relay_fanout = k > 0`` a relaying client (a worker)
opens a :class:`~rlax.core.param_server.transport.relay.Relay` beside it and
offers it on every ``OpenPull``; the server answers with a bulk-lane ticket
or the address of a relay already holding the version (the tree:
transport/relay_routes.py). Every segment is checked against the checksums
the *server* gave, so a failing relay costs a retry from another source,
never a corrupt version. Pulls only (a push steps aside), bulk-lane
tickets only (off under TLS; a server without the bulk lane makes it step
aside for good). Over a split store (``split`` before it) each server of the
store has its own tree and this client one relay per server.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable

import grpc

from rlax.core import hookimpl
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.codec import tensor_list
from rlax.core.param_server.transport import transfer
from rlax.core.param_server.transport.bulk_lane import ABSENT, segments_of
from rlax.core.param_server.transport.relay import Relay, relay_hello
from rlax.core.weight_lane import LaneLink, Pulled, StepAside

log = logging.getLogger("rlax.relay")

MAX_SOURCES = 4  # sources a pull tries (relays, then whatever the server says) before failing


class RelayLane:
    """Relayed pulls; ``relay`` is this client's listener once opened."""

    def __init__(self) -> None:
        self.link: LaneLink | None = None
        self.relay: Relay | None = None
        self.host = ""
        self.absent = False

    def open(self, link: LaneLink) -> RelayLane | None:
        settings = link.settings
        if not link.relay or settings.relay_fanout <= 0 or settings.tls_cert:
            return None
        lane = copy.copy(self)
        lane.link, lane.host = link, transfer.split_address(settings.address)
        lane.relay = Relay(
            settings.token, settings.relay_host, max_connections=settings.relay_fanout + 4
        )
        return lane

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
        assert self.link is not None and self.relay is not None
        relay, failed, error = self.relay, "", None
        for _ in range(MAX_SOURCES):
            request = pb.PullRequest(
                have_version=have_version,
                worker=self.link.relay_id,
                relay_host=relay.host,
                relay_port=relay.port,
                failed_source=failed,
            )
            ticket = self.link.call("OpenPull", request, 60)
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
        if self.relay is not None:
            self.relay.close()


@hookimpl
def rlax_register_weight_lanes():
    return {"relay": RelayLane}
