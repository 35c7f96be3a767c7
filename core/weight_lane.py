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

The factory builds a lane as configured: its keyword parameters are the
lane's own settings (gin ``weight_lanes.<name>.<param>``; the built-ins are
frozen dataclasses of them, so a configured lane is a value that travels with
the server settings to every process, ``ServerSettings.lanes``). Each client
then calls ``open(link)`` with its way to one server (:class:`LaneLink`) and
uses what that returns.

A lane the server takes part in has a server half (:class:`HasServerHalf`):
its ``serve(host)`` is called once by every parameter server whose
``weight_lanes`` lists the lane, with the server as a :class:`LaneHost`, and
returns a
:class:`LaneServer` (gRPC handlers to mount, methods that need the token,
start and stop, figures for ``Stat``) or None when it has nothing to serve
there. The server mounts what it gets and never asks which lane it holds;
a lane that mounts nothing on a server makes its clients step aside.
Re-exported by :mod:`rlax.core.contracts`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

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
        """The client's resolved ``ServerSettings`` (address, token, TLS, chunk size); a
        lane's own options are its factory's parameters, not read here."""

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

    def call(self, name: str, request: Any, timeout: float, reply: Any = None) -> Any:
        """A unary call to the server, with the client's token, retried by its policy.

        ``name``: a method of the ``WeightStore`` service (``Stat``,
        ``WaitForVersion``, or one a lane's server half mounts there, e.g. ``Stage``)
        or a full method path (``/my.Service/Method``) of a lane's own service;
        ``request``: a protobuf message or bytes; ``reply``: the reply's message
        class (None: ``Stat``'s and ``WaitForVersion``'s are known; bytes otherwise).
        """

    def onward(self, address: str | None) -> WeightLane:
        """The lanes listed after this one, opened on the server at ``address`` (None:
        this link's own) and chained as one lane, for a lane that splits or forwards
        transfers; closing it closes them (and the connection it opened)."""


class WeightLane(Protocol):
    """One way of carrying weight bytes: built by its factory, opened per server.

    A lane the server takes part in is also a :class:`HasServerHalf`.
    """

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


@runtime_checkable
class HasServerHalf(Protocol):
    """A lane the parameter server takes part in (an optional capability of a lane)."""

    def serve(self, host: LaneHost) -> LaneServer | None:
        """This lane's server half on ``host``, a parameter server whose ``weight_lanes``
        list it (called once per server, before it binds), or None when it has nothing
        to serve there (e.g. its settings leave it off)."""


class LaneHost(Protocol):
    """What a lane's ``serve`` is handed: the parameter server its server half mounts on."""

    @property
    def settings(self) -> Any:
        """The server's resolved ``ServerSettings``; ``settings.lanes`` are its configured
        lanes by name, in order (a half that starts more servers hands them on)."""

    @property
    def weights(self) -> Any:
        """The server's weight store (``weights/store.py``): ``begin``/``commit``/``abandon``
        a pushed part, ``open_pull``/``close_pull`` the served version, ``version``."""

    def half(self, name: str) -> LaneServer | None:
        """The server half of lane ``name`` on this server, or None if none is mounted (for
        a lane that works through another's, as relays through the bulk lane's tickets).
        Every half is made before the first ``start``, so this is complete from then."""

    def start_server(self, settings: Any) -> Any:
        """Starts a weight-only server like this one, serving ``settings`` (its own address
        and lanes), in a child process that exits with this one; returns the process
        (``multiprocessing``'s: ``terminate``, ``join``). For a lane that spreads a store."""

    def authorized(self, context: Any) -> bool:
        """Whether a call (its ``grpc.ServicerContext``) carries the server's token: for a
        method open to everyone that gives token holders more."""


class LaneServer:
    """The server half of a weight lane, as ``serve`` returns it: subclass and override
    what the lane needs (the defaults mount nothing, start nothing, add nothing).

    Attributes:
      protected: full method names (``/rlax.v1.WeightStore/Stage``) among
        :meth:`handlers`' that need the token; a call without it is
        UNAUTHENTICATED and never reaches the handler.
      splits_versions: this server's store holds part of each version (the rest
        is on other servers), so a version is saved by pulling it through a
        client, never read from the local store.
    """

    protected: Sequence[str] = ()
    splits_versions: bool = False

    def handlers(self) -> Sequence[Any]:
        """The ``grpc.GenericRpcHandler`` objects to mount on the server (read once)."""
        return ()

    def start(self) -> None:
        """Called once the server has bound its port, before it serves a call."""

    def stop(self) -> None:
        """Called once the server has stopped serving calls; releases what ``start`` made."""

    def stat(self, reply: Any) -> None:
        """Adds this half's figures to a ``StatReply`` (e.g. ``bytes_served``)."""
