"""The bulk lane: weight bytes over a plain TCP connection beside gRPC.

Control stays on gRPC: ``Stage`` (push) or ``OpenPull`` hands out a one-use
ticket and the lane's port, and the bytes flow over the lane's socket
(transport/transfer.py: ``send_part`` / ``receive_into``, every segment
checked against its xxh3_64). Off under TLS (its bytes are not encrypted);
a server that does not serve it (TLS, or ``weight_lanes`` without ``bulk``)
answers UNIMPLEMENTED, and the lane steps aside for good.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Annotated

import grpc

from rlax.core import hookimpl
from rlax.core.constraints import Positive
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.codec import tensor_list
from rlax.core.param_server.transport import transfer
from rlax.core.weight_lane import LaneLink, Pulled, StepAside

ABSENT = "the parameter server has no bulk lane"


class BulkLane:
    """Push and pull over the bulk lane; ``timeout_s``: a transfer's socket timeout."""

    def __init__(self, *, timeout_s: Annotated[float, Positive] = 120.0):
        self.timeout_s = timeout_s
        self.link: LaneLink | None = None
        self.host = ""
        self.absent = False  # the server answered UNIMPLEMENTED

    def open(self, link: LaneLink) -> BulkLane | None:
        if link.settings.tls_cert:
            return None  # the lane's bytes are not encrypted
        lane = copy.copy(self)
        lane.link, lane.host = link, transfer.split_address(link.settings.address)
        return lane

    def control(self, name: str, request):
        """A ticket call; StepAside (for good) if the server does not serve the lane."""
        assert self.link is not None
        if self.absent:
            raise StepAside(ABSENT)
        try:
            return self.link.call(name, request, 60)
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
        ticket = self.control("Stage", header)
        if ticket.duplicate:
            return pb.PushReply(version=ticket.version, duplicate=True)
        reply = transfer.send_part(
            self.host, ticket.port, ticket.ticket, pieces, timeout_s=self.timeout_s
        )
        return pb.PushReply.FromString(reply)

    def pull(self, have_version: int, buffer: Callable[[int], memoryview]) -> Pulled | None:
        ticket = self.control("OpenPull", pb.PullRequest(have_version=have_version))
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


@hookimpl
def rlax_register_weight_lanes():
    return {"bulk": BulkLane}
