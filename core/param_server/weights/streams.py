"""The WeightStore's gRPC streams: a Push stream's messages into parts, a version out as a Pull's.

``WeightStore.Push`` carries one or more parts, each a header message and then
its data chunks (:mod:`rlax.core.param_server.transport.chunk_codec`); a
chunk's bytes are written into the part as they arrive and verified
(:mod:`rlax.core.param_server.weights.parts`), and the parts are committed once
the stream ends. Anything out of order — data before a header, a header before
the previous part is complete, a chunk of another part — fails the push and
releases every part it began. ``Pull`` sends the served version the same way.
The store these run against is :mod:`rlax.core.param_server.weights.store`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.transport.chunk_codec import decode_chunk, encode_chunk
from rlax.core.param_server.weights.parts import BAD, Part, PushRejected

if TYPE_CHECKING:
    from rlax.core.param_server.weights.store import WeightStore


def receive_push(store: WeightStore, messages: Iterable[bytes]) -> pb.PushReply:
    """Consumes one gRPC Push stream of raw WeightChunk messages into ``store``; commits
    the parts it completes, or raises (PushRejected: a bad push) with every part it began
    abandoned. A header already pushed returns the earlier reply."""
    part: Part | None = None
    done: list[Part] = []
    try:
        for raw in messages:
            try:
                decoded = decode_chunk(raw)
                chunk = pb.WeightChunk.FromString(raw) if decoded is None else None
            except (DecodeError, ValueError):  # garbage bytes
                raise PushRejected(BAD, "undecodable weight chunk") from None
            if chunk is not None:
                if part is not None:
                    raise PushRejected(
                        BAD,
                        f"part {part.header.part} ended after "
                        f"{part.received} of {part.header.nbytes} bytes",
                    )
                if chunk.data:
                    raise PushRejected(BAD, "a header message carries no data")
                started = store.begin(chunk.header)
                if isinstance(started, pb.PushReply):
                    for p in done:
                        store.abandon(p, rejected=False)
                    return started
                part = started
                if part.complete:  # an empty part: a host that holds no blocks
                    done.append(part)
                    part = None
                continue
            assert decoded is not None  # no header message: decode_chunk read a data chunk
            index, offset, data, digest = decoded
            if part is None:
                raise PushRejected(BAD, "data chunk before any header")
            if index != part.header.part:
                raise PushRejected(BAD, f"chunk of part {index} inside part {part.header.part}")
            part.write(offset, data, digest)
            if part.complete:
                done.append(part)
                part = None
        if part is not None or not done:
            raise PushRejected(BAD, "push ended before its part was complete")
        return store.commit(done)
    except BaseException as err:
        rejected = isinstance(err, PushRejected)
        for p in [*done, *([part] if part else [])]:
            store.abandon(p, rejected=False)
        if rejected:
            store.note_rejected()
        raise


def pull_messages(store: WeightStore, have_version: int) -> Iterator[bytes]:
    """The wire messages of ``store``'s newest version (none if the caller has it): its
    header, then its segments as data chunks, each with its checksum. The version is held
    for reading (:meth:`WeightStore.open_pull`) until the stream ends."""
    served = store.open_pull(have_version)
    if served is None:
        return
    try:
        yield pb.WeightChunk(header=served.header, part=0).SerializeToString()
        for offset, length, digest in served.segments:
            yield encode_chunk(0, offset, served.read(offset, length), digest)
    finally:
        store.close_pull(served)
