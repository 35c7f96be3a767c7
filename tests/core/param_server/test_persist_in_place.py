"""The persister saves the served buffer in place (no second copy) and restores it exactly."""

from __future__ import annotations

import numpy as np
import pytest

from rlax.core.param_server.weights.persist import WeightPersister
from rlax.core.wire import WirePlan

TREE = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.full(5, 7, np.float32)}
PLAN = WirePlan.for_tree(TREE)


def test_a_store_backed_persister_saves_the_served_bytes_and_holds_them_while_it_writes(
    tmp_path, make_ps
):
    first = make_ps()
    persister = WeightPersister(tmp_path, first.settings, store=first.server.weights)
    assert persister.save_newest() == -1  # nothing served yet
    first.client.push(PLAN, TREE, 4)
    store = first.server.weights
    readers = []
    original = persister._save

    def save(version, tensors, array):
        served = store._served
        readers.append(served.readers)  # held while orbax writes: never recycled under it
        assert np.shares_memory(array, np.frombuffer(served.buffer, np.uint8))  # no copy
        return original(version, tensors, array)

    persister._save = save
    assert persister.save_newest() == 4 and readers == [1]
    assert store._served.readers == 0 and persister.save_newest() == 4  # released; nothing new
    persister.stop()
    second = make_ps()
    assert WeightPersister(tmp_path, second.settings).restore() == 4
    version, _, buf = second.client.pull(-1)
    assert version == 4 and bytes(buf) == PLAN.pack(TREE).tobytes()


def test_a_version_saved_with_orbax_by_an_older_rlax_is_still_restored(tmp_path, make_ps):
    import orbax.checkpoint as ocp

    buffer = PLAN.pack(TREE)
    tensors = [
        {
            "name": t.name,
            "shape": list(t.shape),
            "offset": t.offset,
            "nbytes": t.nbytes,
            "dtype": "float32",
        }
        for t in PLAN.tensors
    ]
    options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False)
    with ocp.CheckpointManager(tmp_path, options=options) as manager:  # the old layout
        manager.save(
            2,
            args=ocp.args.Composite(
                buffer=ocp.args.StandardSave({"buffer": np.asarray(buffer)}),
                meta=ocp.args.JsonSave({"version": 2, "tensors": tensors}),
            ),
        )
        manager.wait_until_finished()
    running = make_ps()
    assert WeightPersister(tmp_path, running.settings).restore() == 2
    assert bytes(running.client.pull(-1)[2]) == buffer.tobytes()


def test_saving_keeps_the_newest_versions_and_a_damaged_buffer_is_skipped(tmp_path, make_ps):
    first = make_ps()
    persister = WeightPersister(tmp_path, first.settings, keep=2, store=first.server.weights)
    for v in (1, 2, 3):
        first.client.push(PLAN, {k: x * v for k, x in TREE.items()}, v)
        persister.save_newest()
    persister.stop()
    assert sorted(d.name for d in tmp_path.iterdir()) == ["2", "3"]
    raw = tmp_path / "3" / "buffer" / "buffer.bin"
    data = bytearray(raw.read_bytes())
    data[5] ^= 1  # a flipped bit on disk
    raw.write_bytes(bytes(data))
    second = make_ps()
    with pytest.warns(UserWarning, match=r"saved weights .*/3 unreadable .*checksum"):
        assert WeightPersister(tmp_path, second.settings).restore() == 2
    assert (
        bytes(second.client.pull(-1)[2]) == PLAN.pack({k: x * 2 for k, x in TREE.items()}).tobytes()
    )
