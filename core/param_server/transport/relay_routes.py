"""Who a puller gets the served version from: the server itself, or a relay.

With ``weight_lanes.relay.fanout = k > 0`` a worker pulling version v
offers to serve it on (its ``OpenPull`` carries ``relay_host``/``relay_port``),
and relays the bytes *as they arrive* (cut-through) to the workers the server
points to it. The server sends each version directly to at most
``weight_lanes.relay.direct`` pullers; every later puller is pointed to the earliest
registered holder of v with fewer than k pullers of its own, and registers in
turn — a tree of fanout k grown breadth first, in which every new node brings
k free places, so there is always one.

Failures (:meth:`RelayDirectory.assign` with ``failed``): a puller whose relay
broke off reports it on its next ``OpenPull``; that relay and every node
below it leave the tree (their bytes came through it, so they will fail and
ask again), and the puller is pointed elsewhere — another relay with room,
or, if none, the server. A puller that asks again (its own source failed) is
removed with its subtree before it is placed, so it is never placed below
itself. The tree holds the served version only: when a newer version
commits, the tree starts again, so a relay holding an older version is never
pointed to (and the puller checks every segment against the server's
checksums, so a relay that serves wrong bytes costs a retry, never a corrupt
version).
"""

from __future__ import annotations

import dataclasses
import threading


@dataclasses.dataclass
class Node:
    """A puller of the current version that relays it."""

    worker: str
    host: str
    port: int
    parent: str  # "" when the server feeds it
    serial: int = 0  # which registration of this worker (a report names one)
    children: int = 0


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a pull's bytes come from: the server (``worker == ""``) or a relay."""

    worker: str = ""
    host: str = ""
    port: int = 0
    serial: int = 0

    @property
    def direct(self) -> bool:
        return not self.worker

    @property
    def name(self) -> str:
        """How a puller names this source when it reports it failed: ``worker#serial``."""
        return f"{self.worker}#{self.serial}" if self.worker else ""


class RelayDirectory:
    """The relay tree of the served version (thread-safe).

    Args:
      fanout: the most pullers one relay feeds (0: no relays, every pull is direct).
      direct: the most pullers the server feeds per version while relays have room.
    """

    def __init__(self, fanout: int, direct: int = 1):
        if fanout < 0 or direct < 1:
            raise ValueError(f"relays: fanout {fanout} must be >= 0 and direct {direct} >= 1")
        self.fanout, self.direct = fanout, direct
        self._lock = threading.Lock()
        self._version = -1
        self._nodes: dict[str, Node] = {}  # in the order they joined (breadth first)
        self._direct_count = 0
        self._serial = 0
        self.assigned = 0  # pulls pointed to a relay, all versions
        self.direct_pulls = 0  # pulls the server fed, all versions

    def assign(
        self, version: int, worker: str, host: str = "", port: int = 0, failed: str = ""
    ) -> Source:
        """The source of ``worker``'s pull of ``version``; registers it as a relay if it offers.

        ``failed`` names the relay whose transfer to ``worker`` just failed
        (:attr:`Source.name`); a report about an earlier registration of that
        relay than the current one changes nothing.
        """
        with self._lock:
            if version != self._version:  # a newer version: a new tree
                self._version, self._nodes, self._direct_count = version, {}, 0
            who, _, serial = failed.rpartition("#")
            node = self._nodes.get(who)
            if node is not None and str(node.serial) == serial:
                self._remove(who)
            if worker:
                self._remove(worker)  # asking again: its old place (and subtree) is void
            source = self._pick() if self.fanout and worker else Source()
            if source.direct:
                self._direct_count += 1
                self.direct_pulls += 1
            else:
                self._nodes[source.worker].children += 1
                self.assigned += 1
            if self.fanout and worker and port:
                self._serial += 1
                self._nodes[worker] = Node(worker, host, port, source.worker, self._serial)
            return source

    def _pick(self) -> Source:
        if self._direct_count < self.direct:
            return Source()
        for node in self._nodes.values():
            if node.children < self.fanout:
                return Source(node.worker, node.host, node.port, node.serial)
        return Source()  # no relay has room (all failed): the server feeds it

    def _remove(self, worker: str) -> None:
        """Drops ``worker`` and every node it feeds, directly or not."""
        gone = {worker} if worker in self._nodes else set()
        grew = bool(gone)
        while grew:
            more = {w for w, n in self._nodes.items() if n.parent in gone} - gone
            gone |= more
            grew = bool(more)
        for w in gone:
            node = self._nodes.pop(w)
            parent = self._nodes.get(node.parent)
            if parent is not None:
                parent.children -= 1

    def nodes(self) -> list[Node]:
        """The current tree, in the order its nodes joined (a copy)."""
        with self._lock:
            return [dataclasses.replace(n) for n in self._nodes.values()]
