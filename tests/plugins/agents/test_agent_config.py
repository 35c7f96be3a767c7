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


def one_inline_step(config: pathlib.Path, chat_model: pathlib.Path, tmp_path) -> dict:
    """The metrics row of one inline step of ``config`` on the tiny chat model: 2 prompts x 2."""
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
        ["run", "--role", "inline", "--gin", str(config), *settings, "--run-dir", str(run_dir)]
    )
    assert status == cli.EXIT_OK
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return row


def test_one_inline_step_runs_agent_episodes(chat_model, tmp_path):
    row = one_inline_step(CONFIG, chat_model, tmp_path)
    # Four episodes ran (2 prompts x 2), each one turn of the untrained model's text,
    # none failed, and the trainer trained on their sampled ids.
    assert row["step"] == 1 and row["groups_kept"] == 2
    assert (row["turns_mean"], row["failed_mean"]) == (1.0, 0.0) and row["trained_tokens"] > 0


TWIN = ROOT / "configs" / "experiments" / "environments_calculator.gin"


def _bindings(path: pathlib.Path, names: list[str], pm) -> dict:
    config.parse([path], [], plugins=pm)
    try:
        return {name: gin.query_parameter(name) for name in names}
    finally:
        gin.clear_config()
        config.register_core_configurables()


def test_the_environment_twin_has_the_agent_s_model_task_group_and_limits(pm):
    """environments_calculator.gin is agents_calculator.gin with the endpoint taken out:
    every setting that shapes what is sampled is the same."""
    shared = [
        "%INIT_CHECKPOINT",
        "%LEARNING_RATE",
        "%PROMPTS_PER_STEP",
        "%GROUP_SIZE",
        "%MAX_STALENESS",
        "%RELOAD_STALENESS",
        "%SEED",
        "%REWARD",
        "tasks.arithmetic.digits",
        "tasks.arithmetic.operations",
        "tasks.arithmetic.template",
        "tasks.arithmetic.num_eval",
        "samplers.jax.max_new_tokens",
        "rlax.worker.prompts_per_lease",
        "rlax.local_cluster.num_workers",
        "rlax.train.steps",
    ]
    agent = _bindings(
        CONFIG,
        [
            *shared,
            "agents.calculator.max_calls",
            "samplers.agents.max_turns",
            "samplers.agents.max_episode_tokens",
        ],
        pm,
    )
    twin = _bindings(
        TWIN,
        [
            *shared,
            "environments.calculator.max_calls",
            "environments.calculator.max_episode_tokens",
        ],
        pm,
    )
    assert {k: twin[k] for k in shared} == {k: agent[k] for k in shared}
    assert twin["environments.calculator.max_calls"] == agent["agents.calculator.max_calls"]
    assert twin["environments.calculator.max_calls"] + 1 == agent["samplers.agents.max_turns"]
    limit = "environments.calculator.max_episode_tokens"
    assert twin[limit] == agent["samplers.agents.max_episode_tokens"]


def test_one_inline_step_of_the_twin_trains_on_episodes_that_open_with_the_tools(
    chat_model, tmp_path
):
    row = one_inline_step(TWIN, chat_model, tmp_path)
    assert row["step"] == 1 and row["groups_kept"] == 2
    assert (row["turns_mean"], row["failed_mean"]) == (1.0, 0.0) and row["trained_tokens"] > 0
    # The trainer scored the sampled ids in the context they were sampled in, the opening
    # (system, tools, question), not the task's prompt: its logprobs are the sampler's.
    assert row["mismatch_coverage"] == 1.0 and row["mismatch_abs_logp_p99"] <= 1e-4
