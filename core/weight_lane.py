"""The weight-lane contract: how a version's bytes travel between a client and a server.

A weight lane is one way of moving weight bytes: gRPC streams, the bulk TCP
lane, a worker's relay, a store split over several servers (the built-ins,
``core/param_server/transport/``), or a third party's. Each is a plugin
component (``rlax_register_weight_lanes``, gin module ``weight_lanes``), and
``rlax.ps_settings.weight_lanes`` names the ones a client uses, in order:
every push and every pull goes through the first lane that carries it, and a
lane that cannot (the server lacks its service, its settings leave it off)
steps aside for the next by raising :class:`StepAside`. The client never
asks which lane it holds.

The factory builds a lane as configured (its gin parameters); each client
then calls ``open(link)`` with its way to one server (:class:`LaneLink`) and
uses what that returns. Re-exported by :mod:`rlax.core.contracts`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

# A pull's result: (version, tensor list, buffer). Each tensor is a dict with
# "name", "shape", "offset", "nbytes" and "dtype"; the buffer holds them whole.
Pulled = tuple[int, list[dict[str, Any]], memoryview]


class StepAside(Exception):
    """Raised by a lane that cannot carry a transfer, before it has read any of it.

    The client logs the message once (it says why, e.g. "the server has no
    bulk lane") and hands the transfer to the next lane in its list.
    """


class LaneLink(Protocol):
    """What a client hands a lane's ``open``: its way to one parameter server."""

    @property
    def settings(self) -> Any:
        """The client's resolved ``ServerSettings`` (address, token, TLS, chunk size, relay
        fan-out, weight shards): a lane reads its own options there."""

    @property
    def channel(self) -> Any:
        """The client's ``grpc.Channel`` to the server (shared: a lane never closes it)."""

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata that authenticates this client (its bearer token)."""

    @property
    def relay(self) -> bool:
        """Whether this client offers what it pulls to other pullers (workers do)."""

    @property
    def relay_id(self) -> str:
        """This client's name among the server's pullers (unique per process)."""

    def call(self, name: str, request: Any, timeout: float) -> Any:
        """A unary call of the server's ``WeightStore`` service by method name (``Stage``,
        ``OpenPull``, ``Stat``, ``WaitForVersion``), retried by the client's policy."""

    def onward(self, address: str | None) -> WeightLane:
        """The lanes listed after this one, opened on the server at ``address`` (None:
        this link's own) and chained as one lane, for a lane that splits or forwards
        transfers; closing it closes them (and the connection it opened)."""


class WeightLane(Protocol):
    """One way of carrying weight bytes: built by its factory, opened per server."""

    def open(self, link: LaneLink) -> WeightLane | None:
        """This lane bound to ``link``'s server (itself or a copy); None when it has
        nothing to carry for that client (e.g. a relay lane for a client that does
        not relay). Called once per client and server, before any transfer."""

    def push(
        self,
        header: Any,
        pieces: Iterable[tuple[int, memoryview]],
        sizes: list[int] | None,
    ) -> Any:
        """Carries one part of a version; returns the server's ``PushReply``.

        ``header`` is the part's ``PartHeader``; ``pieces`` its bytes as
        (offset, view) pairs in order, read once; ``sizes`` each whole
        tensor's bytes by index for a part that does not name every tensor
        (else None). Raises :class:`StepAside` before reading ``pieces`` when it
        cannot carry the part, and ``grpc.RpcError`` when the server refuses it.
        """

    def pull(self, have_version: int, buffer: Callable[[int], memoryview]) -> Pulled | None:
        """The newest version as ``(version, tensor list, buffer)``, or None if it is
        ``have_version``.

        Once the version's size is known the lane calls ``buffer(nbytes)`` (once)
        and receives into the view it returns, checking every byte against the
        server's checksums; it returns that view. Raises :class:`StepAside`
        before calling ``buffer`` when it cannot carry the pull.
        """

    def close(self) -> None:
        """Releases what ``open`` made (listeners, connections); called once, at the end."""
