"""The trainer's recovery calls to the rollout queue (service ``rlax.v1.Recovery``).

- ``ResumeTrainer``: a restarted trainer tells the queue which checkpoint it
  restored and which weight version it publishes now
  (:meth:`RolloutQueue.resume_trainer`).
- ``ReleaseTakes``: after a Take whose reply was lost (the server restarted),
  the trainer names the takes it holds; any other open take goes back to the
  queue (:meth:`RolloutQueue.release_takes`).

Each call is a JSON object both ways, served beside the protocol's services
by a generic handler, and needs the shared token like every mutating call.
Both are idempotent, so they are retried by the one retry policy
(:mod:`rlax.core.param_server.retry`) while the server is unreachable, for
``retry_s`` whatever the client's own policy.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import grpc

from rlax.core.param_server.queue.service import RolloutQueue
from rlax.core.param_server.queue.state import QueueError
from rlax.core.param_server.retry import RetryPolicy

SERVICE = "rlax.v1.Recovery"
RESUME_METHOD = f"/{SERVICE}/ResumeTrainer"
RELEASE_METHOD = f"/{SERVICE}/ReleaseTakes"
METHODS = (RESUME_METHOD, RELEASE_METHOD)


def handlers(queue: RolloutQueue) -> grpc.GenericRpcHandler:
    """The server side: one generic handler for the service's calls."""

    def resume(args: dict) -> dict:
        return queue.resume_trainer(int(args["restored_version"]), int(args["new_version"]))

    def release(args: dict) -> dict:
        keep = args["keep"]
        if not isinstance(keep, list) or not all(isinstance(t, str) for t in keep):
            raise TypeError("keep must be a list of take ids")
        return {"released": queue.release_takes(keep)}

    def unary(name: str, fn):
        def call(request: bytes, context) -> bytes:
            try:
                args = json.loads(request)
                return json.dumps(fn(args)).encode()
            except QueueError as err:
                context.abort(err.code, str(err))
            except (ValueError, KeyError, TypeError) as err:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: bad request: {err}")
            raise AssertionError("unreachable: context.abort raises")

        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=None, response_serializer=None
        )

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "ResumeTrainer": unary("ResumeTrainer", resume),
            "ReleaseTakes": unary("ReleaseTakes", release),
        },
    )


class RawCaller(Protocol):
    """What these calls need of a client (``ParamServerClient.unary``)."""

    def unary(
        self,
        method: str,
        request: bytes,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
    ) -> bytes: ...


def _call(client: RawCaller, method: str, payload: dict, retry_s: float) -> Any:
    reply = client.unary(
        method, json.dumps(payload).encode(), retry=RetryPolicy(deadline_s=retry_s)
    )
    return json.loads(reply)


def resume_trainer(
    client: RawCaller, *, restored_version: int, new_version: int, retry_s: float = 120.0
) -> dict[str, int]:
    """Tells the server's queue that the trainer resumed; returns what came back to the pool."""
    payload = {"restored_version": restored_version, "new_version": new_version}
    return _call(client, RESUME_METHOD, payload, retry_s)


def release_takes(client: RawCaller, *, keep: list[str], retry_s: float = 120.0) -> int:
    """Returns every open take but ``keep`` to the queue; how many groups went back."""
    return _call(client, RELEASE_METHOD, {"keep": list(keep)}, retry_s)["released"]
