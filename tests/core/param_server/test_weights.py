"""WeightStore over real gRPC: round trips, and every bad push rejected with nothing changed."""

from __future__ import annotations

import dataclasses
import socket
import time

import grpc
import ml_dtypes
import numpy as np
import pytest
import xxhash

from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.settings import ServerSettings
from rlax.core.param_server.transport.chunk_codec import decode_chunk, encode_chunk
from rlax.core.wire import WirePlan

from ..conftest import TOKEN

rng = np.random.default_rng(0)
TREE = {
    "embed": rng.standard_normal((50, 16)).astype(np.float32),
    "blocks": [{"w": rng.standard_normal((16, 700)).astype(np.float32)} for _ in range(3)],
    "norm": rng.standard_normal((16,)).astype(np.float32),
}  # ~140 KB: several 1 MB-limited chunks only when chunk_mb is small, see below


def pulled_tree(client, plan, have=-1):
    version, tensors, buf = client.pull(have)
    plan.check_layout(tensors)
    return version, plan.unpack(buf)


def assert_tree_equal(a, b):
    for x, y in zip(_leaves(a), _leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _leaves(t):
    import jax

    return jax.tree_util.tree_leaves(t)


def test_chunk_codec_matches_protobuf():
    data = memoryview(bytes(range(200)) * 3)
    raw = encode_chunk(2, 123456789, data)
    msg = pb.WeightChunk.FromString(raw)
    digest = xxhash.xxh3_64_intdigest(bytes(data))
    assert (msg.part, msg.offset, msg.data, msg.checksum) == (2, 123456789, bytes(data), digest)
    part, offset, view, got = decode_chunk(msg.SerializeToString())
    assert (part, offset, bytes(view), got) == (2, 123456789, bytes(data), digest)
    assert decode_chunk(pb.WeightChunk(header=pb.PartHeader(version=1)).SerializeToString()) is None


def test_fp32_round_trip_is_bit_identical_and_pull_is_empty_when_current(ps):
    plan = WirePlan.for_tree(TREE)
    reply = ps.client.push(plan, TREE, 0)
    assert reply.committed and reply.version == 0
    version, back = pulled_tree(ps.client, plan)
    assert version == 0
    assert_tree_equal(back, TREE)
    assert ps.client.pull(have_version=0) is None
    assert ps.client.stat().version_bytes == plan.nbytes


def test_bf16_round_trip_is_bf16_rounding(ps):
    plan = WirePlan.for_tree(TREE, "bfloat16")
    ps.client.push(plan, TREE, 0)
    _, back = pulled_tree(ps.client, plan)
    expected = {k: v for k, v in TREE.items()}
    for x, y in zip(_leaves(back), _leaves(expected)):
        np.testing.assert_array_equal(
            np.asarray(x), np.asarray(y).astype(ml_dtypes.bfloat16).astype(np.float32)
        )
    assert plan.nbytes * 2 == WirePlan.for_tree(TREE).nbytes


def test_many_chunks_and_a_newer_version_replaces_the_old(make_ps):
    running = make_ps()
    settings = dataclasses.replace(running.settings, chunk_mb=1)
    big = {"w": rng.standard_normal((1 << 20) // 4 * 3 + 5).astype(np.float32)}  # > 3 chunks
    client = ParamServerClient(settings)
    plan = WirePlan.for_tree(big)
    client.push(plan, big, 0)
    newer = {"w": big["w"] + 1}
    client.push(plan, newer, 1)
    version, back = pulled_tree(client, plan, have=0)
    assert version == 1
    np.testing.assert_array_equal(back["w"], newer["w"])
    assert client.wait_for_version(0, timeout_s=0.1) == 1
    client.close()


def _messages(client, plan, tree, version):
    return list(client.push_messages(plan, plan.pack(tree), version))


def _raw_push(client, messages):
    return client.lane("grpc")._push(iter(messages), metadata=client._auth)


def _state(client, plan):
    stat = client.stat()
    return stat.version, stat.version_bytes, pulled_tree(client, plan)[1]


def _flip_checksum(raw):
    msg = pb.WeightChunk.FromString(raw)
    msg.checksum ^= 1
    return msg.SerializeToString()


def _tamper_header(messages, fn):
    first = pb.WeightChunk.FromString(messages[0])
    fn(first.header)
    return [first.SerializeToString(), *messages[1:]]


BAD_PUSHES = {
    "unknown tensor": (
        lambda m, c, p: _tamper_header(m, lambda h: setattr(h.tensors[0], "name", "evil")),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "wrong shape": (
        lambda m, c, p: _tamper_header(m, lambda h: h.tensors[-1].shape.__setitem__(0, 8)),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "wrong dtype": (
        lambda m, c, p: _tamper_header(m, lambda h: setattr(h.tensors[0], "dtype", "float64")),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "wrong size": (
        lambda m, c, p: _tamper_header(m, lambda h: setattr(h, "nbytes", h.nbytes + 4)),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "bad checksum": (
        lambda m, c, p: [m[0], _flip_checksum(m[1]), *m[2:]],
        grpc.StatusCode.DATA_LOSS,
    ),
    "corrupted data": (
        lambda m, c, p: [m[0], m[1][:40] + bytes([m[1][40] ^ 1]) + m[1][41:], *m[2:]],
        grpc.StatusCode.DATA_LOSS,
    ),
    "version regression": (
        lambda m, c, p: _tamper_header(m, lambda h: setattr(h, "version", 0)),
        grpc.StatusCode.FAILED_PRECONDITION,
    ),
    "out-of-order chunk": (
        lambda m, c, p: [m[0], m[2], m[1], *m[3:]],
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "duplicate chunk": (
        lambda m, c, p: [m[0], m[1], m[1], *m[2:]],
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "cut off (missing last chunk)": (lambda m, c, p: m[:-1], grpc.StatusCode.INVALID_ARGUMENT),
    "garbage bytes": (lambda m, c, p: [b"\xff\xfe\xfd" * 10], grpc.StatusCode.INVALID_ARGUMENT),
    "data before header": (lambda m, c, p: m[1:], grpc.StatusCode.INVALID_ARGUMENT),
}


@pytest.mark.parametrize("case", sorted(BAD_PUSHES))
def test_bad_push_is_rejected_and_changes_nothing(make_ps, case):
    running = make_ps()
    client = ParamServerClient(dataclasses.replace(running.settings, chunk_mb=1), retry_s=0)
    big = {
        "a": rng.standard_normal((3 << 18) + 7).astype(np.float32),
        "b": np.ones((4, 4), np.float32),
    }
    plan = WirePlan.for_tree(big)
    client.push(plan, big, 0)
    before = _state(client, plan)
    messages = _messages(client, plan, {k: v * 2 for k, v in big.items()}, 1)
    assert len(messages) >= 4  # header + at least 3 data chunks
    tamper, code = BAD_PUSHES[case]
    with pytest.raises(grpc.RpcError) as err:
        _raw_push(client, tamper(messages, client, plan))
    assert err.value.code() == code, err.value.details()
    after = _state(client, plan)
    assert after[:2] == before[:2]
    assert_tree_equal(after[2], before[2])
    assert client.stat().pushes_rejected == 1
    client.close()


def test_stream_broken_by_the_client_leaves_the_previous_version(ps):
    plan = WirePlan.for_tree(TREE)
    ps.client.push(plan, TREE, 0)
    messages = _messages(
        ps.client,
        plan,
        {"embed": TREE["embed"] + 1, "blocks": TREE["blocks"], "norm": TREE["norm"]},
        1,
    )

    def cut():
        yield messages[0]
        raise ConnectionError("trainer preempted mid-push")

    with pytest.raises(grpc.RpcError):
        _raw_push(ps.client, cut())
    version, back = pulled_tree(ps.client, plan)
    assert version == 0
    assert_tree_equal(back, TREE)


def test_oversized_message_is_refused_by_the_transport(ps):
    plan = WirePlan.for_tree(TREE)
    ps.client.push(plan, TREE, 0)
    huge = encode_chunk(0, 0, memoryview(bytes(9 << 20)))  # over the server's 8 MB limit
    with pytest.raises(grpc.RpcError) as err:
        _raw_push(ps.client, [_messages(ps.client, plan, TREE, 1)[0], huge])
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ps.client.stat().version == 0


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_nothing_is_pushed_without_the_token(ps, token):
    plan = WirePlan.for_tree(TREE)
    messages = _messages(ps.client, plan, TREE, 0)
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    with pytest.raises(grpc.RpcError) as err:
        ps.client.lane("grpc")._push(iter(messages), metadata=metadata)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ps.client.stat().version == -1
    assert ps.client.pull() is None


def test_same_push_id_twice_is_a_duplicate(ps):
    plan = WirePlan.for_tree(TREE)
    messages = _messages(ps.client, plan, TREE, 0)
    assert _raw_push(ps.client, messages).committed
    again = _raw_push(ps.client, messages)
    assert again.duplicate and ps.client.stat().pushes_rejected == 0


def test_streamed_chunks_cover_the_packed_buffer_exactly():
    from rlax.core.wire import stream

    tree = {
        "a": np.arange(10, dtype=np.float32),
        "b": np.ones((300, 300), np.float32),
        "c": np.full(7, 2.0, np.float32),
        "d": np.zeros(3, np.float32),
    }
    plan = WirePlan.for_tree(tree)
    pieces = list(stream(plan, tree, 64 * 1024))
    offsets = [o for o, _ in pieces]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert b"".join(bytes(v) for _, v in pieces) == plan.pack(tree).tobytes()
    assert all(len(v) <= 64 * 1024 for _, v in pieces)


@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_an_unreachable_server_is_retried_until_the_client_gives_up():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    asked = []
    # 60 s of retries allowed, but give_up turns True at its third question.
    client = ParamServerClient(
        ServerSettings(address=address, token=TOKEN),
        retry_s=60.0,
        give_up=lambda: asked.append(1) or len(asked) > 2,
    )
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        client.stat()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(asked) == 3  # asked after each failure: retried twice, then gave up
    assert time.monotonic() - start < 5.0  # 0.2 + 0.4 s of backoff, not 60 s
    client.close()
