"""Rollout-queue load: 32 simulated workers and a trainer against one server for 30 s.

The server runs in its own process with a synthetic endless prompt stream.
Four client processes run 8 worker threads each: lease 4 prompts, submit a
small group for each; one trainer thread takes batches of 16 and acknowledges
them. Every call's latency is recorded, except a lease or take that came back
empty after waiting: that is backpressure working, not a slow server. At the end every prompt the server
drew must be consumed exactly once or still be accounted for in the queue
(pool, leased, queued, taken), and the server's resident memory must stay
flat from the end of a 10 s warm-up to the end of the run.

The queue is persisted in SQLite (core/param_server/queue/store.py) as ``rlax run``
does, one transaction per state change; ``--in-memory`` measures it without.

    python benchmarks/ps_load.py [--seconds 30] [--workers 32] [--in-memory]

Prints a table, then one JSON line:
``{"ops_s", "p99_ms", "rss_growth_mb", "lost", "duplicated"}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import tempfile
import threading
import time

import numpy as np

TOKEN = "load-token"


def _prompts():
    from rlax.core.types import Prompt

    for i in itertools.count():
        yield Prompt(
            id=f"q{i}", text="1+1=", tokens=np.array([1, 4, 13, 4, 16], np.int32), answer="2"
        )


def _server(port_q, stop_evt, capacity, db_path):
    from rlax.core.param_server.queue.store import QueueDB
    from rlax.core.param_server.server import ParamServer
    from rlax.core.param_server.settings import ServerSettings

    db = QueueDB(db_path) if db_path else None
    server = ParamServer(
        ServerSettings(address="127.0.0.1:0", token=TOKEN),
        _prompts(),
        capacity=capacity,
        lease_ttl_s=30.0,
        queue_db=db,
    )
    port_q.put(server.start())
    stop_evt.wait()
    server.stop(grace=None)


def _client(port):
    from rlax.core.param_server.client import ParamServerClient
    from rlax.core.param_server.settings import ServerSettings

    return ParamServerClient(ServerSettings(address=f"127.0.0.1:{port}", token=TOKEN))


def _group(prompt):
    from rlax.core.types import Completion, Group

    comps = tuple(
        Completion(np.array([4, 2], np.int32), np.array([-0.1, -0.2], np.float32), "2", "stop", 0)
        for _ in range(4)
    )
    return Group(prompt, comps, np.array([1.0, 0.0, 1.0, 0.0], np.float32))


def _workers(port, threads, seconds, out_q):
    client = _client(port)
    latencies, lock = [], threading.Lock()

    def work(name):
        mine, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            leases = client.lease(name, 4, wait_s=0.5)
            if leases:  # an empty answer waited for room on purpose: backpressure, not latency
                mine.append(time.perf_counter() - t0)
            for lease_id, prompt in leases:
                t0 = time.perf_counter()
                client.submit(_group(prompt), lease_id)
                mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    pool = [
        threading.Thread(target=work, args=(f"{port}-{i}-{id(out_q)}",)) for i in range(threads)
    ]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out_q.put(latencies)
    client.close()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--in-memory", action="store_true", help="no SQLite persistence")
    args = parser.parse_args()
    mp.set_start_method("spawn")
    tmp = tempfile.TemporaryDirectory()
    db_path = None if args.in_memory else f"{tmp.name}/queue.sqlite"
    port_q, stop_evt = mp.Queue(), mp.Event()
    server = mp.Process(target=_server, args=(port_q, stop_evt, 256, db_path))
    server.start()
    port = port_q.get()
    trainer = _client(port)
    from rlax.core.wire import WirePlan

    tree = {"w": np.zeros(4, np.float32)}
    trainer.push(WirePlan.for_tree(tree), tree, 0)

    out_q = mp.Queue()
    procs = [
        mp.Process(target=_workers, args=(port, args.workers // 4, args.seconds, out_q))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    consumed, take_lat, rss = [], [], []
    start = time.monotonic()
    end = start + args.seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        take_id, groups, _ = trainer.take(16, current_version=0, max_staleness=0, wait_s=0.5)
        if groups:
            trainer.ack(take_id)
            take_lat.append(time.perf_counter() - t0)
        consumed.extend(g.prompt.id for g in groups)
        if not rss and time.monotonic() - start >= min(10.0, args.seconds / 3):
            rss.append(_rss_mb(server.pid))  # after warm-up: thread pool and caches at size
    worker_lat = [x for _ in procs for x in out_q.get()]
    for p in procs:
        p.join()
    while True:  # drain what the workers left queued
        take_id, groups, _ = trainer.take(256, current_version=0, max_staleness=0, wait_s=0.2)
        if not groups:
            break
        trainer.ack(take_id)
        consumed.extend(g.prompt.id for g in groups)
    q = trainer.stat().queue
    rss.append(_rss_mb(server.pid))
    trainer.close()
    stop_evt.set()
    server.join()

    lat = np.array(worker_lat + take_lat) * 1000
    ops = len(lat) / args.seconds
    duplicated = len(consumed) - len(set(consumed))
    lost = q.cursor - len(set(consumed)) - (q.pool + q.leased + q.queued + q.taken)
    growth = rss[-1] - rss[0]
    tmp.cleanup()
    where = "in memory" if args.in_memory else "persisted in SQLite"
    print(
        f"\nrollout queue ({where}) under load: {args.workers} workers + 1 trainer, "
        f"{args.seconds:.0f}s"
    )
    print(f"{'calls/s':<24}{ops:>10.0f}")
    print(
        f"{'latency p50 / p99':<24}{np.percentile(lat, 50):>8.1f} / {np.percentile(lat, 99):.1f} ms"
    )
    print(f"{'prompts consumed':<24}{len(consumed):>10}")
    print(f"{'server RSS 10 s / end':<24}{rss[0]:>8.1f} / {rss[-1]:.1f} MB")
    print(f"{'lost / duplicated':<24}{lost:>8} / {duplicated}")
    print(
        json.dumps(
            {
                "ops_s": round(ops, 1),
                "p99_ms": round(float(np.percentile(lat, 99)), 2),
                "rss_growth_mb": round(growth, 1),
                "lost": int(lost),
                "duplicated": int(duplicated),
            }
        )
    )


if __name__ == "__main__":
    main()
