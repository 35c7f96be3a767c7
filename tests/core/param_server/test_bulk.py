"""The bulk lane, multi-part (multi-host) pushes assembled into whole tensors, and buffer reuse."""

from __future__ import annotations

import dataclasses
import socket
import struct
import time

import grpc
import numpy as np
import pytest
import xxhash

from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.settings import ServerSettings
from rlax.core.param_server.transport import transfer
from rlax.core.wire import WirePlan, chunks

from ..conftest import TOKEN

rng = np.random.default_rng(1)
TREE = {"a": rng.standard_normal((300, 70)).astype(np.float32), "b": np.arange(5, dtype=np.float32)}


def _client(running, **changes):
    return ParamServerClient(dataclasses.replace(running.settings, **changes), retry_s=0)


def _pull(client, plan, have=-1):
    version, tensors, buf = client.pull(have)
    plan.check_layout(tensors)
    return version, plan.unpack(bytes(buf))


@pytest.mark.parametrize("bulk_lane", [True, False])
def test_round_trip_on_either_path_is_bit_identical(make_ps, bulk_lane):
    settings = ServerSettings(
        address="127.0.0.1:0",
        token=TOKEN,
        max_message_mb=8,
        chunk_mb=1,
        weight_lanes=("bulk", "grpc") if bulk_lane else ("grpc",),
    )
    running = make_ps(settings=settings)
    assert (running.server.half("bulk") is not None) == bulk_lane
    client = running.client
    plan = WirePlan.for_tree(TREE)
    assert client.push(plan, TREE, 0).committed
    assert (client.lane("bulk") is not None) == bulk_lane
    version, back = _pull(client, plan)
    assert version == 0
    for k, value in TREE.items():
        np.testing.assert_array_equal(np.asarray(back[k]), value)
    assert client.pull(0) is None


def test_a_bulk_push_and_a_grpc_pull_see_the_same_bytes(ps):
    plan = WirePlan.for_tree(TREE)
    ps.client.push(plan, TREE, 0)
    grpc_client = _client(ps, weight_lanes=("grpc",))
    via_grpc = grpc_client.pull(-1)[2]
    assert bytes(via_grpc) == bytes(ps.client.pull(-1)[2]) == plan.pack(TREE).tobytes()
    grpc_client.close()


def _frames(plan, tree, *, chunk=1 << 20):
    return [(o, bytes(v)) for o, v in chunks(plan.pack(tree), chunk)]


def _raw_bulk_push(running, header, frames, *, tamper=lambda f: f, hang_up=False):
    """Stage over gRPC, then send hand-made frames; returns the reply frame (status, payload)."""
    ticket = running.client._call("Stage", header, timeout=10)
    with socket.create_connection(("127.0.0.1", ticket.port), timeout=10) as sock:
        sock.sendall(transfer.MAGIC + ticket.ticket)
        for offset, data in frames:
            frame = struct.pack("<QQ", len(data), xxhash.xxh3_64_intdigest(data)) + data
            sock.sendall(tamper((offset, frame))[1])
        if hang_up:
            return None
        try:
            status, n = struct.unpack("<BI", sock.recv(5, socket.MSG_WAITALL))
        except struct.error:
            return None  # the server closed the connection
        return status, sock.recv(n, socket.MSG_WAITALL)


def _flip_byte(index):
    def tamper(item):
        offset, frame = item
        if offset == 0:
            frame = frame[:index] + bytes([frame[index] ^ 1]) + frame[index + 1 :]
        return offset, frame

    return tamper


@pytest.mark.parametrize(
    "case, tamper, code",
    [
        ("corrupted data", _flip_byte(16 + 40), grpc.StatusCode.DATA_LOSS),
        ("wrong checksum", _flip_byte(8), grpc.StatusCode.DATA_LOSS),
        (
            "frame overruns the part",
            lambda f: (f[0], struct.pack("<QQ", 1 << 40, 0)),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            "empty frame",
            lambda f: (f[0], struct.pack("<QQ", 0, 0)),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ],
)
def test_bad_bulk_frames_are_refused_and_change_nothing(ps, case, tamper, code):
    plan = WirePlan.for_tree(TREE)
    ps.client.push(plan, TREE, 0)
    header = ps.client.header(plan, 1)
    reply = _raw_bulk_push(
        ps, header, _frames(plan, {k: v + 1 for k, v in TREE.items()}, chunk=4096), tamper=tamper
    )
    assert reply is not None and reply[0] == code.value[0], (case, reply)
    assert ps.client.stat().version == 0 and ps.client.stat().pushes_rejected == 1
    np.testing.assert_array_equal(_pull(ps.client, plan)[1]["a"], TREE["a"])
    assert ps.server.weights._staged_bytes == 0


def test_a_push_cut_off_mid_stream_leaves_the_previous_version(ps):
    plan = WirePlan.for_tree(TREE)
    ps.client.push(plan, TREE, 0)
    frames = _frames(plan, {k: v + 1 for k, v in TREE.items()}, chunk=4096)
    assert _raw_bulk_push(ps, ps.client.header(plan, 1), frames[:3], hang_up=True) is None
    deadline = time.monotonic() + 5
    while ps.server.weights._staged_bytes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ps.server.weights._staged_bytes == 0
    assert ps.client.stat().version == 0
    np.testing.assert_array_equal(_pull(ps.client, plan)[1]["a"], TREE["a"])
    assert ps.client.push(plan, TREE, 1).committed  # and the next push goes through


def test_tickets_are_one_use_and_strangers_are_turned_away(ps):
    plan = WirePlan.for_tree(TREE)
    header = ps.client.header(plan, 0)
    ticket = ps.client._call("Stage", header, timeout=10)
    frames = _frames(plan, TREE)
    for hello in (b"XXXX" + ticket.ticket, transfer.MAGIC + bytes(16)):
        with socket.create_connection(("127.0.0.1", ticket.port), timeout=10) as sock:
            sock.sendall(hello)
            assert sock.recv(1) == b""  # closed without a word
    assert ps.client.stat().version == -1
    # The bad-magic attempt spent the real ticket: the part was released, nothing committed.
    assert ps.server.weights._staged_bytes == 0
    with pytest.raises(grpc.RpcError) as err:
        ps.client._calls["Stage"](header, metadata=(("authorization", "Bearer wrong"),))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _raw_bulk_push(ps, ps.client.header(plan, 0), frames)[0] == 0


def test_an_unclaimed_ticket_expires_and_releases_its_buffer(ps):
    plan = WirePlan.for_tree(TREE)
    listener = ps.server.half("bulk").listener
    part = ps.server.weights.begin(ps.client.header(plan, 0))
    listener.issue(
        lambda conn: None, lambda: ps.server.weights.abandon(part, rejected=False), ttl_s=0.0
    )
    assert ps.server.weights._staged_bytes == plan.nbytes
    listener._expire()
    assert ps.server.weights._staged_bytes == 0


def test_a_pull_in_progress_keeps_its_version_while_newer_ones_commit(ps):
    plan = WirePlan.for_tree(TREE)
    ps.client.push(plan, TREE, 0)
    ticket = ps.client._call("OpenPull", pb.PullRequest(have_version=-1), timeout=10)
    for v in (1, 2, 3):  # recycled buffers must never be the one being read
        ps.client.push(plan, {k: x + v for k, x in TREE.items()}, v)
    buf = bytearray(ticket.header.nbytes)
    transfer.receive_into(
        "127.0.0.1",
        ticket.port,
        ticket.ticket,
        buf,
        [(s.offset, s.length, s.checksum) for s in ticket.segments],
    )
    assert ticket.header.version == 0 and bytes(buf) == plan.pack(TREE).tobytes()
    version, back = _pull(ps.client, plan)
    assert version == 3
    np.testing.assert_array_equal(np.asarray(back["a"]), TREE["a"] + 3)


# -- multi-part pushes: each trainer host pushes its own shards ---------------

W = rng.standard_normal((6, 8)).astype(np.float32)  # rows split across the two hosts
V = rng.standard_normal((4, 10)).astype(np.float32)  # a 2 x 2 grid of shards
R = rng.standard_normal(3).astype(np.float32)  # replicated: host 0 pushes it


def _part(version, part, shards, num_parts=2):
    """A part's header and bytes: shards = [(name, index, whole, start, stop)]."""
    header = pb.PartHeader(
        version=version, part=part, num_parts=num_parts, push_id=f"{version}-{part}"
    )
    pieces, offset = [], 0
    for name, index, whole, start, stop in shards:
        block = np.ascontiguousarray(whole[tuple(slice(a, b) for a, b in zip(start, stop))])
        header.tensors.add(
            name=name,
            dtype="float32",
            shape=whole.shape,
            slice_start=start,
            slice_shape=block.shape,
            offset=offset,
            nbytes=block.nbytes,
            index=index,
        )
        pieces.append((offset, memoryview(block.tobytes())))
        offset += block.nbytes
    header.nbytes = offset
    return header, pieces


def _host(i, version=0):
    rows = (0, 3) if i == 0 else (3, 6)
    shards = [("w", 1, W, (rows[0], 0), (rows[1], 8))]
    shards += [("v", 2, V, (i * 2, 0), (i * 2 + 2, 5)), ("v", 2, V, (i * 2, 5), (i * 2 + 2, 10))]
    if i == 0:
        shards.insert(0, ("r", 0, R, (0,), (3,)))
    return _part(version, i, shards)


@pytest.mark.parametrize("bulk_lane", [True, False])
def test_two_hosts_push_shards_and_workers_pull_whole_tensors(ps, bulk_lane):
    client = _client(ps, weight_lanes=("bulk", "grpc") if bulk_lane else ("grpc",))
    first = client.push_part(*_host(1))
    assert not first.committed and client.stat().version == -1  # waits for host 0
    assert client.push_part(*_host(0)).committed
    version, tensors, buf = client.pull(-1)
    assert version == 0 and [t["name"] for t in tensors] == ["r", "w", "v"]
    tree = {"r": R, "w": W, "v": V}
    plan = WirePlan.for_tree({"0": R, "1": W, "2": V})
    assert [t["nbytes"] for t in tensors] == [t.nbytes for t in plan.tensors]
    assert bytes(buf) == b"".join(tree[k].tobytes() for k in ("r", "w", "v"))
    assert client.push_part(*_host(0)).duplicate  # a retried part changes nothing
    client.close()


def test_a_whole_version_then_the_same_model_split_over_hosts_is_accepted(ps):
    # As after a parameter-server restart: its saved weights come back as one
    # part, then a trainer on two hosts pushes its own split of the same model.
    whole = _part(
        0,
        0,
        [(n, i, x, (0,) * x.ndim, x.shape) for n, i, x in (("r", 0, R), ("w", 1, W), ("v", 2, V))],
        num_parts=1,
    )
    assert ps.client.push_part(*whole).committed
    assert not ps.client.push_part(*_host(0, version=1)).committed
    assert ps.client.push_part(*_host(1, version=1)).committed
    version, _, buf = ps.client.pull(-1)
    assert version == 1 and bytes(buf) == R.tobytes() + W.tobytes() + V.tobytes()
    # Each split's layout is then fixed: host 1 may not change how it cuts "w".
    header, pieces = _part(
        2,
        1,
        [
            ("w", 1, W, (3, 0), (6, 4)),
            ("w", 1, W, (3, 4), (6, 8)),
            ("v", 2, V, (2, 0), (4, 5)),
            ("v", 2, V, (2, 5), (4, 10)),
        ],
    )
    with pytest.raises(grpc.RpcError) as err:
        ps.client.push_part(header, pieces)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "layout" in err.value.details()


def _bad_tiling(kind):
    header, pieces = _host(1)
    t = header.tensors[0]  # "w", rows 3..6
    if kind == "overlap":
        t.slice_start[0] = 2  # rows 2..5 overlap host 0's 0..3; row 5 is missing
    elif kind == "shape disagrees":
        t.shape[1] = 9
        t.slice_shape[1] = 8
    return header, pieces


@pytest.mark.parametrize("kind", ["overlap", "shape disagrees"])
def test_shards_that_do_not_tile_their_tensor_are_refused(ps, kind):
    ps.client.push_part(*_host(0))
    with pytest.raises(grpc.RpcError) as err:
        ps.client.push_part(*_bad_tiling(kind))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'w'" in err.value.details()
    assert ps.client.stat().version == -1
    assert ps.client.push_part(*_host(1)).committed  # the good part still completes the version
    assert ps.client.pull(-1)[0] == 0


@pytest.mark.parametrize("bulk_lane", [True, False])
def test_a_host_with_no_blocks_pushes_an_empty_part(ps, bulk_lane):
    client = _client(ps, weight_lanes=("bulk", "grpc") if bulk_lane else ("grpc",))
    header, pieces = _part(0, 0, [("r", 0, R, (0,), (3,))])
    assert not client.push_part(header, pieces).committed
    assert client.push_part(_part(0, 1, [])[0], []).committed
    version, _, buf = client.pull(-1)
    assert version == 0 and bytes(buf) == R.tobytes()
    with pytest.raises(grpc.RpcError) as err:  # but a whole version of nothing is refused
        client.push_part(_part(1, 0, [], num_parts=1)[0], [])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    client.close()


def test_a_server_gone_mid_transfer_reads_as_unavailable(ps):
    """Callers retry UNAVAILABLE (a restarting server); a lane failure must look the same."""
    plan = WirePlan.for_tree(TREE)
    ps.client.push(plan, TREE, 0)
    ticket = ps.client._call("OpenPull", pb.PullRequest(have_version=-1), timeout=10)
    ps.server.stop(grace=None)
    with pytest.raises(grpc.RpcError) as err:
        transfer.receive_into(
            "127.0.0.1", ticket.port, ticket.ticket, bytearray(ticket.header.nbytes), []
        )
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError) as err:
        transfer.send_part("127.0.0.1", ticket.port, bytes(16), [(0, memoryview(b"x"))])
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_corrupted_pull_is_data_loss(ps):
    plan = WirePlan.for_tree(TREE)
    ps.client.push(plan, TREE, 0)
    ticket = ps.client._call("OpenPull", pb.PullRequest(have_version=-1), timeout=10)
    segments = [(s.offset, s.length, s.checksum ^ 1) for s in ticket.segments]
    with pytest.raises(grpc.RpcError) as err:
        transfer.receive_into(
            "127.0.0.1", ticket.port, ticket.ticket, bytearray(ticket.header.nbytes), segments
        )
    assert err.value.code() == grpc.StatusCode.DATA_LOSS
