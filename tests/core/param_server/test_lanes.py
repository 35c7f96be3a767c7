"""Weight lanes: a plugin's lane carries pushes and pulls, lanes step aside in order,
unknown names are refused, and relays work over a split store."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import pickle
import re

import gin
import numpy as np
import pytest

from rlax.core import config, hookimpl
from rlax.core.errors import ConfigError
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.codec import tensor_list
from rlax.core.param_server.server import ParamServer
from rlax.core.param_server.settings import ServerSettings
from rlax.core.param_server.transport import lanes
from rlax.core.param_server.transport.bulk_lane import BulkLane
from rlax.core.param_server.transport.grpc_lane import GrpcLane
from rlax.core.param_server.transport.relay_lane import RelayLane
from rlax.core.param_server.transport.split_lane import SplitLane
from rlax.core.plugins import build_plugin_manager
from rlax.core.weight_lane import HasServerHalf, StepAside
from rlax.core.wire import WirePlan

from ..conftest import TOKEN

rng = np.random.default_rng(5)
TREE = {
    "emb": rng.standard_normal((300, 700)).astype(np.float32),
    "a": rng.standard_normal((123, 457)).astype(np.float32),
    "b": rng.standard_normal(77).astype(np.float32),
}
PLAN = WirePlan.for_tree(TREE)
BASE = {"token": TOKEN, "max_message_mb": 8, "chunk_mb": 1}


class FileLane:
    """A toy third-party lane: whole-model versions as files in a shared directory.

    The server never sees them: what a puller gets came through this lane.
    """

    def __init__(self, *, root: str = ""):
        self.root = root

    def open(self, link):
        return self if self.root else None

    def push(self, header, pieces, sizes):
        if header.num_parts != 1:
            raise StepAside("files carry whole-model pushes only")
        buf = bytearray(header.nbytes)
        for offset, view in pieces:
            buf[offset : offset + len(view)] = view
        root = pathlib.Path(self.root)
        (root / f"{header.version}.bin").write_bytes(buf)
        (root / f"{header.version}.header").write_bytes(header.SerializeToString())
        return pb.PushReply(version=header.version, committed=True)

    def pull(self, have_version, buffer):
        versions = sorted(int(p.stem) for p in pathlib.Path(self.root).glob("*.header"))
        if not versions or versions[-1] == have_version:
            return None
        root, v = pathlib.Path(self.root), versions[-1]
        header = pb.PartHeader.FromString((root / f"{v}.header").read_bytes())
        buf = buffer(header.nbytes)
        buf[:] = (root / f"{v}.bin").read_bytes()
        return v, tensor_list(header), buf

    def close(self):
        pass


class FilesPlugin:
    @hookimpl
    def rlax_register_weight_lanes(self):
        return {"files": FileLane}


@pytest.fixture
def files_lane(tmp_path):
    pm = build_plugin_manager(autoload=False, extra=[FilesPlugin()])
    config.parse([], [f"weight_lanes.files.root = '{tmp_path}'"], plugins=pm)
    yield pm
    gin.clear_config()


def test_hook_rlax_register_weight_lanes(make_ps, files_lane):
    assert files_lane.get("weight_lanes", "files").factory is FileLane
    running = make_ps()
    settings = dataclasses.replace(running.settings, weight_lanes=("files", "grpc"))
    trainer = ParamServerClient(settings, retry_s=0)
    worker = ParamServerClient(settings, retry_s=0)
    try:
        assert isinstance(trainer.lane("files"), FileLane)  # gin gave it its root
        assert trainer.push(PLAN, TREE, 0).committed
        version, tensors, buf = worker.pull(-1)
        PLAN.check_layout(tensors)
        assert version == 0 and bytes(buf) == PLAN.pack(TREE).tobytes()
        assert worker.pull(0) is None
        assert running.client.stat().version == -1  # the server never saw it
    finally:
        trainer.close()
        worker.close()


def test_a_lane_that_steps_aside_hands_the_transfer_to_the_next(make_ps, files_lane, caplog):
    running = make_ps()
    settings = dataclasses.replace(running.settings, weight_lanes=("files", "grpc"))
    client = ParamServerClient(settings, retry_s=0)
    two_parts = client.header(PLAN, 0)
    two_parts.num_parts = 2  # part 0 of 2
    try:
        with caplog.at_level(logging.INFO, logger="rlax.client"):
            pieces = [(0, memoryview(PLAN.pack(TREE)))]
            reply = client.push_part(two_parts, iter(pieces))  # files steps aside: gRPC
            assert not reply.committed and running.client.stat().version == -1
        asides = [r for r in caplog.records if "steps aside" in r.getMessage()]
        assert len(asides) == 1 and "whole-model pushes only" in asides[0].getMessage()
    finally:
        client.close()


def test_a_server_without_the_bulk_lane_is_told_once(make_ps, caplog):
    grpc_only = ServerSettings(address="127.0.0.1:0", weight_lanes=("grpc",), **BASE)
    running = make_ps(settings=grpc_only)
    client = ParamServerClient(
        dataclasses.replace(running.settings, weight_lanes=("bulk", "grpc")), retry_s=0
    )
    try:
        with caplog.at_level(logging.INFO, logger="rlax.client"):
            for version in range(3):
                assert client.push(PLAN, TREE, version).committed
                assert bytes(client.pull(version - 1)[2]) == PLAN.pack(TREE).tobytes()
        asides = [r.getMessage() for r in caplog.records if "steps aside" in r.getMessage()]
        assert asides == ["weight lane bulk steps aside: the parameter server has no bulk lane"]
    finally:
        client.close()


def test_an_unknown_lane_is_one_line_naming_the_setting_and_the_valid_names(ps):
    settings = dataclasses.replace(ps.settings, weight_lanes=("bulk", "nccl"))
    with pytest.raises(ConfigError) as err:
        ParamServerClient(settings, retry_s=0)
    assert "\n" not in str(err.value)
    assert re.fullmatch(
        r"rlax.ps_settings.weight_lanes: unknown weight lane 'nccl'; "
        r"valid weight lanes: bulk, (files, )?grpc, relay, split",  # files: a test's plugin
        str(err.value),
    )
    with pytest.raises(ConfigError, match="no weight lane; valid"):
        lanes.check_names(())


def test_the_lanes_that_do_not_apply_are_not_opened(ps):
    assert [name for name, _ in ps.client.lanes.lanes] == ["bulk", "grpc"]  # no shards, relay
    tls = dataclasses.replace(ps.settings, tls_cert="/nonexistent.pem")
    link = lanes.Link(tls, ps.client._channel, (), ps.client.retry, relay=True)
    three = lanes.configured(dataclasses.replace(tls, weight_lanes=("relay", "bulk", "grpc")))
    assert [name for name, _ in lanes.open_lanes(link, three).lanes] == ["grpc"]


@pytest.fixture
def relaying_shard():
    """A weight-only server whose pullers may relay."""
    settings = ServerSettings(
        address="127.0.0.1:0", lanes=(("relay", RelayLane(fanout=2)),), **BASE
    )
    server = ParamServer(settings, iter(()), capacity=1)
    port = server.start()
    yield server, f"127.0.0.1:{port}"
    server.stop(grace=None)


def test_workers_pull_through_relays_from_a_store_split_over_two_servers(make_ps, relaying_shard):
    shard, address = relaying_shard
    split = SplitLane(shards=(address,), start_local=False)  # the shard runs already
    pins = (("split", split), ("relay", RelayLane(fanout=2)))
    settings = ServerSettings(address="127.0.0.1:0", lanes=pins, **BASE)
    running = make_ps(settings=settings)
    assert running.client.push(PLAN, TREE, 0).committed
    assert 0 < running.server.weights.version_bytes < PLAN.nbytes  # split over the two
    workers = [ParamServerClient(running.settings, retry_s=0, relay=True) for _ in range(3)]
    try:
        for w in workers:
            version, tensors, buf = w.pull(-1)
            PLAN.check_layout(tensors)
            assert version == 0 and bytes(buf) == PLAN.pack(TREE).tobytes()
        servers = [server for w in workers for server in w.lane("split").servers]
        relayed = [server.get("relay").relay.bytes_sent for server in servers]
        # Each server fed the first worker; the two others took its runs from its relays.
        assert sum(relayed) == 2 * PLAN.nbytes
        served = sum(s.half("bulk").bytes_served for s in (running.server, shard))
        assert served == PLAN.nbytes
    finally:
        for w in workers:
            w.close()


def test_pinned_lanes_are_one_value_that_travels_to_another_process():
    relay = RelayLane(fanout=2, direct=3)
    settings = ServerSettings(address="127.0.0.1:0", lanes=(("relay", relay),), **BASE)
    pinned = lanes.pinned(settings)
    assert pinned.lanes == (
        ("split", SplitLane()),  # built from the registry: the defaults, as no gin binds them
        ("relay", relay),  # the pin is kept as it was
        ("bulk", BulkLane()),
        ("grpc", GrpcLane()),
    )
    assert pickle.loads(pickle.dumps(pinned)) == pinned  # what a spawned shard receives
    assert lanes.pinned(pinned) == pinned
    # Listing fewer lanes keeps only theirs; the pins of the others are dropped.
    fewer = lanes.pinned(dataclasses.replace(pinned, weight_lanes=("relay", "grpc")))
    assert fewer.lanes == (("relay", relay), ("grpc", GrpcLane()))


def test_a_lane_server_half_is_mounted_only_where_its_settings_turn_it_on(make_ps):
    off = make_ps()  # the defaults: no shards, no relays, bulk on (no TLS)
    assert list(off.server.halves) == ["bulk"] and off.server.holds_whole_versions
    pins = (("relay", RelayLane(fanout=2)),)
    on = make_ps(settings=ServerSettings(address="127.0.0.1:0", lanes=pins, **BASE))
    assert list(on.server.halves) == ["relay", "bulk"]
    assert on.server.half("bulk").route == on.server.half("relay").route  # relays route pulls
    grpc_only = ServerSettings(address="127.0.0.1:0", weight_lanes=("grpc",), **BASE)
    assert make_ps(settings=grpc_only).server.halves == {}


def test_the_built_in_lanes_with_a_server_half_are_found_by_isinstance():
    built = {name: factory() for name, factory in lanes.builtins()}
    assert sorted(built) == ["bulk", "grpc", "relay", "split"]
    assert {n for n, lane in built.items() if isinstance(lane, HasServerHalf)} == {
        "bulk",
        "relay",
        "split",
    }  # grpc's Push/Pull are the server's own service
    assert not isinstance(FileLane(), HasServerHalf)  # a client-only lane
