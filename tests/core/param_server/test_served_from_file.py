"""Versions served from files: the store holds one buffer, or none, not two (issue 20).

Laws: after the persister has saved the served version, pulls read the file
and the memory buffer goes back to the pool (``memory_bytes`` is one
version's, and the next push lands in that very buffer); a pull opened
before the swap reads the memory version whole; a file being read survives
its deletion; a restart serves the saved file without holding its bytes.
With a spool (the role's setting) a push lands in a file: ``memory_bytes``
stays 0, the save is a hard link of that file, a failed push deletes its
file, and a superseded version's file goes once its last reader is done.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.transport.relay import Limiter
from rlax.core.param_server.weights.parts import PushRejected
from rlax.core.param_server.weights.persist import WeightPersister
from rlax.core.wire import WirePlan

rng = np.random.default_rng(3)
TREE = {
    "a": rng.standard_normal((700, 900)).astype(np.float32),
    "b": np.arange(7, dtype=np.float32),
}
PLAN = WirePlan.for_tree(TREE)  # 2.5 MB: three 1 MB chunks on the wire
NBYTES = PLAN.nbytes


def version_bytes(k: int) -> bytes:
    return PLAN.pack({name: x + k for name, x in TREE.items()}).tobytes()


def push(running, k: int) -> None:
    running.client.push(PLAN, {name: x + k for name, x in TREE.items()}, k)


def pulled(running, *, bulk_lane: bool = True) -> tuple[int, bytes]:
    client = ParamServerClient(
        dataclasses.replace(
            running.settings, weight_lanes=("bulk", "grpc") if bulk_lane else ("grpc",)
        ),
        retry_s=0,
    )
    try:
        version, _, buf = client.pull(-1)
        return version, bytes(buf)
    finally:
        client.close()


def opened(fd: int) -> tuple[int, int] | None:
    """The (device, inode) open as ``fd``, None if closed (a closed number may be reused)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def test_after_a_save_pulls_read_the_file_and_the_next_push_reuses_the_buffer(tmp_path, make_ps):
    running = make_ps()
    store = running.server.weights
    persister = WeightPersister(tmp_path, running.settings, store=store)
    push(running, 1)
    buffer = store._served.buffer
    assert store.memory_bytes == NBYTES  # the served version, in memory
    assert persister.save_newest() == 1
    served = store._served
    fd, saved_file = served.fd, os.stat(tmp_path / "1" / "buffer" / "buffer.bin")
    assert served.number == 1 and served.buffer is None
    assert opened(fd) == (saved_file.st_dev, saved_file.st_ino)  # the saved file itself
    assert store._pool.buffers() == [buffer] and store.memory_bytes == NBYTES  # a spare, no more
    assert store.version == 1 and store.version_bytes == NBYTES
    for bulk_lane in (True, False):  # the bulk lane (sendfile) and gRPC chunks (pread)
        assert pulled(running, bulk_lane=bulk_lane) == (1, version_bytes(1))
    running.server.half("bulk").egress = Limiter(1 << 30)  # a simulated uplink: sent step by step
    assert pulled(running) == (1, version_bytes(1))
    push(running, 2)
    assert store._served.buffer is buffer and store.memory_bytes == NBYTES  # the same memory
    assert served.fd is None  # superseded and unread: its file is closed
    assert opened(fd) != (saved_file.st_dev, saved_file.st_ino)
    assert pulled(running) == (2, version_bytes(2))
    persister.stop()


def test_a_pull_opened_before_the_swap_reads_the_memory_version_whole(tmp_path, make_ps):
    running = make_ps()
    store = running.server.weights
    persister = WeightPersister(tmp_path, running.settings, store=store)
    push(running, 1)
    held = store.open_pull(-1)  # a pull in flight on the memory version
    persister.save_newest()
    assert store._served.buffer is None and store._pool.buffers() == []  # not recycled under it
    push(running, 2)  # so the next version needs a second buffer
    assert store.memory_bytes == 2 * NBYTES
    assert bytes(held.read(0, NBYTES)) == version_bytes(1)  # untouched by the push
    store.close_pull(held)
    assert store._pool.buffers() == [held.buffer] and store.memory_bytes == 2 * NBYTES
    persister.save_newest()  # v2 goes to its file as well: two spares, nothing served in memory
    assert store._served.buffer is None and pulled(running) == (2, version_bytes(2))
    persister.stop()


def test_a_file_being_read_survives_its_deletion(tmp_path, make_ps):
    running = make_ps()
    store = running.server.weights
    persister = WeightPersister(tmp_path, running.settings, keep=1, store=store)
    push(running, 1)
    persister.save_newest()
    held = store.open_pull(-1)
    assert held.buffer is None  # reading v1's file
    push(running, 2)
    persister.save_newest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2"]  # v1's directory is gone
    assert bytes(held.read(0, NBYTES)) == version_bytes(1)
    fd = held.fd
    assert fd is not None and os.fstat(fd).st_nlink == 0  # deleted, still open
    ident = opened(fd)
    store.close_pull(held)
    assert held.fd is None and opened(fd) != ident  # closed once the last reader is done


def test_a_restart_serves_the_saved_file_without_holding_its_bytes(tmp_path, make_ps):
    first = make_ps()
    persister = WeightPersister(tmp_path, first.settings, keep=2, store=first.server.weights)
    for k in (1, 2):
        push(first, k)
        persister.save_newest()
    persister.stop()
    second = make_ps()
    store = second.server.weights
    assert WeightPersister(tmp_path, second.settings, store=store).restore() == 2
    assert store.memory_bytes == 0 and store._served.buffer is None
    for bulk_lane in (True, False):
        assert pulled(second, bulk_lane=bulk_lane) == (2, version_bytes(2))
    push(second, 3)  # the trainer's next push: accepted on top of the restored version
    assert pulled(second) == (3, version_bytes(3)) and store.memory_bytes == NBYTES

    raw = tmp_path / "2" / "buffer" / "buffer.bin"
    data = bytearray(raw.read_bytes())
    data[NBYTES - 3] ^= 1  # a flipped bit in the last chunk
    raw.write_bytes(bytes(data))
    third = make_ps()
    with pytest.warns(UserWarning, match=r"saved weights .*/2 unreadable .*checksum"):
        assert WeightPersister(tmp_path, third.settings, store=third.server.weights).restore() == 1
    assert pulled(third) == (1, version_bytes(1))


def test_a_saved_version_older_than_the_served_one_is_not_restored(tmp_path, make_ps):
    first = make_ps()
    persister = WeightPersister(tmp_path, first.settings, store=first.server.weights)
    push(first, 1)
    persister.save_newest()
    persister.stop()
    second = make_ps()
    push(second, 5)  # the trainer was faster than the restore
    assert WeightPersister(tmp_path, second.settings, store=second.server.weights).restore() == -1
    assert pulled(second) == (5, version_bytes(5))


# -- the spool: pushes received into files (the parameter-server role's setting) --


def spooled(make_ps, tmp_path, **kwargs):
    running = make_ps()
    running.server.weights.spool_to(tmp_path / ".spool")
    return running, WeightPersister(
        tmp_path, running.settings, store=running.server.weights, **kwargs
    )


def spool_files(tmp_path) -> list[str]:
    return sorted(os.listdir(tmp_path / ".spool"))


@pytest.mark.parametrize("bulk_lane", [True, False])
def test_a_spooled_push_never_holds_the_bytes_and_its_save_is_a_link(tmp_path, make_ps, bulk_lane):
    running, persister = spooled(make_ps, tmp_path)
    settings = dataclasses.replace(
        running.settings, weight_lanes=("bulk", "grpc") if bulk_lane else ("grpc",)
    )
    running.client = ParamServerClient(settings, retry_s=0)  # pushes over this lane too
    store = running.server.weights
    push(running, 1)
    served = store._served
    assert store.memory_bytes == 0 and served.buffer is None and spool_files(tmp_path) != []
    for lane in (True, False):
        assert pulled(running, bulk_lane=lane) == (1, version_bytes(1))
    assert persister.save_newest() == 1
    saved = os.stat(tmp_path / "1" / "buffer" / "buffer.bin")
    assert saved.st_ino == os.stat(served.path).st_ino and saved.st_nlink == 2  # one file
    push(running, 2)
    assert spool_files(tmp_path) == [os.path.basename(store._served.path)]  # v1's name gone
    assert (tmp_path / "1" / "buffer" / "buffer.bin").read_bytes() == version_bytes(1)
    persister.save_newest()
    running.client.close()
    restarted = make_ps()
    restarted.server.weights.spool_to(tmp_path / ".spool")
    assert spool_files(tmp_path) == []  # a new process starts with an empty spool
    assert (
        WeightPersister(tmp_path, restarted.settings, store=restarted.server.weights).restore() == 2
    )
    assert pulled(restarted) == (2, version_bytes(2))


def test_a_failed_spooled_push_deletes_its_file_and_a_held_one_outlives_its_version(
    tmp_path, make_ps
):
    running, _ = spooled(make_ps, tmp_path)
    store = running.server.weights
    push(running, 1)
    held = store.open_pull(-1)
    first = held.path
    part = store.begin(running.client.header(PLAN, 2))
    data = version_bytes(2)[: 1 << 20]
    with pytest.raises(PushRejected, match="checksum mismatch"):
        part.write(0, data, 12345)  # a corrupted chunk
    store.abandon(part)
    assert spool_files(tmp_path) == [os.path.basename(first)] and store.version == 1
    push(running, 3)
    assert os.path.exists(first) and bytes(held.read(0, NBYTES)) == version_bytes(1)
    store.close_pull(held)
    assert not os.path.exists(first) and pulled(running) == (3, version_bytes(3))
    assert store.memory_bytes == 0
