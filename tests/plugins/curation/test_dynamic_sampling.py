"""DAPO's dynamic-sampling filter: which groups survive, and the refill it asks for."""

from __future__ import annotations

import numpy as np
import pytest

from rlax.core.plugins import build_plugin_manager
from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.curation.dynamic_sampling import DynamicSampling


def group(name: str, *rewards: float) -> Group:
    comps = tuple(
        Completion(np.array([3], np.int32), np.array([-0.1], np.float32), "", "stop", 0)
        for _ in rewards
    )
    return Group(
        Prompt(name, "", np.array([1], np.int32), ""), comps, np.array(rewards, np.float32)
    )


def test_drops_all_equal_groups_and_keeps_order():
    groups = [group("a", 1, 1, 1), group("b", 0, 1, 0), group("c", 0, 0, 0), group("d", 1, 0, 1)]
    kept = DynamicSampling().online(groups)
    assert [g.prompt.id for g in kept] == ["b", "d"]
    assert kept[0] is groups[1]  # the groups themselves, not copies


def test_a_one_sample_group_is_always_dropped():
    assert DynamicSampling().online([group("a", 1.0)]) == []


def test_tolerance_treats_near_equal_rewards_as_equal():
    groups = [group("a", 0.5, 0.52), group("b", 0.0, 0.5)]
    assert [g.prompt.id for g in DynamicSampling(tolerance=0.05).online(groups)] == ["b"]
    assert len(DynamicSampling().online(groups)) == 2


def test_declares_its_extra_rounds_and_validates():
    assert DynamicSampling().extra_rounds == 3
    assert DynamicSampling(extra_rounds=0).extra_rounds == 0
    with pytest.raises(ValueError, match="dynamic_sampling"):
        DynamicSampling(extra_rounds=-1)
    with pytest.raises(ValueError, match="dynamic_sampling"):
        DynamicSampling(tolerance=-0.1)


def test_registered_through_its_entry_point():
    pm = build_plugin_manager()
    component = pm.get("curation", "dynamic_sampling")
    assert component.factory is DynamicSampling and component.plugin == "dynamic_sampling"
