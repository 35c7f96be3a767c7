"""A run's life through `rlax run --role inline` with tiny settings: step numbers, resume,
finished runs, the saved config, `rlax eval --out` and exported checksums."""

from __future__ import annotations

import json
import pathlib
import sys
import textwrap

import gin
import pytest

from rlax.core import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = ROOT / "assets" / "quickstart-base"
TINY = [
    "--gin", str(ROOT / "configs" / "quickstart.gin"),
    f"--gin.INIT_CHECKPOINT='{BASE}'",
    "--gin.PROMPTS_PER_STEP=8",
    "--gin.tasks.arithmetic.num_eval=8",
    "--gin.rlax.train.eval_samples=2",
    "--gin.rlax.train.eval_ks=(1,)",
    "--gin.rlax.train.progress=False",
    "--gin.rlax.evaluate.eval_samples=2",
    "--gin.rlax.evaluate.eval_ks=(1,)",
    "--gin.rlax.evaluate.progress=False",
]  # fmt: skip

RECORDER = """
    from rlax.core import hookimpl

    CALLS = []

    @hookimpl
    def rlax_on_step_end(step, metrics):
        CALLS.append(("step_end", step, metrics["step"]))

    @hookimpl
    def rlax_on_checkpoint(step, path):
        CALLS.append(("checkpoint", step, path))
"""


@pytest.fixture(autouse=True)
def fresh_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture
def recorder(tmp_path, monkeypatch):
    """A plugin module (``-p NAME``) that records the step and checkpoint hooks."""
    name = f"rlax_test_recorder_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(RECORDER))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def run(*args: str, steps: int) -> int:
    return cli.main(["run", *TINY, f"--gin.rlax.train.steps={steps}", "--role", "inline", *args])


def metric_steps(run_dir: pathlib.Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


def test_one_step_number_in_hooks_metrics_and_checkpoints_across_a_resume(
    tmp_path, recorder, capsys
):
    run_dir = tmp_path / "run"
    every = "--gin.rlax.train.checkpoint_every=1"
    assert run("--run-dir", str(run_dir), "-p", recorder, every, steps=2) == 0
    calls = sys.modules[recorder].CALLS
    states = run_dir / "train_state"
    assert calls == [
        ("step_end", 1, 1),
        ("checkpoint", 1, str(states / "1")),
        ("step_end", 2, 2),
        ("checkpoint", 2, str(states / "2")),
        ("checkpoint", 2, str(run_dir / "checkpoint")),
    ]
    assert metric_steps(run_dir) == [1, 2]
    assert sorted(p.name for p in states.iterdir()) == ["1", "2"]

    calls.clear()
    capsys.readouterr()
    assert run("--run-dir", str(run_dir), "-p", recorder, every, steps=3) == 0
    assert f"resumed from {states / '2'}: step 2" in capsys.readouterr().out
    assert calls == [
        ("step_end", 3, 3),
        ("checkpoint", 3, str(states / "3")),
        ("checkpoint", 3, str(run_dir / "checkpoint")),
    ]
    assert metric_steps(run_dir) == [1, 2, 3]  # no row lost or repeated by the resume


ALWAYS_ONE = """
    from rlax.core import hookimpl

    class AlwaysOne:
        def score(self, prompt, completion_text):
            return 1.0

    @hookimpl
    def rlax_register_rewards():
        return {"always_one": AlwaysOne}
"""


def test_steps_that_keep_no_group_are_reported_in_the_log(tmp_path, monkeypatch, caplog):
    # Every sample scores 1, so the quickstart's zero_variance filter drops every group.
    (tmp_path / "rlax_test_always_one.py").write_text(textwrap.dedent(ALWAYS_ONE))
    monkeypatch.syspath_prepend(str(tmp_path))
    reward = "--gin.rlax.train.reward=@rewards.always_one()"
    with caplog.at_level("WARNING", logger="rlax.trainer"):
        status = run("--run-dir", str(tmp_path / "run"), "-p", "rlax_test_always_one", reward,
                     steps=4)  # fmt: skip
    sys.modules.pop("rlax_test_always_one", None)
    assert status == 0
    warnings = [r.getMessage() for r in caplog.records if "kept no group" in r.getMessage()]
    assert warnings == [
        "rlax: warning: steps 1-3 (3 in a row) kept no group, so nothing was trained: the "
        "curation filters (ZeroVarianceFilter) dropped every group (0 more as stale); "
        "does the reward score every sample alike?"
    ]


def test_empty_step_warning_repeats_as_the_streak_doubles_and_resets(caplog):
    from rlax.core.training_run import EmptyStepWatch

    watch = EmptyStepWatch([], after=2)
    kept = [0, 1, 0, 0, 0, 0, 0, 0, 0, 0]  # steps 1..10: a streak of 1, then one of 8
    with caplog.at_level("WARNING", logger="rlax.trainer"):
        for step, groups in enumerate(kept, start=1):
            watch.see(step, {"groups_kept": groups, "dropped_stale": 1})
    assert [r.getMessage().split(" kept")[0] for r in caplog.records] == [
        "rlax: warning: steps 3-4 (2 in a row)",
        "rlax: warning: steps 3-6 (4 in a row)",
        "rlax: warning: steps 3-10 (8 in a row)",
    ]
    assert "curation filters (none)" in caplog.records[-1].getMessage()
    assert "(8 more as stale)" in caplog.records[-1].getMessage()
