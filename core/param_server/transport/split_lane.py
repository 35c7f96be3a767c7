"""The split lane: a weight store split by tensor over several servers (``shards``).

The server at ``address`` and each weight-only server of
``weight_lanes.split.shards`` hold one contiguous run of every version's tensors (the arithmetic:
weights/split.py). To each server this lane sends and takes that server's
run through the lanes listed *after* it (``LaneLink.onward``), so a split
store is carried by the bulk lane, gRPC or relays like a single server:

* a push sends each server its run, one server after the other (the pieces
  are read once); a server that already holds the version (a retried push
  whose first try reached it) counts as a duplicate, so the rest still get theirs;
* a pull asks every server for its version (``Stat``), waits for laggards,
  then pulls every run at once, each straight into its place in one buffer
  (:class:`_Gather`); the result is the one-server pull bit for bit. If a
  server moved on meanwhile, it asks again.

The server half (:class:`SplitServer`, on the server at ``address``) starts
the shards meant for its own host as child processes of the server
(``LaneHost.start_server``; elsewhere: weights/split_servers.py) and stops
them with it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Annotated, cast

import grpc

from rlax.core import hookimpl
from rlax.core.constraints import Positive, check_fields
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.codec import TensorList
from rlax.core.param_server.transport import transfer
from rlax.core.param_server.weights.split import ranged, split_header, split_points, whole_sizes
from rlax.core.weight_lane import LaneHost, LaneLink, LaneServer, Pulled

if TYPE_CHECKING:
    from rlax.core.param_server.transport.lanes import Lanes

ATTEMPTS = 30  # rounds of "wait for the laggards" before a pull gives up (UNAVAILABLE)


@dataclasses.dataclass(frozen=True)
class SplitLane:
    """The split lane's settings (``weight_lanes.split``).

    Args:
      shards: addresses of further weight-only servers: the weight store is
        split by tensor over the server at ``address`` and these
        (weights/split.py); the rollout queue stays at ``address``. Empty:
        no split (the lane steps out).
      start_local: the server at ``address`` starts the shards on its own
        host as child processes (False: they are started on their own, e.g.
        ``python -m rlax.core.param_server.weights.split_servers``).
      gather_timeout_s: how long a pull waits for every server to say its size.
    """

    shards: tuple[str, ...] = ()
    start_local: bool = True
    gather_timeout_s: Annotated[float, Positive] = 60.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "shards", tuple(self.shards))
        check_fields(self)

    def open(self, link: LaneLink) -> OpenSplitLane | None:
        return OpenSplitLane(self, link) if self.shards else None

    def serve(self, host: LaneHost) -> SplitServer | None:
        return SplitServer(self, host) if self.shards else None


class SplitServer(LaneServer):
    """The split store on the server at ``address``: it holds the first run of each
    version, and starts the shards on its own host (``start_local``)."""

    splits_versions = True

    def __init__(self, lane: SplitLane, host: LaneHost):
        self.lane, self.host = lane, host
        self.procs: list[multiprocessing.process.BaseProcess] = []

    def start(self) -> None:
        if not self.lane.start_local:
            return
        # A shard serves with this server's settings and every lane but this one.
        settings = self.host.settings
        rest = tuple((n, lane) for n, lane in settings.lanes if not isinstance(lane, SplitLane))
        here = transfer.split_address(settings.address)
        for address in self.lane.shards:
            if transfer.split_address(address) == here:  # the others start on their own host
                shard = dataclasses.replace(
                    settings, address=address, weight_lanes=tuple(n for n, _ in rest), lanes=rest
                )
                self.procs.append(self.host.start_server(shard))

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.join(timeout=10)


class OpenSplitLane:
    """A client's split store: the onward lanes to each server, ``address`` first."""

    def __init__(self, lane: SplitLane, link: LaneLink):
        self.gather_timeout_s = lane.gather_timeout_s
        # The client's link makes Lanes (a lane with its own link, for Stat); the contract
        # promises only a WeightLane.
        self.servers: list[Lanes] = [cast("Lanes", link.onward(None))]
        try:
            self.servers += [cast("Lanes", link.onward(a)) for a in lane.shards]
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def push(
        self,
        header: pb.PartHeader,
        pieces: Iterable[tuple[int, memoryview]],
        sizes: list[int] | None = None,
    ) -> pb.PushReply:
        points = split_points(sizes or whole_sizes(header), len(self.servers))
        it = iter(pieces)
        carry: list[tuple[int, memoryview]] = []
        replies = []
        for server, (sub, base) in zip(self.servers, split_header(header, points)):
            run = ranged(it, base, base + sub.nbytes, carry)
            replies.append(_push_run(server, sub, run))
            for _ in run:  # a server that refused early: the next run starts after this one
                pass
        duplicate = all(r.duplicate for r in replies)
        committed = all(r.committed or r.duplicate for r in replies) and not duplicate
        return pb.PushReply(version=header.version, committed=committed, duplicate=duplicate)

    def pull(self, have_version: int, buffer: Callable[[int], memoryview]) -> Pulled | None:
        """(version, tensors, buffer) once every server serves one version."""
        for _ in range(ATTEMPTS):
            versions = [s.link.call("Stat", pb.StatRequest(), 30).version for s in self.servers]
            target = max(versions)
            if target < 0 or target == have_version and min(versions) == target:
                return None
            if min(versions) != target:  # some server has not committed it yet
                for s, v in zip(self.servers, versions):
                    if v < target:
                        s.link.call(
                            "WaitForVersion", pb.WaitRequest(after_version=v, timeout_s=2.0), 32
                        )
                continue
            pulled, whole = self._pull_all(have_version, buffer)
            if whole is not None and {p[0] for p in pulled} == {target}:
                return _joined(pulled, whole)
        raise transfer.BulkError(
            grpc.StatusCode.UNAVAILABLE, "split store: the servers did not agree on a version"
        )

    def _pull_all(self, have_version: int, buffer: Callable[[int], memoryview]):
        """Every server's run at once, and the one buffer they landed in (None if a
        server had nothing new)."""
        gather = _Gather(len(self.servers), buffer, self.gather_timeout_s)

        def one(i: int) -> Pulled | None:
            try:
                return self.servers[i].pull(have_version, gather.slot(i))
            except _Withdrawn:
                return None
            finally:
                gather.leave(i)

        with concurrent.futures.ThreadPoolExecutor(len(self.servers)) as pool:
            pulled = list(pool.map(one, range(len(self.servers))))
        if any(p is None for p in pulled):
            return [], None
        return pulled, gather.whole


class _Withdrawn(Exception):
    """Another server's pull ended before it said its size: this one stops too."""


class _Gather:
    """One buffer for every server's run: each server's pull asks ``slot(i)(nbytes)``
    and, once all have asked, gets its slice of one buffer, in server order."""

    def __init__(self, n: int, buffer: Callable[[int], memoryview], timeout_s: float):
        self._sizes: list[int | None] = [None] * n
        self._buffer, self._timeout_s = buffer, timeout_s
        self._cond = threading.Condition()
        self.whole: memoryview | None = None
        self._withdrawn = False

    def slot(self, i: int) -> Callable[[int], memoryview]:
        def alloc(nbytes: int) -> memoryview:
            with self._cond:
                self._sizes[i] = nbytes
                self._cond.notify_all()
                ready = lambda: self._withdrawn or None not in self._sizes
                if not self._cond.wait_for(ready, self._timeout_s) or self._withdrawn:
                    self._withdrawn = True
                    self._cond.notify_all()
                    raise _Withdrawn
                sizes = [n for n in self._sizes if n is not None]
                if self.whole is None:
                    self.whole = self._buffer(sum(sizes))
                base = sum(sizes[:i])
                return self.whole[base : base + nbytes]

        return alloc

    def leave(self, i: int) -> None:
        """Server ``i``'s pull ended: if it never asked for its slice, the others stop."""
        with self._cond:
            if self._sizes[i] is None:
                self._withdrawn = True
                self._cond.notify_all()


def _joined(pulled: list[Pulled], whole: memoryview) -> Pulled:
    """The servers' runs as one version: tensors re-based into the joint buffer."""
    tensors, base = [], 0
    for _, runs, view in pulled:
        tensors += [{**t, "offset": t["offset"] + base} for t in runs]
        base += len(view)
    joined = TensorList(tensors)
    probes = (getattr(runs, "probe", None) for _, runs, _ in pulled)  # every server has it
    joined.probe = next((p for p in probes if p is not None), None)
    return pulled[0][0], joined, whole


def _push_run(server: Lanes, sub: pb.PartHeader, run) -> pb.PushReply:
    try:
        return server.push(sub, run, None)
    except grpc.RpcError as err:
        if (
            err.code() != grpc.StatusCode.FAILED_PRECONDITION
            or server.link.call("Stat", pb.StatRequest(), 30).version < sub.version
        ):
            raise
        return pb.PushReply(version=sub.version, duplicate=True)


@hookimpl
def rlax_register_weight_lanes():
    return {"split": SplitLane}
