"""The GSM8K-format fixture end to end through configs/experiments/gsm8k_tiny.gin with the
math verifier, and with another algorithm's file on it."""

from __future__ import annotations

import json
import pathlib
import runpy

import gin
import pytest

from rlax.core import cli, config
from rlax.core.models.bundle import ModelBundle, new_model, save_model
from rlax.core.models.config import TransformerConfig
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.plugins import build_plugin_manager
from rlax.core.rollout.reward_pool import RewardPool

ROOT = pathlib.Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs/experiments/gsm8k_tiny.gin"
FIXTURES = ROOT / "tests" / "fixtures"
FILES = ("gsm8k_tiny_train.jsonl", "gsm8k_tiny_test.jsonl")


def alphabet() -> str:
    """Every character of the fixture and the config's prompt template."""
    chars = set("Question: \nAnswer:")
    for name in FILES:
        for line in (FIXTURES / name).read_text().splitlines():
            row = json.loads(line)
            chars |= set(row["question"]) | set(row["answer"])
    return "".join(sorted(chars))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> pathlib.Path:
    """A small, randomly initialised character model that can read the fixture."""
    tokenizer = CharTokenizer(alphabet())
    cfg = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        num_layers=1,
        embed_dim=32,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        mlp_dim=64,
    )
    path = tmp_path_factory.mktemp("model") / "gsm8k-char"
    save_model(path, ModelBundle(new_model(cfg, 0), tokenizer, {"built_by": __name__}))
    return path


@pytest.fixture
def configured(monkeypatch):
    """The task and reward exactly as the gin file builds them."""
    monkeypatch.chdir(ROOT)
    pm = build_plugin_manager()
    config.register_core_configurables()
    config.parse([CONFIG], ["INIT_CHECKPOINT = 'unused: no model is built here'"], plugins=pm)
    yield config.configured("tasks", "dataset")(), config.configured("rewards", "math")()
    gin.clear_config()


def test_the_fixture_is_what_its_generator_writes(tmp_path, monkeypatch):
    module = runpy.run_path(str(FIXTURES / "make_gsm8k_fixture.py"))
    monkeypatch.setitem(module["write"].__globals__, "HERE", tmp_path)
    module["main"]()
    for name in FILES:
        assert (tmp_path / name).read_text() == (FIXTURES / name).read_text()


def test_configured_verifier_accepts_each_reference_solution_only_for_its_question(configured):
    task, reward = configured
    prompts = task.load("eval", tokenizer=CharTokenizer(alphabet()))
    assert len(prompts) == 8 and task.malformed == []
    assert prompts[0].text.startswith("Question: ") and prompts[0].text.endswith("\nAnswer:")
    finals = [p.answer.rsplit("#### ", 1)[1] for p in prompts]
    for p, final in zip(prompts, finals):
        assert reward.score(p, p.answer).score == 1.0  # the worked solution ends in '#### n'
        assert reward.score(p, f"So the answer is {final}.").score == 1.0
        for other, other_final in zip(prompts, finals):
            if other_final != final:
                assert reward.score(p, other.answer).score == 0.0
    # The same verifier in the reward pool, as a worker runs it.
    with RewardPool(reward, workers=2, timeout_s=10) as pool:
        result = pool.score(prompts, [p.answer for p in prompts[1:] + prompts[:1]])
    expected = [float(a == b) for a, b in zip(finals, finals[1:] + finals[:1])]
    assert result.scores.tolist() == expected and result.errors == result.timeouts == 0


def test_rlax_eval_runs_the_fixture_through_the_gin_config(model_dir, monkeypatch, capsys):
    """`rlax eval`: dataset task -> tokenizer -> JAX sampler -> math verifier -> pass@k."""
    monkeypatch.chdir(ROOT)
    status = cli.main(
        [
            "eval",
            "--gin",
            str(CONFIG),
            "--checkpoint",
            str(model_dir),
            "--gin.EVAL_SAMPLES=2",
            "--gin.EVAL_KS=(1, 2)",
            "--gin.samplers.jax.max_new_tokens=8",
            "--gin.rlax.evaluate.progress=False",
        ]
    )
    out, err = capsys.readouterr()
    assert status == cli.EXIT_OK, err[-2000:]
    assert f"{model_dir}: 8 held-out problems, 2 samples each" in out  # the whole test split
    (row,) = [line.split() for line in out.splitlines() if line.startswith("model")]
    pass1, pass2 = (float(cell.rstrip("%")) for cell in row[1:])
    assert 0.0 <= pass1 <= pass2 <= 100.0


def test_dapo_runs_on_the_fixture_as_the_experiment_and_dapo_s_file(model_dir, tmp_path):
    """`rlax run --gin gsm8k_tiny --gin algorithms/dapo`: DAPO on GSM8K, no line copied."""
    run_dir = tmp_path / "run"
    files = ["--gin", "gsm8k_tiny", "--gin", "algorithms/dapo"]
    settings = [
        f"--gin.INIT_CHECKPOINT='{model_dir}'",
        "--gin.rlax.train.steps=1",
        "--gin.samplers.jax.max_new_tokens=8",
        "--gin.rlax.train.progress=False",
        "--gin.rlax.watch.curves=False",
    ]
    status = cli.main(["run", "--role", "inline", *files, *settings, "--run-dir", str(run_dir)])

    assert status == cli.EXIT_OK
    operative = (run_dir / "operative_config.gin").read_text()
    assert "train.algorithm = @algorithms.dapo()" in operative
    assert "CURATION = [@curation.dynamic_sampling()]" in operative
    assert "TASK = @tasks.dataset()" in operative and "REWARD = @rewards.math()" in operative
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
