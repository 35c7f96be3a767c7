"""Weight-only servers: the shards of a weight store split by tensor (weights/split.py).

The split lane's server half (transport/split_lane.py) starts one child
process per address in ``weight_lanes.split.shards`` on its own host
(:func:`start_local`); a shard meant for another machine is started there with

    RLAX_PS_TOKEN=... python -m rlax.core.param_server.weights.split_servers --address HOST:PORT

A shard is an ordinary server (the same checks, the same bulk lane) whose
rollout queue is never used; it keeps nothing on disk (the main server's
persister saves and restores every shard's tensors through a sharded client).
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import signal
import threading
from collections.abc import Sequence

from rlax.core.param_server.settings import ADDRESS_ENV, ServerSettings
from rlax.core.param_server.transport.transfer import split_address


def serve(settings: ServerSettings, address: str, parent: int | None = None) -> None:
    """Serves one weight shard at ``address`` until SIGTERM/SIGINT (or ``parent`` exits).

    ``settings``: the main server's, with the lanes a shard serves pinned (not ``split``).
    """
    from rlax.core.param_server.server import ParamServer

    os.environ.pop(ADDRESS_ENV, None)  # the main server's address is not this shard's
    local = dataclasses.replace(settings, address=address)
    server = ParamServer(local, iter(()), capacity=1)
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        if parent is not None and os.getppid() != parent:
            break  # the parameter-server role is gone
    server.stop(grace=1.0)


def start_local(
    settings: ServerSettings, shards: Sequence[str]
) -> list[multiprocessing.process.BaseProcess]:
    """Child processes serving those of ``shards`` on this server's own host."""
    host = split_address(settings.address)
    ctx = multiprocessing.get_context("spawn")
    procs: list[multiprocessing.process.BaseProcess] = []
    for address in shards:
        if split_address(address) != host:
            continue  # started on its own machine
        p = ctx.Process(
            target=serve,
            args=(settings, address, os.getpid()),
            name=f"rlax-weight-shard-{address}",
            daemon=True,
        )
        p.start()
        procs.append(p)
    return procs


def stop_local(procs: list[multiprocessing.process.BaseProcess]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.join(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description="Serve one weight shard (token from RLAX_PS_TOKEN).")
    ap.add_argument("--address", required=True, help="host:port to bind")
    args = ap.parse_args()
    serve(ServerSettings(address=args.address).resolved(), args.address)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
