"""configs/<algorithm>.gin: each parses on the quickstart task and builds what it says."""

from __future__ import annotations

import pathlib
from typing import Any

import gin
import pytest

from rlax.core import config, plugins
from rlax.core.errors import ConfigError
from rlax.plugins.curation.dynamic_sampling import DynamicSampling
from rlax.plugins.curation.zero_variance import ZeroVarianceFilter
from rlax.plugins.rewards.arithmetic import ArithmeticReward
from rlax.plugins.rewards.overlong import OverlongPenalty

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Algorithm name -> its experiment on the quickstart task (GRPO's is the quickstart itself).
EXPERIMENTS = {
    "grpo": "quickstart.gin",
    "dapo": "dapo.gin",
    "drgrpo": "drgrpo.gin",
    "gspo": "gspo.gin",
    "cispo": "cispo.gin",
    "rloo": "rloo.gin",
    "reinforcepp": "reinforcepp.gin",
    "reinforcepp_baseline": "reinforcepp_baseline.gin",
    "ppo": "ppo.gin",
    "distill": "distill.gin",
}


def build(value: Any) -> Any:
    """Evaluates a queried gin value: references are called, macros resolved, lists mapped."""
    if isinstance(value, list | tuple):
        return [build(v) for v in value]
    if isinstance(value, gin.config.ConfigurableReference):
        if value.selector == "gin.macro":
            return build(gin.query_parameter("%" + value.scoped_selector.split("/")[0]))
        return value.scoped_configurable_fn()
    return value


@pytest.fixture(scope="module")
def pm():
    manager = plugins.build_plugin_manager()
    config.register_core_configurables()
    return manager


# What an experiment requires to be set (distillation: the teacher's checkpoint).
REQUIRED = {"distill": ["TEACHER = '/path/to/teacher'"]}


def parsed(pm, name: str) -> dict[str, Any]:
    config.parse(
        [ROOT / "configs/experiments" / EXPERIMENTS[name]], REQUIRED.get(name, []), plugins=pm
    )
    return {
        key: build(gin.query_parameter(f"rlax.train.{key}"))
        for key in ("algorithm", "curation", "reward", "run_name")
    }


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_each_experiment_builds_its_algorithm(pm, name):
    run = parsed(pm, name)
    assert run["algorithm"].name == name
    if name != "grpo":
        assert run["run_name"] == name


def test_every_registered_algorithm_has_an_experiment(pm):
    assert set(pm.names("algorithms")) >= set(EXPERIMENTS)
    assert {p.name for p in (ROOT / "configs/experiments").glob("*.gin")} >= set(
        EXPERIMENTS.values()
    )


def test_dapo_puts_its_four_pieces_together(pm):
    run = parsed(pm, "dapo")
    objective = run["algorithm"].objective
    assert (objective.eps_low, objective.eps_high) == (0.2, 0.28)
    assert run["algorithm"].aggregation.mode == "token-mean"
    (curation,) = run["curation"]
    assert isinstance(curation, DynamicSampling) and curation.extra_rounds == 3
    assert isinstance(run["reward"], OverlongPenalty)
    assert isinstance(run["reward"].base, ArithmeticReward)
    assert (run["reward"].max_length, run["reward"].cache_length) == (4, 1)


def test_drgrpo_normalises_by_the_samplers_budget(pm):
    run = parsed(pm, "drgrpo")
    budget = build(gin.query_parameter("samplers.jax.max_new_tokens"))
    assert run["algorithm"].aggregation.max_len == budget == 4


@pytest.mark.parametrize("name", ["ppo", "reinforcepp", "reinforcepp_baseline"])
def test_batch_level_baselines_keep_every_group(pm, name):
    assert parsed(pm, name)["curation"] == []


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "gspo", "cispo", "rloo"])
def test_group_baselines_drop_all_equal_groups(pm, name):
    assert [type(f) for f in parsed(pm, name)["curation"]] == [ZeroVarianceFilter]


def test_ppo_and_reinforcepp_settings(pm):
    ppo = parsed(pm, "ppo")["algorithm"]
    assert ppo.needs_critic and ppo.value_model == "head"
    assert (ppo.returns.gamma, ppo.returns.lam, ppo.critic.clip_eps) == (1.0, 0.95, 0.2)
    rpp = parsed(pm, "reinforcepp")["algorithm"]
    assert rpp.needs_reference and rpp.returns.kl_beta == 0.01 and rpp.returns.whiten


def test_distill_names_its_teacher_and_keeps_every_group(pm):
    run = parsed(pm, "distill")
    assert run["algorithm"].needs_teacher and run["curation"] == []
    assert build(gin.query_parameter("rlax.train.teacher")) == "/path/to/teacher"
    with pytest.raises(ConfigError, match="TEACHER is required"):
        config.parse([ROOT / "configs/experiments/distill.gin"], plugins=pm)
