"""The multi-turn configs parse against the registered components and wire what they say."""

from __future__ import annotations

import pathlib

import gin
import pytest

from rlax.core import config
from rlax.core.plugins import build_plugin_manager
from rlax.plugins.environments.guess import GuessEnvironment
from rlax.plugins.environments.python_tool import PythonToolEnvironment
from rlax.plugins.environments.runner import EpisodeSampler
from rlax.plugins.environments.tool_calls import HermesToolParser
from rlax.plugins.rewards.math.verifier import MathReward

CONFIGS = pathlib.Path(__file__).resolve().parents[3] / "configs" / "experiments"


@pytest.fixture
def pm():
    manager = build_plugin_manager(autoload=False)
    config.register_core_configurables()
    yield manager
    gin.clear_config()


def sampler(pm, name: str) -> EpisodeSampler:
    config.parse([CONFIGS / name], plugins=pm)
    built = config.configured("samplers", "episodes")()
    assert isinstance(built, EpisodeSampler)
    return built


def test_the_multiturn_quickstart_plays_five_guesses_of_three_ids(pm):
    s = sampler(pm, "multiturn_quickstart.gin")
    assert isinstance(s.environment, GuessEnvironment)
    assert (s.limits.max_turns, s.limits.max_turn_tokens, s.limits.max_episode_tokens) == (5, 3, 24)
    assert s.max_new_tokens == 24 and s.sampler.max_new_tokens == 3  # the trainer pads to 24
    assert 5 * 3 + 4 <= s.max_new_tokens  # five guesses and four hints fit


def test_the_smollm2_tools_config_gives_the_python_tool_the_math_verifier(pm):
    s = sampler(pm, "smollm2_tools.gin")
    env = s.environment
    assert isinstance(env, PythonToolEnvironment) and isinstance(env.reward, MathReward)
    assert isinstance(env.parser, HermesToolParser)
    assert env.limits.tool_timeout_s == 3.0 and env.sandbox.wall_s == 3.0
