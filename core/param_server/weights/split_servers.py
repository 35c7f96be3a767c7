"""Weight-only servers: the shards of a weight store split by tensor (weights/split.py).

The split lane's server half (transport/split_lane.py) starts the shards of
``weight_lanes.split.shards`` on its own host as child processes of the
parameter server (``ParamServer.start_server``); a shard meant for another
machine is started there with

    RLAX_PS_TOKEN=... python -m rlax.core.param_server.weights.split_servers --address HOST:PORT

A shard is an ordinary server (the same checks, the same bulk lane) whose
rollout queue is never used; it keeps nothing on disk (the main server's
persister saves and restores every shard's tensors through a sharded client).
"""

from __future__ import annotations

import argparse

from rlax.core.param_server.server import serve_weights
from rlax.core.param_server.settings import ServerSettings


def main() -> int:
    ap = argparse.ArgumentParser(description="Serve one weight shard (token from RLAX_PS_TOKEN).")
    ap.add_argument("--address", required=True, help="host:port to bind")
    args = ap.parse_args()
    serve_weights(ServerSettings(address=args.address).resolved())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
