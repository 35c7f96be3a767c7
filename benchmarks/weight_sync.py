"""Weight sync throughput on loopback: raw TCP (the link's limit here) vs our push and pull.

In one run, with the receiving side in a separate process every time:
  tcp     a socket ``sendall`` of the bytes into a process that ``recv_into``s a
          preallocated buffer, over one connection (the baseline: what the link
          gives a copy-once reader)
  push    ``ParamServerClient.push`` of a parameter tree of that size to a
          parameter-server process (stage over gRPC, bytes over the bulk lane,
          verify, commit), in steady state: after ``--warmup`` versions, as a
          trainer pushing every step sees it
  pull    ``ParamServerClient.pull`` of it back (ticket over gRPC, bytes over
          the bulk lane into the reused buffer, verify)
  pull4   four processes pulling at once; aggregate MB/s
  grpc    the same push and pull over gRPC streams only (the path under TLS),
          for reference

    python benchmarks/weight_sync.py --mb 256

Prints a table, then one JSON line:
``{"tcp_mb_s", "push_mb_s", "pull_mb_s", "pull4_aggregate_mb_s", "push_vs_tcp", "pull_vs_tcp"}``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import time

import numpy as np

TOKEN = "bench-token"


def _tcp_receiver(port_q, done_q, nbytes, rounds):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    buf = bytearray(nbytes)  # one buffer for every round: warm after the first, like ours
    view = memoryview(buf)
    for _ in range(rounds):
        got = 0
        while got < nbytes:
            got += conn.recv_into(view[got:], min(nbytes - got, 8 << 20))
        done_q.put(time.perf_counter())
    conn.close()


def tcp_mb_s(payload: memoryview, warmup: int, repeats: int) -> float:
    """Median MB/s of ``repeats`` sends after ``warmup`` ones, over one connection."""
    port_q, done_q = mp.Queue(), mp.Queue()
    p = mp.Process(target=_tcp_receiver, args=(port_q, done_q, len(payload), warmup + repeats))
    p.start()
    sock = socket.create_connection(("127.0.0.1", port_q.get()))
    rates = []
    for _ in range(warmup + repeats):
        start = time.perf_counter()
        sock.sendall(payload)
        rates.append(len(payload) / 2**20 / (done_q.get() - start))
    sock.close()
    p.join()
    return statistics.median(rates[warmup:])


def _server(port_q, stop_evt):
    from rlax.core.param_server.server import ParamServer
    from rlax.core.param_server.settings import ServerSettings

    def no_prompts():
        yield from ()

    server = ParamServer(
        ServerSettings(address="127.0.0.1:0", token=TOKEN), no_prompts(), capacity=1
    )
    port_q.put(server.start())
    stop_evt.wait()
    server.stop(grace=None)


def _settings(port, bulk_lane=True):
    from rlax.core.param_server.settings import ServerSettings

    lanes = ("bulk", "grpc") if bulk_lane else ("grpc",)
    return ServerSettings(address=f"127.0.0.1:{port}", token=TOKEN, weight_lanes=lanes)


def _push_pull(client, plan, tree, packed, versions, warmup):
    """Median push and pull seconds over ``versions`` after ``warmup`` of them."""
    push_s, pull_s = [], []
    for version in versions:
        start = time.perf_counter()
        client.push(plan, tree, version)
        push_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        got = client.pull(version - 1)
        pull_s.append(time.perf_counter() - start)
        assert got is not None and bytes(got[2]) == packed.tobytes()
    # The first versions fault fresh memory in on both sides; a trainer pushes
    # hundreds of versions, so the steady state after the warm-up is what counts.
    return statistics.median(push_s[warmup:]), statistics.median(pull_s[warmup:])


def _puller(port, barrier, out_q, nbytes):
    from rlax.core.param_server.client import ParamServerClient

    client = ParamServerClient(_settings(port))
    buf = bytearray(nbytes)
    np.frombuffer(buf, np.uint8).fill(1)  # warm, as a running worker's buffer is
    client._buffers = {nbytes: buf}
    barrier.wait()
    start = time.perf_counter()
    _, _, buf = client.pull(-1)
    out_q.put((start, time.perf_counter(), len(buf)))
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    mp.set_start_method("spawn")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from rlax.core.param_server.client import ParamServerClient
    from rlax.core.wire import WirePlan

    n_tensors = 32
    per = args.mb * 2**20 // 4 // n_tensors
    rng = np.random.default_rng(0)
    tree = {f"layer_{i:02d}": rng.standard_normal(per, dtype=np.float32) for i in range(n_tensors)}
    plan = WirePlan.for_tree(tree)
    nbytes = plan.nbytes
    mb = nbytes / 2**20
    packed = plan.pack(tree)

    tcp = tcp_mb_s(memoryview(packed), args.warmup, args.repeats)

    port_q, stop_evt = mp.Queue(), mp.Event()
    server = mp.Process(target=_server, args=(port_q, stop_evt))
    server.start()
    port = port_q.get()
    client = ParamServerClient(_settings(port))
    rounds = args.warmup + args.repeats
    push_s, pull_s = _push_pull(client, plan, tree, packed, range(rounds), args.warmup)
    push, pull = mb / push_s, mb / pull_s
    grpc_client = ParamServerClient(_settings(port, bulk_lane=False))
    gpush_s, gpull_s = _push_pull(
        grpc_client, plan, tree, packed, range(rounds, 2 * rounds), args.warmup
    )
    grpc_push, grpc_pull = mb / gpush_s, mb / gpull_s
    grpc_client.close()

    barrier, out_q = mp.Barrier(4), mp.Queue()
    pullers = [mp.Process(target=_puller, args=(port, barrier, out_q, nbytes)) for _ in range(4)]
    for p in pullers:
        p.start()
    results = [out_q.get() for _ in pullers]
    for p in pullers:
        p.join()
    pull4 = 4 * mb / (max(r[1] for r in results) - min(r[0] for r in results))
    client.close()
    stop_evt.set()
    server.join()

    print(
        f"\nweight sync, {mb:.0f} MB fp32 in {n_tensors} tensors, loopback, median of {args.repeats}"
        f" after {args.warmup} warm-up rounds on every path"
    )
    print(f"{'path':<28}{'MB/s':>10}{'vs tcp':>9}")
    for name, value in (
        ("raw TCP socket (baseline)", tcp),
        ("rlax push", push),
        ("rlax pull", pull),
        ("rlax pull, 4 at once (sum)", pull4),
        ("gRPC-stream push (TLS path)", grpc_push),
        ("gRPC-stream pull (TLS path)", grpc_pull),
    ):
        print(f"{name:<28}{value:>10.0f}{value / tcp:>9.2f}")
    print(
        json.dumps(
            {
                "tcp_mb_s": round(tcp, 1),
                "push_mb_s": round(push, 1),
                "pull_mb_s": round(pull, 1),
                "pull4_aggregate_mb_s": round(pull4, 1),
                "push_vs_tcp": round(push / tcp, 3),
                "pull_vs_tcp": round(pull / tcp, 3),
                "grpc_push_mb_s": round(grpc_push, 1),
                "grpc_pull_mb_s": round(grpc_pull, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
