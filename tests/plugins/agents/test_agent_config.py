"""configs/experiments/agents_calculator.gin: the agent is chosen in gin, and one inline step
runs it on a tiny random model with a chat template (the agent's requests go over the endpoint)."""

from __future__ import annotations

import json
import pathlib

import gin
import pytest
from chatml_case import chatml_tokenizer, tiny_config

from rlax.core import cli, config
from rlax.core.models.bundle import ModelBundle, new_model, save_model
from rlax.core.plugins import build_plugin_manager
from rlax.plugins.agents.calculator import calculator
from rlax.plugins.agents.runner import AgentSampler
from rlax.plugins.environments.tool_calls import HermesToolParser
from rlax.plugins.rewards.arithmetic import ArithmeticReward

ROOT = pathlib.Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "experiments" / "agents_calculator.gin"


@pytest.fixture
def pm():
    manager = build_plugin_manager(autoload=False)
    config.register_core_configurables()
    yield manager
    gin.clear_config()


def test_the_config_runs_the_calculator_agent_through_samplers_agents(pm):
    config.parse([CONFIG], ["agents.calculator.max_calls = 1"], plugins=pm)
    s = config.configured("samplers", "agents")()
    assert isinstance(s, AgentSampler)
    assert isinstance(s.reward, ArithmeticReward) and isinstance(s.tool_parser, HermesToolParser)
    assert (s.max_turns, s.max_episode_tokens, s.max_new_tokens) == (3, 160, 160)
    # @agents.calculator is the function itself, gin binding its keyword parameters.
    assert gin.query_parameter("agents.calculator.max_calls") == 1
    assert getattr(s.agent, "__wrapped__", s.agent) is calculator


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> pathlib.Path:
    tok = chatml_tokenizer()
    cfg = tiny_config(tok.vocab_size)
    path = tmp_path_factory.mktemp("model") / "chatml-tiny"
    save_model(path, ModelBundle(new_model(cfg, 0), tok, {"built_by": __name__}))
    return path


def test_one_inline_step_runs_agent_episodes(chat_model, tmp_path):
    run_dir = tmp_path / "run"
    settings = [
        f"--gin.INIT_CHECKPOINT='{chat_model}'",
        "--gin.rlax.train.steps=1",
        "--gin.PROMPTS_PER_STEP=2",
        "--gin.GROUP_SIZE=2",
        "--gin.tasks.arithmetic.num_eval=2",
        "--gin.EVAL_SAMPLES=1",
        "--gin.EVAL_KS=(1,)",
        "--gin.samplers.jax.max_new_tokens=8",
        "--gin.samplers.jax.prompt_bucket=512",
        "--gin.rlax.train.progress=False",
        "--gin.rlax.evaluate.progress=False",
        "--gin.rlax.watch.curves=False",
    ]
    status = cli.main(
        ["run", "--role", "inline", "--gin", str(CONFIG), *settings, "--run-dir", str(run_dir)]
    )
    assert status == cli.EXIT_OK
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # Four episodes ran (2 prompts x 2), each one turn of the untrained model's text,
    # none failed, and the trainer trained on their sampled ids.
    assert row["step"] == 1 and row["groups_kept"] == 2
    assert (row["turns_mean"], row["failed_mean"]) == (1.0, 0.0) and row["trained_tokens"] > 0
