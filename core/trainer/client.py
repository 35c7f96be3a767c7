"""The parameter-server client as the trainer uses it, made restart-proof.

Every call follows the one retry policy (:mod:`rlax.core.param_server.retry`)
for ``retry_s`` while the server is unreachable (restarting), with the
trainer's two rules as its hooks:

- after a preemption notice it stops at once instead of waiting for a server
  that is gone too: a Take raises :class:`~rlax.core.errors.Preempted`
  (waiting for rollouts is a safe point: nothing of the step is trained yet,
  and the takes left open go back to the queue when the trainer resumes);
  any other call raises :class:`~rlax.core.errors.LostStep` (the step is redone);
- before a Take is repeated, every open take but the ones the trainer holds
  goes back to the queue (``ReleaseTakes``): a Take whose reply was lost may
  have been recorded, and nobody would acknowledge it.

The queue's other calls are idempotent (a repeated Ack or push is
recognised); a push refused as already done after a retry (its first try got
through before the connection broke) counts as done once the server serves
the version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import grpc

from rlax.core.errors import LostStep, Preempted
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.queue import recovery
from rlax.core.param_server.retry import RetryPolicy
from rlax.core.param_server.settings import ServerSettings
from rlax.core.runtime.preemption import Preemption
from rlax.core.wire import WirePlan


class TrainerClient:
    """A :class:`ParamServerClient` (built not to retry) with the trainer's retry rules."""

    def __init__(self, client: ParamServerClient, preemption: Preemption, retry_s: float = 300.0):
        self._client, self._preemption = client, preemption
        self.retry = RetryPolicy(deadline_s=retry_s, stop=self._stop_after_notice)
        self._held: list[str] = []  # the takes this trainer holds (not acknowledged yet)

    @property
    def settings(self) -> ServerSettings:
        return self._client.settings

    def _stop_after_notice(self, what: str, err: grpc.RpcError) -> None:
        """After a notice the server is gone too (the machine is being taken): stop now."""
        if not self._preemption.requested:
            return
        if what == "Take":  # nothing of the step trained yet: a safe point
            raise Preempted("stopped while waiting for rollouts") from err
        raise LostStep(f"{what} failed after the notice ({err.code().name})") from err

    def stat(self) -> Any:
        return self.retry.call("Stat", self._client.stat)

    def take(self, max_groups: int, **kwargs: Any) -> tuple[str, list, int]:
        """``ParamServerClient.take``, after a notice not at all (raises Preempted)."""
        if self._preemption.requested:
            raise Preempted("stopped while waiting for rollouts")
        release = lambda: recovery.release_takes(self._client, keep=self._held)
        take_id, groups, stale = self.retry.call(
            "Take", lambda: self._client.take(max_groups, **kwargs), before_retry=release
        )
        if groups:
            self._held.append(take_id)
        return take_id, groups, stale

    def ack(self, take_id: str) -> int:
        consumed = self.retry.call("Ack", lambda: self._client.ack(take_id))
        if take_id in self._held:
            self._held.remove(take_id)
        return consumed

    def push(self, plan: WirePlan, tree: Any, version: int, probe: Any = None) -> Any:
        committed = pb.PushReply(version=version, committed=True)
        push = lambda: self._client.push(plan, tree, version, probe)
        return self._push(version, push, committed)

    def push_part(self, header: Any, pieces: Iterable) -> Any:
        """One trainer process's part of a version, retried like :meth:`push`.

        A retry sends the same ``push_id``, so a part that got through is
        answered as a duplicate.
        """
        pieces = list(pieces)  # views into one buffer: a retry sends them again
        duplicate = pb.PushReply(version=header.version, duplicate=True)
        push = lambda: self._client.push_part(header, iter(pieces))
        return self._push(header.version, push, duplicate)

    def _push(self, version: int, push: Callable[[], Any], done: Any) -> Any:
        """``push()`` retried; ``done`` if a retry was refused because an earlier try got through."""
        retried: list[bool] = []
        try:
            return self.retry.call("Push", push, before_retry=lambda: retried.append(True))
        except grpc.RpcError as err:
            if not (retried and err.code() == grpc.StatusCode.FAILED_PRECONDITION):
                raise
            if self._client.stat().version >= version:  # the version is served: ours arrived
                return done
            raise

    def unary(
        self,
        method: str,
        request: bytes,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
    ) -> bytes:
        """``ParamServerClient.unary`` (the recovery calls, retried by their own policy)."""
        return self._client.unary(method, request, timeout=timeout, retry=retry)

    def close(self) -> None:
        self._client.close()
