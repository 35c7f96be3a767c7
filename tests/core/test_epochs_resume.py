"""Several updates per batch keep exact resume: a run stopped and resumed ends where a
run that never stopped ends, bit for bit (`rlax run --role inline`, tiny settings)."""

from __future__ import annotations

import json
import pathlib

import gin
import numpy as np
import pytest
from cli_runs import NO_CURVES
from flax import nnx

from rlax.core import cli
from rlax.core.models.bundle import load_model

pytestmark = pytest.mark.e2e

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARGS = [
    "--gin",
    str(ROOT / "configs/experiments/quickstart.gin"),
    f"--gin.INIT_CHECKPOINT='{ROOT / 'assets' / 'quickstart-base'}'",
    "--gin.PROMPTS_PER_STEP=8",
    "--gin.GROUP_SIZE=4",
    "--gin.tasks.arithmetic.num_eval=8",
    "--gin.rlax.held_out.samples=2",
    "--gin.rlax.held_out.ks=(1,)",
    "--gin.rlax.train.progress=False",
    NO_CURVES,
    "--gin.rlax.checkpointing.every=1",
    "--gin.rlax.run.deterministic=True",
    "--gin.MAX_STALENESS=0",
    "--gin.rlax.train.trainer_settings=@rlax.trainer_settings()",
    "--gin.rlax.trainer_settings.epochs=2",
    "--gin.rlax.trainer_settings.minibatches=2",
    "--gin.algorithms.grpo.alignment='tis'",
    "--role",
    "inline",
]


@pytest.fixture(autouse=True)
def fresh_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def run(run_dir: pathlib.Path, steps: int) -> None:
    gin.clear_config()
    assert (
        cli.main(["run", *ARGS, f"--gin.rlax.train.steps={steps}", "--run-dir", str(run_dir)]) == 0
    )


def params(run_dir: pathlib.Path) -> list[np.ndarray]:
    import jax

    state = nnx.to_pure_dict(nnx.state(load_model(run_dir / "checkpoint").model))
    return [np.asarray(x) for x in jax.tree.leaves(state)]


def rows(run_dir: pathlib.Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [
        {
            k: v
            for k, v in json.loads(x).items()
            if not k.endswith("_s")
            and k not in ("time", "tokens_per_s")
            and not k.startswith("recovery/")  # how the resumed run came back
        }
        for x in lines
    ]


def test_resumed_mid_run_equals_a_run_that_never_stopped(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(straight, steps=2)
    run(resumed, steps=1)
    run(resumed, steps=2)  # resumes from its step-1 checkpoint
    for a, b in zip(params(straight), params(resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    got, want = rows(resumed), rows(straight)
    assert [r["step"] for r in got] == [1, 2]
    assert got == want
    assert all(r["updates"] == 4.0 and r["version"] == r["step"] for r in got)
    assert any(r["clip_fraction"] > 0 for r in got)  # the later updates' ratio leaves 1
