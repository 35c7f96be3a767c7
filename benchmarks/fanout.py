"""Weights to a fleet: relayed pulls vs one server feeding every worker, on simulated links.

One parameter server and N pullers (threads standing in for worker
processes, each with its own client, relay and links) on loopback. Every
node's uplink is rate-limited in user space to ``--mb-s`` by a token bucket
shared by all its connections (:class:`rlax.core.param_server.transport.relay.Limiter`):
the server's, and each worker relay's. The bandwidth and the model size are
chosen so that the links, not the CPU, bound the run (the defaults move at
most a few hundred MB/s in total through this process, a fraction of what
loopback and xxh3 do on one core), so the figures are stable on a loaded
machine.

For N = 1, 4, 16, 32, in one run:
  baseline  ``weight_lanes.relay.fanout = 0``: every worker pulls from the server, whose
            uplink is shared by all N transfers
  relayed   ``fanout = --fanout``: the server feeds ``direct = 1``
            puller, every other puller gets the bytes from a relay, cut-through
            (a relay forwards bytes as they arrive)

Measured: ``all_have_s``, from the moment the version is committed to the
moment the last worker holds it verified; ``server_bytes_per_version``, the
bytes the server sent (``StatReply.bytes_served``). Models printed beside
them: the baseline ``N * S / B``; the issue's ``S / B * (1 + log2 N)``
(a store-and-forward binary tree); and this design's ``k * S / B`` (a
cut-through tree of fanout k: each relay's uplink is shared by its k pullers).

    python benchmarks/fanout.py                  # 4 MB model, 20 MB/s links
    python benchmarks/fanout.py --mb 8 --mb-s 16 --fanout 1

Prints a table, then one JSON line:
``{"n": [...], "all_have_s": [...], "baseline_all_have_s": [...],
"server_bytes_per_version": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import threading
import time

import grpc
import numpy as np

from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.server import ParamServer
from rlax.core.param_server.settings import MB, ServerSettings
from rlax.core.param_server.transport.relay import Limiter
from rlax.core.param_server.transport.relay_lane import RelayLane
from rlax.core.wire import WirePlan

TOKEN = "bench-token"


def _model(mb: float) -> dict[str, np.ndarray]:
    """Four float32 tensors of ``mb`` MB in all."""
    n = int(mb * MB) // 16
    rng = np.random.default_rng(0)
    return {f"t{i}": rng.standard_normal(n, dtype=np.float32) for i in range(4)}


def _prompts():
    return iter(())  # this benchmark moves weights only


def _pull(client: ParamServerClient, tries: int = 200):
    """A pull retried while the server refuses it (its bulk lane runs at most 16
    transfers at once: the baseline's 17th puller waits), as a worker's policy does."""
    for _ in range(tries - 1):
        try:
            return client.pull(-1)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            time.sleep(0.05)
    return client.pull(-1)


def one_round(n: int, fanout: int, tree: dict, rate: float) -> tuple[float, int]:
    """(seconds until all ``n`` pullers hold the version, bytes the server sent for it)."""
    settings = ServerSettings(
        address="127.0.0.1:0",
        token=TOKEN,
        chunk_mb=1,
        max_message_mb=8,
        lanes=(("relay", RelayLane(fanout=fanout, direct=1)),),
    )
    server = ParamServer(settings, _prompts(), capacity=1)
    port = server.start()
    server.half("bulk").egress = Limiter(rate)  # the server's uplink
    address = f"127.0.0.1:{port}"
    local = ServerSettings(**{**settings.__dict__, "address": address})
    trainer = ParamServerClient(local, retry_s=5)
    pullers = [ParamServerClient(local, retry_s=5, relay=True) for _ in range(n)]
    for p in pullers:
        if p.lane("relay") is not None:
            p.lane("relay").relay.egress = Limiter(rate)  # each worker's uplink
    plan = WirePlan.for_tree(tree)
    try:
        trainer.push(plan, tree, 0)
        start = threading.Barrier(n + 1)
        done: list[float] = []
        errors: list[BaseException] = []

        def pull(client):
            start.wait()
            try:
                version, _, _ = _pull(client)
                assert version == 0
                done.append(time.perf_counter())
            except BaseException as err:  # noqa: BLE001 — re-raised in the main thread
                errors.append(err)

        threads = [threading.Thread(target=pull, args=(p,)) for p in pullers]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return max(done) - t0, trainer.stat().bytes_served
    finally:
        for c in [trainer, *pullers]:
            c.close()
        server.stop(grace=None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mb", type=float, default=4.0, help="model size in MB (MiB)")
    ap.add_argument("--mb-s", type=float, default=20.0, help="every node's uplink, MB/s")
    ap.add_argument(
        "--fanout", type=int, default=2, help="the relay lane's fanout in the relayed runs"
    )
    ap.add_argument("--n", type=int, nargs="+", default=[1, 4, 16, 32])
    args = ap.parse_args()
    logging.getLogger("rlax.param_server").setLevel(logging.ERROR)  # the baseline's refusals
    tree = _model(args.mb)
    size = sum(x.nbytes for x in tree.values())
    rate = args.mb_s * MB
    link_s = size / rate
    rows = []
    for n in args.n:
        base_s, base_bytes = one_round(n, 0, tree, rate)
        relay_s, relay_bytes = one_round(n, args.fanout, tree, rate)
        rows.append((n, relay_s, base_s, relay_bytes, base_bytes))
    print(
        f"model {size / MB:.1f} MB, every uplink {args.mb_s:.0f} MB/s "
        f"(S/B = {link_s:.3f} s), relay fanout {args.fanout}; threads stand in for workers"
    )
    print(
        f"{'N':>3} {'relayed s':>10} {'baseline s':>11} {'ratio':>6} {'srv MB relayed':>15} "
        f"{'srv MB base':>12} {'N*S/B':>7} {'S/B(1+lg N)':>12} {'k*S/B':>6}"
    )
    for n, relay_s, base_s, relay_bytes, base_bytes in rows:
        print(
            f"{n:>3} {relay_s:>10.3f} {base_s:>11.3f} {relay_s / base_s:>6.3f} "
            f"{relay_bytes / MB:>15.1f} {base_bytes / MB:>12.1f} {n * link_s:>7.3f} "
            f"{link_s * (1 + math.log2(n)):>12.3f} {args.fanout * link_s:>6.3f}"
        )
    last = rows[-1]
    print(
        f"N={last[0]}: server bytes/version {last[3] / size:.2f}x the model (bound 2x), "
        f"all_have {last[1] / last[2]:.3f}x the baseline (bound 0.25x)"
    )
    print(
        json.dumps(
            {
                "n": [r[0] for r in rows],
                "all_have_s": [round(r[1], 4) for r in rows],
                "baseline_all_have_s": [round(r[2], 4) for r in rows],
                "server_bytes_per_version": [r[3] for r in rows],
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
