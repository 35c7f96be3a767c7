"""A short real run through `rlax run`: the reward rises and the run directory is complete."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from rlax.core import cli
from rlax.core.models.bundle import load_model

pytestmark = pytest.mark.e2e

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = ROOT / "assets" / "quickstart-base"
# 100 steps: the reward's rise, last 20 steps' mean over the first 20's, measured on seeds
# 0-4: +0.063, +0.070, +0.057, +0.079, +0.047 (the bound is +0.03). Shorter runs do not
# hold it on every seed: at 80 steps (last 20 over first 20) seed 2 rises +0.014, at 50
# steps (last 10 over first 10) +0.016.
STEPS = 100
SHORT = [
    "--gin",
    str(ROOT / "configs/experiments/quickstart.gin"),
    f"--gin.INIT_CHECKPOINT='{BASE}'",
    f"--gin.rlax.train.steps={STEPS}",
    "--gin.PROMPTS_PER_STEP=32",
    "--gin.tasks.arithmetic.num_eval=48",
    "--gin.rlax.train.progress=False",
    "--gin.rlax.evaluate.progress=False",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("quickstart") / "run"
    assert cli.main(["run", *SHORT, "--role", "inline", "--run-dir", str(path)]) == cli.EXIT_OK
    return path


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_reward_rises(run_dir):
    rewards = np.array([row["reward"] for row in metrics(run_dir)])
    first, last = rewards[:20].mean(), rewards[-20:].mean()
    assert last > first + 0.03, (
        f"reward did not rise: first 20 steps {first:.3f}, last 20 {last:.3f}"
    )


def test_metrics_has_every_step_and_field(run_dir):
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # steps start at 1
    for field in ("reward", "pass_rate", "loss", "grad_norm", "entropy", "tokens_per_s"):
        assert all(np.isfinite(r[field]) for r in rows if r["groups_kept"]), field
    assert all(0 <= r["pass_rate"] <= 1 and r["grad_norm"] >= 0 for r in rows if r["groups_kept"])
    # Each update publishes a new weight version to the sampler.
    assert [r["version"] for r in rows] == list(range(1, STEPS + 1))


def test_run_directory_contents(run_dir):
    config = (run_dir / "operative_config.gin").read_text()
    assert f"train.steps = {STEPS}" in config  # gin writes the shortest unique name
    assert "@algorithms.grpo()" in config
    assert (run_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((run_dir / "eval.json").read_text())
    for row in results.values():
        assert 0 <= row["pass@1"] <= row["pass@8"] <= 1
    trained = load_model(run_dir / "checkpoint")
    base = load_model(BASE)
    assert trained.info["step"] == STEPS
    assert not np.array_equal(trained.model.embed.embedding[...], base.model.embed.embedding[...])


def test_eval_command_reproduces_the_after_row(run_dir, capsys):
    capsys.readouterr()
    status = cli.main(["eval", *SHORT, "--checkpoint", str(run_dir / "checkpoint")])
    out = capsys.readouterr().out
    assert status == cli.EXIT_OK
    after = json.loads((run_dir / "eval.json").read_text())["after"]
    # Same problems, seed and sampler: the checkpoint evaluates exactly as the run's final policy.
    line = next(line for line in out.splitlines() if line.startswith("model"))
    assert line.split()[1:] == [f"{100 * after['pass@1']:.1f}%", f"{100 * after['pass@8']:.1f}%"]


def test_missing_or_corrupt_checkpoint_is_a_configuration_error(tmp_path, capsys):
    status = cli.main(["eval", *SHORT, "--checkpoint", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert status == cli.EXIT_USAGE
    assert f"--checkpoint: {tmp_path / 'nowhere'}: no such model file or directory" in err
    assert "In call to configurable" not in err

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.json").write_text("{not json")
    status = cli.main(
        [
            "run",
            *SHORT,
            f"--gin.INIT_CHECKPOINT='{tmp_path / 'bad'}'",
            "--role",
            "inline",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    err = capsys.readouterr().err
    assert status == cli.EXIT_USAGE
    assert (
        f"rlax.run.init_checkpoint: {tmp_path / 'bad' / 'model.json'}: corrupt model metadata"
        in err
    )
