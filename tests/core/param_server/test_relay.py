"""Relayed pulls: workers serve the version they pull to the workers the server points to them.

What must hold: every puller ends with exactly the pushed bytes; the server
sends a version a bounded number of times; a relay that dies mid-transfer or
serves wrong bytes costs the puller a retry from another source, never a
corrupt version; a relay holding an older version is never served as new.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time

import numpy as np
import pytest

from rlax.core.errors import BadSetting
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.settings import ServerSettings
from rlax.core.param_server.transport.relay import (
    Limiter,
    relay_hello,
    relay_key,
    send_file,
    send_view,
)
from rlax.core.param_server.transport.relay_lane import RelayLane
from rlax.core.param_server.transport.relay_routes import RelayDirectory
from rlax.core.wire import WirePlan

from ..conftest import TOKEN

rng = np.random.default_rng(7)
TREE = {
    "w": rng.standard_normal((256, 1024)).astype(np.float32),
    "b": np.arange(7, dtype=np.float32),
}
PLAN = WirePlan.for_tree(TREE)
NBYTES = PLAN.nbytes  # 1 MiB and a bit


def _settings(fanout: int, direct: int = 1) -> ServerSettings:
    return ServerSettings(
        address="127.0.0.1:0",
        token=TOKEN,
        max_message_mb=8,
        chunk_mb=1,
        lanes=(("relay", RelayLane(fanout=fanout, direct=direct)),),
    )


def _puller(running) -> ParamServerClient:
    return ParamServerClient(running.settings, retry_s=0, relay=True)


def _tree(seed: int) -> dict:
    r = np.random.default_rng(seed)
    return {k: r.standard_normal(v.shape).astype(np.float32) for k, v in TREE.items()}


@pytest.fixture
def pullers():
    made: list[ParamServerClient] = []
    yield made
    for c in made:
        c.close()


def test_a_fleet_pulls_through_a_tree_and_the_server_sends_the_version_once(make_ps, pullers):
    running = make_ps(settings=_settings(fanout=2))
    running.client.push(PLAN, TREE, 0)
    pullers += [_puller(running) for _ in range(7)]
    got: dict[int, bytes] = {}

    def pull(i):
        got[i] = bytes(pullers[i].pull(-1)[2])

    threads = [threading.Thread(target=pull, args=(i,)) for i in range(7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    expected = PLAN.pack(TREE).tobytes()
    assert len(got) == 7 and all(b == expected for b in got.values())
    stat = running.client.stat()
    assert running.client.stat().bytes_served == NBYTES  # one direct pull; six came from relays
    assert stat.relay_assignments == 6
    nodes = running.server.half("relay").directory.nodes()
    assert len(nodes) == 7 and sum(n.parent == "" for n in nodes) == 1
    assert max(sum(m.parent == n.worker for m in nodes) for n in nodes) == 2  # fanout bound
    assert sum(c.lane("relay").relay.bytes_sent for c in pullers) == 6 * NBYTES
    assert pullers[0].pull(0) is None  # already current: nothing is sent


def _pull_in_thread(client, out: dict):
    def run():
        try:
            out["result"] = client.pull(-1)
        except Exception as err:  # noqa: BLE001 — the test reads it
            out["error"] = err

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_relay_killed_mid_transfer_costs_its_pullers_a_retry_never_a_corrupt_version(
    make_ps, pullers
):
    running = make_ps(settings=_settings(fanout=1))
    running.client.push(PLAN, TREE, 0)
    a, b, c = (_puller(running) for _ in range(3))
    pullers += [a, b, c]
    assert a.pull(-1)[0] == 0  # fed by the server: A is the tree's root
    # ~1 s for the version: B is caught mid-transfer
    a.lane("relay").relay.egress = Limiter(1 << 20)
    out_b: dict = {}
    tb = _pull_in_thread(b, out_b)  # B pulls from A ...
    deadline = time.monotonic() + 10
    while not running.server.half("relay").directory.nodes()[1:] and time.monotonic() < deadline:
        time.sleep(0.01)
    out_c: dict = {}
    tc = _pull_in_thread(c, out_c)  # ... and C from B, as B receives
    while a.lane("relay").relay.bytes_sent < NBYTES // 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 0 < a.lane("relay").relay.bytes_sent < NBYTES
    a.lane("relay").relay.close()  # A dies mid-transfer
    tb.join(30)
    tc.join(30)
    expected = PLAN.pack(TREE).tobytes()
    for out in (out_b, out_c):
        assert "error" not in out
        version, _, buf = out["result"]
        assert version == 0 and bytes(buf) == expected  # verified, complete
    # The retries went elsewhere (the server, or B once it re-registered): bounded.
    assert NBYTES * 2 <= running.client.stat().bytes_served <= NBYTES * 3
    assert all(n.worker != a.relay_id for n in running.server.half("relay").directory.nodes())


def test_a_relay_serving_wrong_bytes_costs_a_retry_and_is_dropped(make_ps, pullers):
    running = make_ps(settings=_settings(fanout=1))
    running.client.push(PLAN, TREE, 0)
    a, b = _puller(running), _puller(running)
    pullers += [a, b]
    _, _, buf_a = a.pull(-1)
    buf_a[12345] ^= 0xFF  # A's copy is corrupt (a bad DIMM); it still relays it
    version, _, buf_b = b.pull(-1)
    assert version == 0 and bytes(buf_b) == PLAN.pack(TREE).tobytes()
    assert running.client.stat().bytes_served == 2 * NBYTES  # B's retry came from the server
    assert [n.worker for n in running.server.half("relay").directory.nodes()] == [
        b.relay_id
    ]  # A is dropped


def test_a_stale_relay_is_never_served_as_new(make_ps, pullers):
    running = make_ps(settings=_settings(fanout=4))
    running.client.push(PLAN, TREE, 0)
    a, b = _puller(running), _puller(running)
    pullers += [a, b]
    a.pull(-1)  # A holds version 0 and relays it
    newer = _tree(1)
    running.client.push(PLAN, newer, 1)
    version, _, buf = b.pull(-1)  # A has room, but holds version 0: B is fed by the server
    assert version == 1 and bytes(buf) == PLAN.pack(newer).tobytes()
    assert running.client.stat().bytes_served == 2 * NBYTES
    assert running.client.stat().relay_assignments == 0
    # Asked for version 1 directly, A (holding 0) closes without a byte.
    a.lane("relay").relay.begin_wait_s = 0.2
    with socket.create_connection(("127.0.0.1", a.lane("relay").relay.port), timeout=5) as sock:
        sock.sendall(relay_hello(1, relay_key(TOKEN, 1)))
        assert sock.recv(1 << 16) == b""
    # A wrong key is refused even for the version A holds.
    with socket.create_connection(("127.0.0.1", a.lane("relay").relay.port), timeout=5) as sock:
        sock.sendall(relay_hello(0, relay_key("another token", 0)))
        assert sock.recv(1 << 16) == b""


def test_the_directory_grows_a_breadth_first_tree_and_forgets_failed_subtrees():
    d = RelayDirectory(fanout=2, direct=1)
    sources = {w: d.assign(5, w, "h", 100 + i) for i, w in enumerate("abcdefg")}
    assert sources["a"].direct
    parents = {w: s.worker for w, s in sources.items()}
    assert parents == {"a": "", "b": "a", "c": "a", "d": "b", "e": "b", "f": "c", "g": "c"}
    # d's source b failed: b and its subtree (d, e) leave, which frees a place under a.
    assert sources["d"].name == "b#2"
    again = d.assign(5, "d", "h", 103, failed=sources["d"].name)
    assert again.worker == "a"
    assert [n.worker for n in d.nodes()] == ["a", "c", "f", "g", "d"]
    # A report about another registration of d than its current one changes nothing.
    d.assign(5, "x", failed="d#2")
    assert "d" in {n.worker for n in d.nodes()}
    # Asking again, a node leaves with its subtree before it is placed (never below itself).
    d.assign(5, "q", "h", 300)  # under c's child f
    assert d.assign(5, "c", "h", 102).worker not in {"c", "f", "g", "q"}
    # A new version: a new tree, and a relay of the old version is never a source.
    assert d.assign(6, "z", "h", 200).direct
    assert d.assign(6, "y", "h", 201).worker == "z"
    assert {n.worker for n in d.nodes()} == {"z", "y"}


def test_without_relays_every_pull_is_direct_and_nothing_listens(make_ps, pullers):
    running = make_ps(settings=_settings(fanout=0))
    running.client.push(PLAN, TREE, 0)
    pullers += [_puller(running) for _ in range(2)]
    assert all(p.lane("relay") is None for p in pullers)
    for p in pullers:
        assert bytes(p.pull(-1)[2]) == PLAN.pack(TREE).tobytes()
    assert running.client.stat().bytes_served == 2 * NBYTES


def test_relay_settings_are_checked():
    with pytest.raises(BadSetting, match=r"must be >= 0 \(0: no relays\), got -1") as err:
        RelayLane(fanout=-1)
    assert err.value.parameter == "fanout"
    with pytest.raises(BadSetting, match="must be >= 1, got 0") as err:
        RelayLane(direct=0)
    assert err.value.parameter == "direct"


def test_a_relaying_client_of_a_server_without_the_bulk_lane_pulls_over_grpc(make_ps, pullers):
    settings = dataclasses.replace(_settings(fanout=2), weight_lanes=("relay", "grpc"))
    running = make_ps(settings=settings)
    running.client.push(PLAN, TREE, 0)
    client = ParamServerClient(
        dataclasses.replace(running.settings, weight_lanes=("relay", "bulk", "grpc")),
        retry_s=0,
        relay=True,
    )
    pullers.append(client)
    assert client.lane("relay") is not None
    version, _, buf = client.pull(-1)
    assert version == 0 and bytes(buf) == PLAN.pack(TREE).tobytes() and client.lane("bulk").absent


def _peer_holds(peer: socket.socket) -> int:
    try:
        return len(peer.recv(1 << 22, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return 0


@pytest.mark.parametrize("how", ["sendall", "stepped", "limited", "file"])
def test_a_peer_never_holds_bytes_the_sender_has_not_counted(tmp_path, how):
    # The law behind reading bytes_served right after a pull: every count is
    # made before its bytes can reach the peer, so when the count callback runs
    # the peer holds at most what was counted before it; a send that fails
    # takes its count back.
    payload = bytes(range(256)) * 768  # 192 KiB: three 64 KiB steps, fits the socket buffer
    ours, peer = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    counted, seen = [0], []

    def count(n: int) -> None:
        seen.append((_peer_holds(peer), counted[0]))
        counted[0] += n

    with ours, peer:
        if how == "file":
            path = tmp_path / "w.bin"
            path.write_bytes(payload)
            with open(path, "rb") as f:
                send_file(ours, f.fileno(), len(payload), Limiter(1 << 40), count)
        else:
            limiter = Limiter(1 << 40) if how == "limited" else None
            alive = (lambda: True) if how == "stepped" else None
            send_view(ours, memoryview(payload), limiter, count, alive)
        assert counted[0] == len(payload) == _peer_holds(peer)
        assert seen and all(holds <= before for holds, before in seen)
        # A send to a closed peer fails and counts nothing.
        peer.close()
        failed = [0]
        with pytest.raises(OSError):
            send_view(
                ours, memoryview(payload), None, lambda n: failed.__setitem__(0, failed[0] + n)
            )
        assert failed[0] == 0
