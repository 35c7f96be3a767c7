"""The verifiers, the dataset task and the curation filters load through their entry points."""

from __future__ import annotations

import gin

from rlax.core import config
from rlax.core.plugins import build_plugin_manager, installed_entry_points

COMPONENTS = {
    ("rewards", "math"): "math_reward",
    ("rewards", "code"): "code_reward",
    ("rewards", "format"): "format_reward",
    ("rewards", "length"): "length_reward",
    ("rewards", "composite"): "composite_reward",
    ("rewards", "judge"): "judge_reward",
    ("tasks", "dataset"): "dataset_task",
    ("curation", "dedup"): "dedup",
    ("curation", "decontaminate"): "decontaminate",
    ("curation", "length"): "length_filter",
    ("curation", "pass_rate"): "pass_rate",
    ("curation", "pass_rate_curriculum"): "pass_rate",
}


def test_each_component_comes_from_its_entry_point(monkeypatch):
    monkeypatch.delenv("RLAX_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    names = {ep.name for ep in installed_entry_points()}
    pm = build_plugin_manager()
    for (kind, name), plugin in COMPONENTS.items():
        component = pm.get(kind, name)
        assert component.plugin == plugin and plugin in names
        assert component.distribution == "rlax-llm"


def test_gin_builds_a_composite_of_the_verifiers(monkeypatch):
    monkeypatch.delenv("RLAX_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pm = build_plugin_manager()
    config.parse(
        [],
        [
            "rewards.composite.rewards = [@rewards.math(), @rewards.format()]",
            "rewards.composite.weights = [1.0, 0.5]",
            "rewards.math.fallback_last_number = False",
        ],
        plugins=pm,
    )
    reward = config.configured("rewards", "composite")()
    gin.clear_config()
    assert [type(r).__name__ for r in reward.rewards] == ["MathReward", "FormatReward"]
    assert reward.weights == [1.0, 0.5] and reward.rewards[0].fallback_last_number is False
