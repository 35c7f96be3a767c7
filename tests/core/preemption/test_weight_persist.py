"""The parameter server's newest weights survive its restart (orbax, through the client)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rlax.core.param_server.weights.persist import WeightPersister
from rlax.core.wire import WirePlan

TREE = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float32)}
PLAN = WirePlan.for_tree(TREE)


def scaled(k):
    return {name: x * k for name, x in TREE.items()}


def served(ps):
    version, _, buf = ps.client.pull(-1)
    return version, np.frombuffer(bytes(buf), np.float32)


def test_the_newest_version_is_saved_as_it_comes_and_served_after_a_restart(tmp_path, make_ps):
    first = make_ps()
    persister = WeightPersister(tmp_path, first.settings).start()
    for version in (0, 3):
        first.client.push(PLAN, scaled(version + 1), version)
    deadline = time.monotonic() + 30
    while persister.saved != 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    persister.stop()
    assert persister.saved == 3
    expected = served(first)

    second = make_ps()  # a fresh server: nothing served until the saved version is pushed back
    assert second.client.stat().version == -1
    assert WeightPersister(tmp_path, second.settings).restore() == 3
    version, data = served(second)
    assert version == 3
    np.testing.assert_array_equal(data, expected[1])


def test_an_unreadable_saved_version_is_skipped_with_a_warning(tmp_path, make_ps):
    first = make_ps()
    persister = WeightPersister(tmp_path, first.settings)
    first.client.push(PLAN, scaled(1), 1)
    persister.save_newest()
    first.client.push(PLAN, scaled(2), 2)
    persister.save_newest()
    persister.stop()
    (tmp_path / "2" / "meta" / "metadata").write_text("{not json")
    second = make_ps()
    with pytest.warns(UserWarning, match=r"saved weights .*/2 unreadable"):
        assert WeightPersister(tmp_path, second.settings).restore() == 1
    np.testing.assert_array_equal(
        served(second)[1], np.concatenate([x.ravel() for x in scaled(1).values()])
    )
