"""A weight lane with a server half, written and registered here as a third party would.

The drop-box lane carries a version's bytes through files in a shared
directory, and the parameter server takes part through the lane's own gRPC
service (``toy.v1.DropBox``): a push writes its part to a file and asks the
server to ``Commit`` it (the server reads the file, checks every segment and
commits the version to its store); a pull asks the server to ``Export`` its
newest version to a file and reads it from there. Nothing in ``rlax.core``
knows this lane: it is found through the plugin manager, configured in gin
(``weight_lanes.drop.root``), and its server half is mounted by the server
like the built-ins'.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import pathlib
import re
import uuid

import gin
import grpc
import pytest

from rlax.core import config, hookimpl
from rlax.core.constraints import check_rules
from rlax.core.errors import BadSetting, ConfigError
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.codec import tensor_list
from rlax.core.param_server.server import ParamServer
from rlax.core.param_server.settings import ServerSettings
from rlax.core.param_server.transport import lanes
from rlax.core.param_server.transport.transfer import checksum
from rlax.core.param_server.weights.parts import PushRejected
from rlax.core.plugins import build_plugin_manager
from rlax.core.weight_lane import HasServerHalf, LaneServer, StepAside

from ..conftest import TOKEN
from .test_lanes import PLAN, TREE

SERVICE = "toy.v1.DropBox"
SEGMENT = 1 << 18  # bytes per checksummed segment of a dropped file


def _note(path: pathlib.Path, header: pb.PartHeader, segments: list) -> bytes:
    """What a Commit or Export says about a dropped file: where, what, and its checksums."""
    return json.dumps(
        {
            "file": path.name,
            "header": base64.b64encode(header.SerializeToString()).decode(),
            "segments": segments,
        }
    ).encode()


def _read_note(raw: bytes) -> tuple[str, pb.PartHeader, list]:
    note = json.loads(raw)
    return (
        note["file"],
        pb.PartHeader.FromString(base64.b64decode(note["header"])),
        note["segments"],
    )


@dataclasses.dataclass(frozen=True)
class DropLane:
    """The drop-box lane's settings (``weight_lanes.drop``): ``root``, the shared directory
    (empty: the lane is off, on clients and servers alike)."""

    root: str = ""

    def open(self, link):
        return OpenDrop(pathlib.Path(self.root), link) if self.root else None

    def serve(self, host):
        return DropServer(pathlib.Path(self.root), host) if self.root else None


class OpenDrop:
    """A client's drop box on one server."""

    def __init__(self, root: pathlib.Path, link):
        self.root, self.link = root, link
        self.present = False  # the server answered: it has the drop box

    def _call(self, method: str, note: bytes, reply=None):
        try:
            return self.link.call(f"/{SERVICE}/{method}", note, 30, reply)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise StepAside("the parameter server has no drop box") from None
            raise

    def push(self, header, pieces, sizes):
        if not self.present:  # a lane steps aside before it reads any of the part
            self._call("Hello", b"")
            self.present = True
        path = self.root / f"push-{uuid.uuid4().hex}.bin"
        segments = []
        with open(path, "wb") as f:
            for offset, view in pieces:
                for at in range(0, len(view), SEGMENT):
                    piece = view[at : at + SEGMENT]
                    f.write(piece)
                    segments.append((offset + at, len(piece), checksum(piece)))
        return self._call("Commit", _note(path, header, segments), pb.PushReply)

    def pull(self, have_version, buffer):
        request = json.dumps({"have_version": have_version}).encode()
        raw = self._call("Export", request)
        if not raw:
            return None
        name, header, segments = _read_note(raw)
        buf = buffer(header.nbytes)
        with open(self.root / name, "rb") as f:
            f.readinto(buf)
        for offset, length, digest in segments:
            if checksum(buf[offset : offset + length]) != digest:
                raise ValueError(f"drop box: checksum mismatch at {offset}")
        return header.version, tensor_list(header), buf

    def close(self):
        pass


class DropServer(LaneServer):
    """The drop box on a parameter server: ``Commit`` (needs the token) and ``Export``."""

    protected = (f"/{SERVICE}/Commit",)

    def __init__(self, root: pathlib.Path, host):
        self.root, self.host = root, host
        self.commits = self.exports = self.bytes_exported = 0

    def handlers(self):
        raw = {"request_deserializer": None, "response_serializer": None}
        methods = {
            "Commit": grpc.unary_unary_rpc_method_handler(
                self._commit,
                request_deserializer=None,
                response_serializer=pb.PushReply.SerializeToString,
            ),
            "Export": grpc.unary_unary_rpc_method_handler(self._export, **raw),
            "Hello": grpc.unary_unary_rpc_method_handler(lambda request, context: b"", **raw),
        }
        return [grpc.method_handlers_generic_handler(SERVICE, methods)]

    def _commit(self, request: bytes, context):
        name, header, segments = _read_note(request)
        weights = self.host.weights
        try:
            part = weights.begin(header)
        except PushRejected as err:
            context.abort(err.code, str(err))
        if isinstance(part, pb.PushReply):  # a retried push
            return part
        try:
            with open(self.root / name, "rb") as f:
                for _, length, digest in segments:
                    part.check_segment(part.received, length)
                    f.readinto(part.landing(length))
                    part.accept(length, digest)
            reply = weights.commit([part])
        except PushRejected as err:
            weights.abandon(part)
            context.abort(err.code, str(err))
        (self.root / name).unlink()
        self.commits += 1
        return reply

    def _export(self, request: bytes, context):
        served = self.host.weights.open_pull(json.loads(request)["have_version"])
        if served is None:
            return b""
        try:
            path = self.root / f"v{served.number}.bin"
            path.write_bytes(served.read(0, served.header.nbytes))
            self.exports += 1
            self.bytes_exported += served.header.nbytes
            return _note(path, served.header, served.segments)
        finally:
            self.host.weights.close_pull(served)

    def stat(self, reply):
        reply.bytes_served += self.bytes_exported


class DropPlugin:
    @hookimpl
    def rlax_register_weight_lanes(self):
        return {"drop": DropLane}


@pytest.fixture
def drop_box(tmp_path):
    """The plugin loaded beside the built-ins; ``weight_lanes.drop.root`` bound in gin."""
    pm = build_plugin_manager(autoload=False, extra=[DropPlugin()])
    config.parse([], [f"weight_lanes.drop.root = '{tmp_path}'"], plugins=pm)
    yield tmp_path
    gin.clear_config()
    build_plugin_manager(autoload=False)  # the lane registry as it was: the built-ins alone


def _settings(*lanes: str) -> ServerSettings:
    return ServerSettings(
        address="127.0.0.1:0", token=TOKEN, max_message_mb=8, chunk_mb=1, weight_lanes=lanes
    )


def _clients(running, *lanes: str, n: int = 2) -> list[ParamServerClient]:
    settings = dataclasses.replace(running.settings, weight_lanes=lanes)
    return [ParamServerClient(settings, retry_s=0) for _ in range(n)]


def test_a_toy_lane_carries_a_push_and_a_pull_through_its_server_half(make_ps, drop_box):
    running = make_ps(settings=_settings("drop"))
    assert isinstance(DropLane(), HasServerHalf)  # by its shape: DropLane subclasses nothing
    half = running.server.half("drop")
    assert isinstance(half, DropServer) and type(half).__module__ == __name__
    trainer, worker = _clients(running, "drop")  # no other lane: nothing else can carry it
    bystander = _clients(running, "grpc", n=1)[0]
    try:
        assert [name for name, _ in trainer.lanes.lanes] == ["drop"]
        assert PLAN.nbytes > SEGMENT  # a push is several checksummed segments
        for version in range(2):
            tree = {k: v + version for k, v in TREE.items()}
            assert trainer.push(PLAN, tree, version).committed
            # The server committed it through the lane's Commit: its store serves it.
            assert running.client.stat().version == version and half.commits == version + 1
            pulled, tensors, buf = worker.pull(version - 1)
            PLAN.check_layout(tensors)
            assert pulled == version and bytes(buf) == PLAN.pack(tree).tobytes()
            assert half.exports == version + 1  # the worker's bytes came out of the drop box
            assert bytes(bystander.pull(version - 1)[2]) == PLAN.pack(tree).tobytes()
        assert worker.pull(1) is None and half.exports == 2  # nothing new: nothing exported
        assert sorted(p.name for p in drop_box.iterdir()) == ["v0.bin", "v1.bin"]
        assert running.client.stat().bytes_served == 2 * PLAN.nbytes  # the half's own figure
    finally:
        for c in (trainer, worker, bystander):
            c.close()


def test_the_toy_lanes_protected_method_needs_the_token(make_ps, drop_box):
    running = make_ps(settings=_settings("drop", "grpc"))
    channel = grpc.insecure_channel(running.settings.address)
    commit = channel.unary_unary(f"/{SERVICE}/Commit")
    note = _note(drop_box / "none.bin", running.client.header(PLAN, 0), [])
    try:
        with pytest.raises(grpc.RpcError) as err:
            commit(note, metadata=(("authorization", "Bearer wrong"),), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
    assert running.server.half("drop").commits == 0
    assert running.client.stat().version == -1


def test_a_server_that_does_not_list_the_toy_lane_mounts_nothing_of_it(make_ps, drop_box, caplog):
    running = make_ps(settings=_settings("grpc"))
    assert running.server.half("drop") is None
    client = _clients(running, "drop", "grpc", n=1)[0]
    try:
        with caplog.at_level(logging.INFO, logger="rlax.client"):
            assert client.push(PLAN, TREE, 0).committed  # drop stepped aside: gRPC carried it
            assert bytes(client.pull(-1)[2]) == PLAN.pack(TREE).tobytes()
        asides = [r.getMessage() for r in caplog.records if "steps aside" in r.getMessage()]
        assert asides == ["weight lane drop steps aside: the parameter server has no drop box"]
        assert list(drop_box.glob("v*.bin")) == []  # nothing was exported
    finally:
        client.close()


def test_an_unknown_lane_is_refused_before_the_server_binds_anything(drop_box):
    settings = _settings("drop", "dropbox")
    valid = "valid weight lanes: bulk, drop, grpc, relay, split"
    with pytest.raises(ConfigError) as err:
        ParamServer(settings, iter(()), capacity=1)
    assert (
        str(err.value) == f"rlax.ps_settings.weight_lanes: unknown weight lane 'dropbox'; {valid}"
    )
    # The rule gin runs on rlax.ps_settings before any role starts says the same.
    with pytest.raises(BadSetting) as rule:
        check_rules(ServerSettings, "rlax.ps_settings", weight_lanes=["drop", "dropbox"])
    assert rule.value.parameter == "weight_lanes"
    assert re.fullmatch(
        rf"rlax.ps_settings.weight_lanes: unknown .*'dropbox'; {valid}", str(rule.value)
    )


def test_a_toy_lane_pinned_in_the_settings_needs_no_registry(make_ps, tmp_path):
    # A run specification carries its lanes as built: a process that never loaded the
    # plugin (a role's child, a shard) still serves and uses the same lane.
    assert "drop" not in lanes.factories()
    pinned = dataclasses.replace(_settings("drop"), lanes=(("drop", DropLane(str(tmp_path))),))
    running = make_ps(settings=pinned)
    worker = ParamServerClient(running.settings, retry_s=0)
    try:
        assert running.client.push(PLAN, TREE, 0).committed
        assert bytes(worker.pull(-1)[2]) == PLAN.pack(TREE).tobytes()
        assert running.server.half("drop").commits == 1 and (tmp_path / "v0.bin").exists()
    finally:
        worker.close()
