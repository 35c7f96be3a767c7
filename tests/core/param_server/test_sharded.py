"""A weight store split by tensor over several servers: the same pull, bit for bit."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time

import numpy as np
import pytest

from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.server import ParamServer
from rlax.core.param_server.settings import ServerSettings
from rlax.core.param_server.transport.split_lane import SplitLane
from rlax.core.param_server.weights.split import split_header, split_points
from rlax.core.wire import WirePlan

from ..conftest import TOKEN
from .test_bulk import _host

rng = np.random.default_rng(3)
# Sizes that do not fall on the 1 MiB chunks, so pieces straddle the shards' cuts.
TREE = {
    "emb": rng.standard_normal((300, 700)).astype(np.float32),
    "a": rng.standard_normal((123, 457)).astype(np.float32),
    "b": rng.standard_normal(77).astype(np.float32),
    "c": rng.standard_normal((211, 999)).astype(np.float32),
    "d": rng.standard_normal((5, 3)).astype(np.float32),
}
PLAN = WirePlan.for_tree(TREE)
BASE = {"token": TOKEN, "max_message_mb": 8, "chunk_mb": 1}


@pytest.fixture
def shards():
    servers = [
        ParamServer(ServerSettings(address="127.0.0.1:0", **BASE), iter(()), capacity=1)
        for _ in range(2)
    ]
    ports = [s.start() for s in servers]
    yield servers, tuple(f"127.0.0.1:{p}" for p in ports)
    for s in servers:
        s.stop(grace=None)


def _split(addresses, start_local=False):
    """Settings of a store split over the main server and ``addresses``."""
    split = SplitLane(shards=addresses, start_local=start_local)
    return ServerSettings(address="127.0.0.1:0", lanes=(("split", split),), **BASE)


def _sharded(make_ps, addresses):
    return make_ps(settings=_split(addresses))  # the shards run already


def _servers(running):
    """The split lane's onward lanes to each server, the main one first."""
    return running.client.lane("split").servers


def _stat(server):
    return server.link.call("Stat", pb.StatRequest(), 30)


def test_a_sharded_pull_equals_the_one_server_pull_bit_for_bit(make_ps, shards):
    servers, addresses = shards
    one, three = make_ps(), _sharded(make_ps, addresses)
    assert one.client.push(PLAN, TREE, 0).committed
    assert three.client.push(PLAN, TREE, 0).committed
    v1, tensors1, buf1 = one.client.pull(-1)
    v3, tensors3, buf3 = three.client.pull(-1)
    assert (v1, tensors1) == (v3, tensors3) and bytes(buf1) == bytes(buf3)
    assert bytes(buf3) == PLAN.pack(TREE).tobytes()
    held = [three.server.weights.version_bytes] + [s.weights.version_bytes for s in servers]
    assert sum(held) == PLAN.nbytes and min(held) > 0  # each server holds one run only
    assert max(held) < 0.6 * PLAN.nbytes  # balanced by bytes, as far as tensors allow
    assert three.client.pull(0) is None
    tree = {k: v + 1 for k, v in TREE.items()}
    assert three.client.push(PLAN, tree, 1).committed
    assert bytes(three.client.pull(0)[2]) == PLAN.pack(tree).tobytes()


def test_a_multi_host_push_to_a_sharded_store_pulls_like_one_server(make_ps, shards):
    _, addresses = shards
    one, three = make_ps(), _sharded(make_ps, addresses)
    sizes = [4 * 3, 4 * 6 * 8, 4 * 4 * 10]  # r, w, v of test_bulk's two hosts, whole
    for running in (one, three):
        for i in (1, 0):
            header, pieces = _host(i)
            reply = running.client.push_part(header, iter(pieces), sizes=sizes)
        assert reply.committed
    a, b = one.client.pull(-1), three.client.pull(-1)
    assert a[:2] == b[:2] and bytes(a[2]) == bytes(b[2])


def test_a_pull_waits_until_every_server_holds_the_same_version(make_ps, shards):
    _, addresses = shards
    three = _sharded(make_ps, addresses)
    three.client.push(PLAN, TREE, 0)
    three.client.pull(-1)
    newer = {k: v * 2 for k, v in TREE.items()}
    header = three.client.header(PLAN, 1)
    points = split_points([t.nbytes for t in header.tensors], 3)
    buf = PLAN.pack(newer)
    subs = split_header(header, points)
    for server, (sub, base) in zip(_servers(three)[:2], subs):  # not the last yet
        server.push(sub, [(0, memoryview(buf[base : base + sub.nbytes]))], None)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(pulled=three.client.pull(0)))
    t.start()
    time.sleep(0.5)
    assert t.is_alive()  # two servers serve version 1, one still 0: no mixed version
    sub, base = subs[2]
    _servers(three)[2].push(sub, [(0, memoryview(buf[base : base + sub.nbytes]))], None)
    t.join(10)
    version, _, got = out["pulled"]
    assert version == 1 and bytes(got) == buf.tobytes()


def test_split_points_cut_near_equal_bytes_and_give_every_shard_a_tensor():
    assert split_points([10, 1, 1, 10], 2) == [0, 2, 4]
    assert split_points([100, 1, 1, 1], 3) == [0, 1, 2, 4]
    assert split_points([5, 5, 5], 3) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="3 servers for a model of 2 tensors"):
        split_points([1, 1], 3)


def test_split_header_rebases_offsets_per_run():
    header = pb.PartHeader(version=0, part=0, num_parts=1, nbytes=24, push_id="x")
    for i, n in enumerate((8, 4, 12)):
        header.tensors.add(
            name=f"t{i}",
            dtype="float32",
            shape=[n // 4],
            offset=sum((8, 4, 12)[:i]),
            nbytes=n,
            index=i,
        )
    (h0, b0), (h1, b1) = split_header(header, [0, 2, 3])
    assert (b0, h0.nbytes, [t.offset for t in h0.tensors]) == (0, 12, [0, 8])
    assert (b1, h1.nbytes, [t.offset for t in h1.tensors]) == (12, 12, [0])
    assert (h0.push_id, h1.push_id) == ("x/0", "x/1")


def test_the_split_lane_starts_local_shards_as_processes_and_they_serve_their_run(make_ps):
    with socket.socket() as s:  # a free port for the shard process
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    two = make_ps(settings=_split((address,), start_local=True))
    procs = two.server.half("split").procs  # started by the server's split half
    assert len(procs) == 1 and procs[0].is_alive()
    assert not two.server.holds_whole_versions  # the persister reads through a client
    shard = _servers(two)[1]
    retry = dataclasses.replace(shard.link.retry, deadline_s=60.0)  # the child is starting
    retry.call("Stat", lambda: _stat(shard))
    assert two.client.push(PLAN, TREE, 0).committed
    assert bytes(two.client.pull(-1)[2]) == PLAN.pack(TREE).tobytes()
    assert 0 < two.server.weights.version_bytes < PLAN.nbytes  # the rest is in the child
    two.server.stop(grace=None)  # stopping the server stops its shards
    assert not procs[0].is_alive()


def test_a_push_retried_after_reaching_some_servers_completes_the_rest(make_ps, shards):
    _, addresses = shards
    three = _sharded(make_ps, addresses)
    header = three.client.header(PLAN, 0)
    points = split_points([t.nbytes for t in header.tensors], 3)
    buf = PLAN.pack(TREE)
    sub, base = split_header(header, points)[0]
    _servers(three)[0].push(sub, [(0, memoryview(buf[base : base + sub.nbytes]))], None)
    # The first try reached server 0 only; the retry (a new push id) completes servers 1 and 2.
    reply = three.client.push(PLAN, TREE, 0)
    assert reply.committed
    assert [_stat(s).version for s in _servers(three)] == [0, 0, 0]
    assert bytes(three.client.pull(-1)[2]) == buf.tobytes()
