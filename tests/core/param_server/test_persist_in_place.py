"""The persister saves the served buffer in place (no second copy) and restores it exactly."""

from __future__ import annotations

import numpy as np

from rlax.core.param_server.weight_persist import WeightPersister
from rlax.core.param_server.wire import WirePlan

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
