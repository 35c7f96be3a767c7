"""configs/algorithms/<algorithm>.gin: each is the algorithm alone, composes with every task,
and its experiment (the quickstart with that file) builds what it says."""

from __future__ import annotations

import pathlib
from typing import Any

import gin
import pytest

from rlax.core import cli, config, gin_state, plugins
from rlax.core.errors import ConfigError
from rlax.plugins.critics.head import HeadCritic
from rlax.plugins.curation.dynamic_sampling import DynamicSampling
from rlax.plugins.curation.zero_variance import ZeroVarianceFilter
from rlax.plugins.rewards.arithmetic import ArithmeticReward
from rlax.plugins.rewards.overlong import OverlongPenalty

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
ALGORITHMS = sorted(p.stem for p in (CONFIGS / "algorithms").glob("*.gin"))
TASKS = sorted(p.stem for p in (CONFIGS / "tasks").glob("*.gin"))

# Algorithm name -> its experiment on the quickstart's run (GRPO's is the quickstart itself).
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
    """What the experiment's run specification holds (built as ``rlax run`` builds it)."""
    config.parse([CONFIGS / "experiments" / EXPERIMENTS[name]], REQUIRED.get(name, []), plugins=pm)
    spec = config.build_spec(pm)
    return {
        "algorithm": spec.train.algorithm,
        "curation": list(spec.curation),
        "reward": spec.reward,
        "run_name": spec.train.run_name,
        "teacher": spec.train.teacher,
    }


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_each_experiment_builds_its_algorithm(pm, name):
    run = parsed(pm, name)
    assert run["algorithm"].name == name
    if name != "grpo":
        assert run["run_name"] == name


def test_every_registered_algorithm_has_an_algorithm_file_and_an_experiment(pm):
    assert set(pm.names("algorithms")) == set(ALGORITHMS) == set(EXPERIMENTS)
    assert {p.name for p in (CONFIGS / "experiments").glob("*.gin")} >= set(EXPERIMENTS.values())


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
    assert ppo.needs_critic and ppo.value_model == HeadCritic()
    assert (ppo.returns.gamma, ppo.returns.lam, ppo.critic.clip_eps) == (1.0, 0.95, 0.2)
    rpp = parsed(pm, "reinforcepp")["algorithm"]
    assert rpp.needs_reference and rpp.returns.kl_beta == 0.01 and rpp.returns.whiten


def test_distill_names_its_teacher_and_keeps_every_group(pm):
    run = parsed(pm, "distill")
    assert run["algorithm"].needs_teacher and run["curation"] == []
    assert run["teacher"] == "/path/to/teacher"
    with pytest.raises(ConfigError, match="TEACHER is required"):
        config.parse([CONFIGS / "experiments" / "distill.gin"], plugins=pm)


# -- the layers: an algorithm's file alone, on every task ------------------------------

# What an algorithm's file requires to be set (Dr.GRPO's L_max is the task's sampler budget).
ALGORITHM_REQUIRES = {
    "distill": ["TEACHER = '/path/to/teacher'"],
    "drgrpo": ["MAX_NEW_TOKENS = 4"],
}
# What the wiring and the optimiser require that no task sets.
RUN_REQUIRES = ["LEARNING_RATE = 1e-4", "INIT_CHECKPOINT = '/a/model'"]


# A layer parsed alone takes the parts of the run specification its settings go to, as
# configs/base/roles.gin binds them (gin refuses a setting that no part would take).
PARTS = {
    "rlax.run.train": "@rlax.train()",
    "rlax.run.worker": "@rlax.worker()",
    "rlax.run.param_server": "@rlax.param_server()",
    "rlax.train.checkpointing": "@rlax.checkpointing()",
    "rlax.train.watch": "@rlax.watch()",
}


def bound(pm, files: list[str], bindings: list[str]) -> dict[str, str]:
    """Every binding the files and bindings make: ``selector.arg`` or ``MACRO`` -> its value
    (but the PARTS, which the files are parsed with)."""
    parts = [f"{name} = {value}" for name, value in PARTS.items()]
    config.parse(files, [*parts, *bindings], plugins=pm)
    return {
        name: repr(value)
        for scope, selector, args in gin_state.all_bindings()
        for arg, value in args.items()
        if (name := scope if selector == "gin.macro" else f"{selector}.{arg}") not in PARTS
    }


@pytest.mark.parametrize("name", ALGORITHMS)
def test_an_algorithm_file_binds_its_algorithm_and_nothing_of_the_run(pm, name):
    """Only the algorithm, its pieces, its curation and what it requires (grpo.gin adds the
    optimiser, as the flat grpo.gin did)."""
    required = ALGORITHM_REQUIRES.get(name, [])
    names = set(bound(pm, [f"algorithms/{name}"], required + ["LEARNING_RATE = 1e-4"]))
    assert build(gin.query_parameter("rlax.train.algorithm")).name == name
    if name == "grpo":
        names -= set(bound(pm, ["base/optimizer"], ["LEARNING_RATE = 1e-4"]))

    macros = {binding.partition("=")[0].strip() for binding in required}
    allowed = {"rlax.train.algorithm", "rlax.train.teacher", "CURATION", "LEARNING_RATE", *macros}
    run = {n for n in names if not n.startswith(("algorithms.", "curation."))}
    assert run <= allowed
    assert run >= {"rlax.train.algorithm", "CURATION", *macros}  # each decides its curation


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_algorithm_file_composes_with_every_task_file(pm, name, task):
    """The wiring, the optimiser, any algorithm and any task: each keeps every binding it makes
    alone, and the run builds that algorithm on that task."""
    required = ALGORITHM_REQUIRES.get(name, []) + RUN_REQUIRES
    algorithm = bound(pm, [f"algorithms/{name}"], required)
    task_alone = bound(pm, [f"tasks/{task}"], [])
    files = ["base/roles", "base/optimizer", f"algorithms/{name}", f"tasks/{task}"]
    composed = bound(pm, files, required)

    assert composed.items() >= {**algorithm, **task_alone}.items()
    spec = config.build_spec(pm)
    assert spec.train.algorithm.name == name
    assert composed["rlax.run.task"] == "%TASK"  # the wiring's macro, which the task file sets
    assert type(spec.task) is type(build(gin.query_parameter("%TASK")))


def test_dapo_runs_on_the_arithmetic_task_composed_from_the_layers(tmp_path):
    """No experiment file: the wiring, the optimiser, DAPO, the task and the model by name."""
    run_dir = tmp_path / "run"
    layers = ["roles", "optimizer", "algorithms/dapo", "arithmetic", "quickstart_base"]
    files = [arg for name in layers for arg in ("--gin", name)]
    settings = [
        "--gin.LEARNING_RATE=2e-4",
        "--gin.rlax.train.steps=1",
        "--gin.PROMPTS_PER_STEP=8",
        "--gin.tasks.arithmetic.num_eval=16",
        "--gin.EVAL_SAMPLES=2",
        "--gin.EVAL_KS=(1,)",
        "--gin.rlax.train.progress=False",
        "--gin.rlax.watch.curves=False",
    ]
    status = cli.main(["run", "--role", "inline", *files, *settings, "--run-dir", str(run_dir)])

    assert status == cli.EXIT_OK
    operative = (run_dir / "operative_config.gin").read_text()
    assert "train.algorithm = @algorithms.dapo()" in operative
    assert "CURATION = [@curation.dynamic_sampling()]" in operative
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
