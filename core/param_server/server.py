"""One gRPC server process hosting WeightStore and RolloutQueue, and its weight lanes.

The ``WeightStore`` service (``Push``/``Pull`` streams, ``Stat``,
``WaitForVersion``) is the server's own: the gRPC lane's bytes and every other
lane's control calls ride on it, and it is the one path that works under TLS.
Weight chunks on it travel as raw serialized messages (identity
(de)serializers, the chunk codec of transport/chunk_codec.py). Every other way
of carrying weights is a lane's server half (core/weight_lane.py): the server
mounts the half of each lane of ``weight_lanes`` that has one (the bulk
lane's listener and tickets, the relay tree, a split store's shards) and
never asks which lane it holds. Mutating calls, and the methods a half
protects, need the shared token in the ``authorization`` metadata; a missing
or wrong token is UNAUTHENTICATED and touches nothing.
"""

from __future__ import annotations

import concurrent.futures
import hmac
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Collection, Iterator, Sequence
from typing import Any, NoReturn

import grpc

from rlax.core.parallel.host_memory import keep_message_buffers
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.queue import recovery
from rlax.core.param_server.queue.service import RolloutQueue
from rlax.core.param_server.queue.state import QueueError
from rlax.core.param_server.settings import ADDRESS_ENV, MB, ServerSettings
from rlax.core.param_server.transport import lanes
from rlax.core.param_server.weights.parts import PushRejected
from rlax.core.param_server.weights.store import WeightStore
from rlax.core.types import Prompt
from rlax.core.weight_lane import HasServerHalf, LaneServer

log = logging.getLogger("rlax.param_server")

PROTECTED = {
    *recovery.METHODS,
    "/rlax.v1.WeightStore/Push",
    "/rlax.v1.RolloutQueue/Lease",
    "/rlax.v1.RolloutQueue/Submit",
    "/rlax.v1.RolloutQueue/SubmitPartial",
    "/rlax.v1.RolloutQueue/Take",
    "/rlax.v1.RolloutQueue/Ack",
}


def _deny(request: Any, context: grpc.ServicerContext) -> NoReturn:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")


class _TokenCheck(grpc.ServerInterceptor):
    def __init__(self, token: str | None, protected: Collection[str]):
        if not token:  # ServerSettings.resolved() reads it, or raises
            raise ValueError("parameter server: no token to check calls against")
        self._expected = f"Bearer {token}".encode()
        self._protected = frozenset(protected)

    def intercept_service(self, continuation, details):
        if details.method not in self._protected:
            return continuation(details)
        given = dict(details.invocation_metadata).get("authorization", "")
        if hmac.compare_digest(given.encode(), self._expected):
            return continuation(details)
        log.warning("rejected %s: missing or wrong token", details.method)
        handler = continuation(details)  # the denial takes the method's own shape
        if handler is None:
            return None
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(_deny)
        return grpc.unary_unary_rpc_method_handler(_deny)


class ParamServer:
    """The services' state plus the gRPC glue. ``start()`` binds; ``stop()`` shuts down.

    It is the :class:`~rlax.core.weight_lane.LaneHost` its lanes' server halves
    are given (``settings``, ``weights``, :meth:`half`, :meth:`authorized`).
    """

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
        self.settings = lanes.pinned(settings.resolved())
        keep_message_buffers()
        self.weights = WeightStore(
            max_version_bytes=self.settings.max_version_mb * MB,
            chunk_bytes=self.settings.chunk_mb * MB,
        )
        self.queue = RolloutQueue(
            prompts,
            capacity=capacity,
            lease_ttl_s=lease_ttl_s,
            version_fn=lambda: self.weights.version,
            curricula=curricula,
            db=queue_db,  # a persist.QueueDB: the queue's state survives a restart
        )
        self.halves: dict[str, LaneServer] = {}  # the lanes' server halves, in lane order
        for name, lane in self.settings.lanes:
            half = lane.serve(self) if isinstance(lane, HasServerHalf) else None
            if half is not None:
                self.halves[name] = half
        protected = PROTECTED.union(*(h.protected for h in self.halves.values()))
        self._server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=threads),
            interceptors=[_TokenCheck(self.settings.token, protected)],
            options=self.settings.grpc_options(),
        )
        handlers = [self._weight_handlers(), self._queue_handlers(), recovery.handlers(self.queue)]
        for half in self.halves.values():
            handlers.extend(half.handlers())
        self._server.add_generic_rpc_handlers(handlers)
        self._started: list[LaneServer] = []
        self.port = 0

    def start_server(self, settings: ServerSettings) -> multiprocessing.process.BaseProcess:
        """A weight-only server like this one, serving ``settings`` (its own address and
        lanes) in a child process (spawned) that exits when this process does."""
        ctx = multiprocessing.get_context("spawn")
        proc = ctx.Process(
            target=serve_weights,
            args=(settings, os.getpid()),
            name=f"rlax-weight-server-{settings.address}",
            daemon=True,
        )
        proc.start()
        return proc

    def half(self, name: str) -> Any:
        """The server half of lane ``name`` on this server, or None (not listed, or nothing
        to serve here)."""
        return self.halves.get(name)

    @property
    def holds_whole_versions(self) -> bool:
        """Whether this server's store holds every version whole (no half splits it)."""
        return not any(h.splits_versions for h in self.halves.values())

    def start(self) -> int:
        creds = self.settings.server_credentials()
        address = self.settings.address
        if creds is None:
            self.port = self._server.add_insecure_port(address)
        else:
            self.port = self._server.add_secure_port(address, creds)
        if not self.port:
            raise OSError(f"parameter server: cannot bind {address}")
        try:
            for half in self.halves.values():
                half.start()
                self._started.append(half)
            self._server.start()
        except BaseException:
            self._stop_halves()
            raise
        log.info(
            "parameter server listening on %s (port %d, tls=%s, lanes served: %s)",
            address,
            self.port,
            bool(creds),
            ", ".join(self.halves) or "grpc only",
        )
        return self.port

    def stop(self, grace: float | None = 1.0) -> None:
        self._server.stop(grace).wait()
        self._stop_halves()

    def _stop_halves(self) -> None:
        while self._started:
            self._started.pop().stop()

    def wait(self) -> None:
        self._server.wait_for_termination()

    def authorized(self, context: grpc.ServicerContext) -> bool:
        """Whether a call carries this server's token."""
        given = dict(context.invocation_metadata()).get("authorization", "")
        return hmac.compare_digest(str(given).encode(), f"Bearer {self.settings.token}".encode())

    # -- WeightStore --------------------------------------------------------

    def _push(self, request_iterator, context):
        try:
            return self.weights.push(request_iterator)
        except PushRejected as err:
            log.warning("push rejected: %s", err)
            context.abort(err.code, str(err))

    def _pull(self, request: pb.PullRequest, context):
        yield from self.weights.messages_for(request.have_version)

    def _wait(self, request: pb.WaitRequest, context):
        return pb.VersionInfo(
            version=self.weights.wait_for(request.after_version, request.timeout_s)
        )

    def _stat(self, request, context):
        reply = pb.StatReply(
            version=self.weights.version,
            version_bytes=self.weights.version_bytes,
            pushes_rejected=self.weights.rejected,
            queue=self.queue.stats(),
        )
        for half in self.halves.values():
            half.stat(reply)
        return reply

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


def serve_weights(settings: ServerSettings, parent: int | None = None) -> None:
    """Serves weights only (no prompts) at ``settings.address`` until SIGTERM/SIGINT (or
    until process ``parent`` exits): a shard of a split store."""
    os.environ.pop(ADDRESS_ENV, None)  # the main server's address is not this one's
    server = ParamServer(settings, iter(()), capacity=1)
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        if parent is not None and os.getppid() != parent:
            break  # the server that started this one is gone
    server.stop(grace=1.0)


def _unary(fn, request_cls, reply_cls):
    return grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=request_cls.FromString,
        response_serializer=reply_cls.SerializeToString,
    )
