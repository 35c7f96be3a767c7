"""fill_batch: rounds are taken until enough groups survive curation, up to a cap."""

from __future__ import annotations

import numpy as np
import pytest

from rlax.core.trainer.filling import extra_rounds, fill_batch
from rlax.core.types import DroppedGroup, Group, Prompt
from rlax.plugins.curation.dynamic_sampling import DynamicSampling
from rlax.plugins.curation.zero_variance import ZeroVarianceFilter


def group(name: str) -> Group:
    return Group(Prompt(name, "", np.zeros(1, np.int32), ""), (), np.zeros(0, np.float32))


def dropped(value: float) -> DroppedGroup:
    return DroppedGroup(np.full(2, value, np.float32))


class Rounds:
    """Scripted rounds: each call returns the next list of entries and records its size."""

    def __init__(self, *rounds):
        self.rounds = list(rounds)
        self.asked: list[int] = []

    def __call__(self, n: int):
        self.asked.append(n)
        return self.rounds.pop(0)


def test_one_round_suffices_when_enough_groups_survive():
    take = Rounds([group("a"), dropped(1), group("b")])
    entries, info = fill_batch(take, target=2, extra_rounds=3)
    assert take.asked == [2]
    assert info == {"extra_rounds": 0, "groups_filtered": 1, "groups_surplus": 0}
    assert [e.prompt.id if isinstance(e, Group) else "x" for e in entries] == ["a", "x", "b"]


def test_extra_rounds_refill_and_surplus_groups_are_not_trained_on():
    take = Rounds([group("a"), dropped(0)], [dropped(1), dropped(1)], [group("b"), group("c")])
    entries, info = fill_batch(take, target=2, extra_rounds=3)
    assert take.asked == [2, 2, 2]
    assert info == {"extra_rounds": 2, "groups_filtered": 3, "groups_surplus": 1}
    kept = [e.prompt.id for e in entries if isinstance(e, Group)]
    assert kept == ["a", "b"]
    assert len(entries) == 6  # every sample still reaches the metrics
    assert isinstance(entries[-1], DroppedGroup)  # "c", the surplus, as its rewards


def test_the_cap_releases_a_partial_batch():
    take = Rounds([dropped(0)] * 2, [group("a"), dropped(1)], [dropped(0)] * 2)
    entries, info = fill_batch(take, target=2, extra_rounds=1)
    assert len(take.rounds) == 1  # the third round was never taken
    assert info == {"extra_rounds": 1, "groups_filtered": 3, "groups_surplus": 0}
    assert [e.prompt.id for e in entries if isinstance(e, Group)] == ["a"]


def test_no_extra_rounds_is_one_round_whatever_survives():
    take = Rounds([dropped(0), dropped(1)])
    entries, info = fill_batch(take, target=2, extra_rounds=0)
    assert len(entries) == 2 and len(take.rounds) == 0
    assert info == {"extra_rounds": 0, "groups_filtered": 2, "groups_surplus": 0}


def test_extra_rounds_come_from_the_filters_that_ask_for_them():
    assert extra_rounds([]) == 0
    assert extra_rounds([ZeroVarianceFilter()]) == 0
    assert extra_rounds([ZeroVarianceFilter(), DynamicSampling(extra_rounds=5)]) == 5


def test_invalid_arguments():
    with pytest.raises(ValueError, match="fill_batch"):
        fill_batch(Rounds(), target=0, extra_rounds=1)
