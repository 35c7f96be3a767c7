"""The gRPC lane: weight bytes as streams of hand-encoded ``WeightChunk`` messages.

``WeightStore.Push`` / ``Pull`` (the chunk codec: transport/chunk_codec.py). These
are the server's own service (server.py), not a lane's server half: every
server serves them, TLS or not, so this lane carries whatever the lanes before
it in ``rlax.ps_settings.weight_lanes`` step aside from, and never steps aside.
Pushes are not retried here (the trainer repeats a whole push,
:mod:`rlax.core.trainer.client`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rlax.core import hookimpl
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.codec import tensor_list
from rlax.core.param_server.transport.chunk_codec import decode_chunk, encode_chunk
from rlax.core.param_server.transport.transfer import checksum
from rlax.core.weight_lane import LaneLink, Pulled


@dataclasses.dataclass(frozen=True)
class GrpcLane:
    """Push and pull over gRPC streams (``weight_lanes.grpc``: no settings)."""

    def open(self, link: LaneLink) -> OpenGrpcLane:
        return OpenGrpcLane(link)


class OpenGrpcLane:
    """A client's gRPC streams to one server."""

    def __init__(self, link: LaneLink):
        self._metadata = link.metadata
        self._push: Any = link.channel.stream_unary(
            "/rlax.v1.WeightStore/Push",
            request_serializer=None,
            response_deserializer=pb.PushReply.FromString,
        )
        self._pull: Any = link.channel.unary_stream(
            "/rlax.v1.WeightStore/Pull",
            request_serializer=pb.PullRequest.SerializeToString,
            response_deserializer=None,
        )

    def push(
        self,
        header: pb.PartHeader,
        pieces: Iterable[tuple[int, memoryview]],
        sizes: list[int] | None = None,
    ) -> pb.PushReply:
        return self._push(messages(header, pieces), metadata=self._metadata)

    def pull(self, have_version: int, buffer: Callable[[int], memoryview]) -> Pulled | None:
        header, buf, received = None, None, 0
        for raw in self._pull(pb.PullRequest(have_version=have_version)):
            decoded = decode_chunk(raw)
            if decoded is None:
                header = pb.WeightChunk.FromString(raw).header
                buf = buffer(header.nbytes)
                continue
            _, offset, data, digest = decoded
            if (
                header is None
                or buf is None
                or offset != received
                or offset + len(data) > header.nbytes
            ):
                raise ValueError(f"pull: chunk at {offset}, expected {received}")
            if checksum(data) != digest:
                raise ValueError(f"pull of version {header.version}: checksum mismatch at {offset}")
            buf[offset : offset + len(data)] = data
            received += len(data)
        if header is None or buf is None:
            return None
        if received != header.nbytes:
            raise ValueError(
                f"pull of version {header.version}: {received} of {header.nbytes} bytes"
            )
        return header.version, tensor_list(header), buf

    def close(self) -> None:
        pass  # the channel is the client's


def messages(header: pb.PartHeader, pieces: Iterable[tuple[int, memoryview]]) -> Iterator[bytes]:
    """The gRPC wire messages of one part: its header, then one chunk per piece."""
    yield pb.WeightChunk(header=header, part=header.part).SerializeToString()
    for offset, view in pieces:
        yield encode_chunk(header.part, offset, view)


@hookimpl
def rlax_register_weight_lanes():
    return {"grpc": GrpcLane}
