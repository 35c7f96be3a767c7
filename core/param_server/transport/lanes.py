"""Weight lanes: found by name, configured once, opened on a server, tried in order.

``rlax.ps_settings.weight_lanes`` names the lanes (the contract:
:mod:`rlax.core.weight_lane`); :func:`pinned` builds each once, as configured,
into ``ServerSettings.lanes``, so a server (which mounts their server halves,
server.py) and its clients use the same lane settings. :func:`open_lanes`
opens each on a :class:`Link` to one server and chains the ones that apply
into :class:`Lanes`, itself a lane, which the client holds. A push or a pull goes
through the first lane that carries it; one that steps aside
(:class:`~rlax.core.weight_lane.StepAside`) says why, logged once per lane and
reason, and the next one carries it. Nothing here knows a lane's kind.

Lanes are plugin components (``rlax_register_weight_lanes``); the built-ins
(``grpc_lane``, ``bulk_lane``, ``relay_lane``, ``split_lane`` beside this
module) are entry points of rlax's own distribution like every built-in
plugin, and nothing here names them. :func:`factories` reads the plugin
manager loaded last through gin (so ``weight_lanes.<name>.<param>`` bindings
apply); a process that has loaded none (a script, a benchmark, a unit test)
gets the built-ins by their own registration hooks. (That registry is gin's process-global one until the
registry moves out of gin's state, issue 51 item 3; a lane pinned in the
settings no longer depends on it.)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc

from rlax.core.configurables import configurables
from rlax.core.errors import ConfigError
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.retry import RetryPolicy
from rlax.core.param_server.settings import LANE_KIND, ServerSettings, lane_refusal
from rlax.core.plugins import installed_entry_points, is_builtin
from rlax.core.weight_lane import Pulled, StepAside, WeightLane

log = logging.getLogger("rlax.client")

KIND = LANE_KIND  # the plugin kind, also the gin module
SERVICE = "rlax.v1.WeightStore"  # the server's own weight service
_REPLIES: dict[str, Any] = {  # the reply message class of the service's control calls
    "Stat": pb.StatReply,
    "WaitForVersion": pb.VersionInfo,
}
Configured = tuple[tuple[str, WeightLane], ...]  # (name, configured lane) in order


def factories() -> dict[str, Callable[..., Any]]:
    """The weight lanes by name: the manager's loaded last, or the built-ins if none was."""
    return configurables(KIND) or dict(builtins())


@functools.cache
def builtins() -> tuple[tuple[str, Callable[..., Any]], ...]:
    """The built-in lanes by their own registration hooks: the entry points of rlax's own
    distribution that live beside this module (a new built-in lane is its module and its
    entry point, nothing here)."""
    found: dict[str, Callable[..., Any]] = {}
    for entry_point in installed_entry_points():
        if is_builtin(entry_point) and entry_point.value.startswith(f"{__package__}."):
            found.update(entry_point.load().rlax_register_weight_lanes())
    return tuple(sorted(found.items()))


def check_names(names: Sequence[str], known: Iterable[str] | None = None) -> None:
    """Raises ConfigError unless ``names`` is a non-empty list of known lanes."""
    why = lane_refusal(names, factories() if known is None else known)
    if why is not None:
        raise ConfigError(f"rlax.ps_settings.weight_lanes: {why}")


def configured(settings: ServerSettings) -> Configured:
    """``settings.weight_lanes``' lanes in order: pinned ones as pinned, the others built
    from the registry (their gin bindings apply). ConfigError for an unknown name."""
    pins = dict(settings.lanes)
    missing = [name for name in settings.weight_lanes if name not in pins]
    if missing or not settings.weight_lanes:
        found = factories()
        check_names(missing or settings.weight_lanes, found)
        pins.update((name, found[name]()) for name in missing)
    return tuple((name, pins[name]) for name in settings.weight_lanes)


def pinned(settings: ServerSettings) -> ServerSettings:
    """``settings`` with its lanes built once (:func:`configured`) and kept in ``lanes``."""
    return dataclasses.replace(settings, lanes=configured(settings))


@dataclasses.dataclass(frozen=True)
class Link:
    """A client's way to one server, as its lanes see it (the contract's ``LaneLink``).

    ``after``: the configured lanes listed after the lane this link was handed
    to (what :meth:`onward` opens).
    """

    settings: ServerSettings
    channel: grpc.Channel
    metadata: tuple[tuple[str, str], ...]
    retry: RetryPolicy
    relay: bool = False
    relay_id: str = ""
    after: Configured = ()
    _stubs: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def call(self, name: str, request: Any, timeout: float, reply: Any = None) -> Any:
        path = name if name.startswith("/") else f"/{SERVICE}/{name}"
        stub = self._stubs.get(path)
        if stub is None:
            reply = reply or _REPLIES.get(name)
            stub = self._stubs[path] = self.channel.unary_unary(
                path,
                request_serializer=getattr(type(request), "SerializeToString", None),
                response_deserializer=reply.FromString if reply is not None else None,
            )
        return self.retry.call(name, lambda: stub(request, metadata=self.metadata, timeout=timeout))

    def onward(self, address: str | None) -> Lanes:
        if address is None:
            return open_lanes(dataclasses.replace(self, _stubs={}), self.after)
        settings = dataclasses.replace(self.settings, address=address)
        channel = settings.channel()
        link = dataclasses.replace(self, settings=settings, channel=channel, _stubs={})
        lanes = open_lanes(link, self.after)
        lanes.owned.append(channel)
        return lanes


def open_lanes(link: Link, lanes: Configured) -> Lanes:
    """The configured ``lanes`` opened on ``link``'s server, in order (those that apply)."""
    opened: list[tuple[str, WeightLane]] = []
    try:
        for i, (name, configured_lane) in enumerate(lanes):
            lane = configured_lane.open(dataclasses.replace(link, after=lanes[i + 1 :]))
            if lane is not None:
                opened.append((name, lane))
    except BaseException:
        Lanes(opened, link).close()
        raise
    return Lanes(opened, link)


class Lanes:
    """Opened lanes in order, one lane to the client: each transfer goes to the first
    that carries it. ``link``: the server they reach (for a lane's control calls)."""

    def __init__(self, lanes: list[tuple[str, WeightLane]], link: Link):
        self.lanes, self.link = lanes, link
        self.owned: list[grpc.Channel] = []  # connections opened for these lanes alone
        self._told: set[tuple[str, str]] = set()

    def get(self, name: str) -> Any:
        """The opened lane ``name``, or None (not listed, or nothing to carry here)."""
        return dict(self.lanes).get(name)

    def open(self, link: Any) -> Lanes:
        return self

    def push(
        self,
        header: pb.PartHeader,
        pieces: Iterable[tuple[int, memoryview]],
        sizes: list[int] | None = None,
    ) -> pb.PushReply:
        for name, lane in self.lanes:
            try:
                return lane.push(header, pieces, sizes)
            except StepAside as aside:
                self._aside(name, aside)
        raise StepAside(
            f"no weight lane carries a push to {self.link.settings.address} "
            f"(opened: {', '.join(n for n, _ in self.lanes) or 'none'})"
        )

    def pull(self, have_version: int, buffer: Callable[[int], memoryview]) -> Pulled | None:
        for name, lane in self.lanes:
            try:
                return lane.pull(have_version, buffer)
            except StepAside as aside:
                self._aside(name, aside)
        raise StepAside(
            f"no weight lane carries a pull from {self.link.settings.address} "
            f"(opened: {', '.join(n for n, _ in self.lanes) or 'none'})"
        )

    def _aside(self, name: str, aside: StepAside) -> None:
        if (name, str(aside)) not in self._told:
            self._told.add((name, str(aside)))
            log.info("weight lane %s steps aside: %s", name, aside)

    def close(self) -> None:
        for _, lane in reversed(self.lanes):
            lane.close()
        for channel in self.owned:
            channel.close()
