"""Seeing a run while it runs (docs/observability.md), on a short real `--role inline` run.

One run of 3 steps with TensorBoard, W&B (offline) and a logger that always
fails, preempted after step 2 and resumed: the event files hold every metric
of metrics.jsonl at every step, the resumed run continues the same W&B run,
the failing logger costs a warning, rollouts.jsonl holds the traces and
`rlax show` prints them, and each step's phase timings add up to its wall time.
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
import sys
import textwrap

import gin
import pytest

from rlax.core import cli
from rlax.core.trainer.phases import PHASES, PhaseClock

pytestmark = pytest.mark.e2e

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = ROOT / "assets" / "quickstart-base"
TINY = [
    "--gin",
    str(ROOT / "configs/experiments/quickstart.gin"),
    f"--gin.INIT_CHECKPOINT='{BASE}'",
    "--gin.PROMPTS_PER_STEP=8",
    "--gin.tasks.arithmetic.num_eval=8",
    "--gin.rlax.held_out.samples=2",
    "--gin.rlax.held_out.ks=(1, 2)",
    "--gin.rlax.train.progress=False",
    "--gin.rlax.train.steps=3",
    "--gin.rlax.watch.eval_every=2",
    "--gin.rlax.watch.trace_every=1",
    "--gin.rlax.watch.trace_groups=2",
    "--gin.rlax.watch.plot_every=0",
    "--gin.rlax.watch.loggers=[@loggers.tensorboard(), @loggers.wandb(), @loggers.broken()]",
    "--role",
    "inline",
]

# A logger that fails at every step, and a hook that asks for a stop after step 1 (the trainer
# sees the notice at the end of step 2).
PLUGIN = """
    import pathlib

    from rlax.core import hookimpl

    NOTICE = None

    class Broken:
        def open(self, run_dir, step):
            pass

        def log_metrics(self, step, metrics):
            raise OSError("disk full")

        def log_traces(self, step, traces):
            pass

        def close(self):
            pass

    @hookimpl
    def rlax_register_loggers():
        return {"broken": Broken}

    @hookimpl
    def rlax_on_step_end(step, metrics):
        if step == 1 and NOTICE is not None:
            pathlib.Path(NOTICE).write_text("")
"""


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"rlax: {record.levelname.lower()}: {record.getMessage()}")


@pytest.fixture(scope="module")
def preempted_and_resumed(tmp_path_factory):
    """(run directory, the W&B id after the preempted part, [(status, rlax's warnings)] of each)."""
    tmp = tmp_path_factory.mktemp("observe")
    name = f"rlax_test_observe_{tmp.name}"
    (tmp / f"{name}.py").write_text(textwrap.dedent(PLUGIN))
    sys.path.insert(0, str(tmp))
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    run_dir, notice = tmp / "run", tmp / "notice"
    stop = [
        "--gin.rlax.train.preemption_notices=[@preemption.notice_file()]",
        f"--gin.preemption.notice_file.path='{notice}'",
        "--gin.preemption.notice_file.poll_s=0.01",
    ]
    parts, first_id = [], None
    try:
        __import__(name).NOTICE = str(notice)
        for _ in range(2):
            gin.clear_config()
            lines = Lines()
            logging.getLogger("rlax").addHandler(lines)
            try:
                status = cli.main(["run", *TINY, "-p", name, *stop, "--run-dir", str(run_dir)])
            finally:
                logging.getLogger("rlax").removeHandler(lines)
            parts.append((status, lines.lines))
            if notice.exists():
                notice.unlink()
                first_id = (run_dir / "wandb_run_id").read_text().strip()
                __import__(name).NOTICE = None
    finally:
        gin.clear_config()
        sys.path.remove(str(tmp))
        sys.modules.pop(name, None)
        mp.undo()
    return run_dir, first_id, parts


def rows(run_dir: pathlib.Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def test_the_run_was_preempted_after_step_2_and_resumed_to_step_3(preempted_and_resumed):
    run_dir, _, errs = preempted_and_resumed
    assert [status for status, _ in errs] == [cli.EXIT_PREEMPTED, 0]
    assert [r["step"] for r in rows(run_dir, "metrics.jsonl")] == [1, 2, 3]


def test_every_metric_of_every_step_is_in_the_tensorboard_events(preempted_and_resumed):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlax.plugins.loggers.tensorboard import tag

    run_dir, _, _ = preempted_and_resumed
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    scalars = {t: {e.step: e.value for e in events.Scalars(t)} for t in events.Tags()["scalars"]}
    metrics = rows(run_dir, "metrics.jsonl")
    assert {"wait_rollouts_s", "heldout/pass_at_1"} <= set(scalars)
    for row in metrics:
        for name, value in row.items():
            if name in ("step", "time"):
                continue
            assert scalars[tag(name)][row["step"]] == pytest.approx(value, rel=1e-5, abs=1e-6)
    assert "rollouts/text_summary" in events.Tags()["tensors"]


def test_the_resumed_run_continues_the_same_wandb_run(preempted_and_resumed):
    run_dir, first_id, _ = preempted_and_resumed
    assert (run_dir / "wandb_run_id").read_text().strip() == first_id
    offline = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2  # the preempted part and the resumed one, one W&B run id
    assert all(name.endswith(f"-{first_id}") for name in offline)


def test_a_failing_logger_is_one_warning_and_the_run_goes_on(preempted_and_resumed):
    _, _, errs = preempted_and_resumed
    for status, lines in errs:
        warned = [line for line in lines if "Broken" in line]
        assert warned[0] == (
            "rlax: warning: logger Broken failed in log_metrics: OSError: disk "
            "full; the run goes on"
        )
        assert warned[1:] == ["rlax: warning: logger Broken failed in log_metrics 2 times in all"]


def test_a_preemption_writes_the_curves_and_eval_so_far(preempted_and_resumed):
    run_dir, _, _ = preempted_and_resumed
    results = json.loads((run_dir / "eval.json").read_text())
    assert [e["step"] for e in results["during"]] == [2]
    assert set(results) == {"before", "during", "after"}
    assert (run_dir / "curves.png").stat().st_size > 0


def test_rollouts_jsonl_holds_each_traced_group(preempted_and_resumed):
    run_dir, _, _ = preempted_and_resumed
    traced = rows(run_dir, "rollouts.jsonl")
    assert [t["step"] for t in traced] == [1, 1, 2, 2, 3, 3]  # no step traced twice by the resume
    for t in traced:
        assert t["prompt"].endswith("=") and t["answer"].isdigit()
        assert len(t["completions"]) == 8  # the group size
        for c in t["completions"]:
            assert c["reward"] in (0.0, 1.0)
            assert c["reason"] == "correct" if c["reward"] else c["reason"].startswith("wrong")
            assert c["finish_reason"] in ("stop", "length") and c["length"] >= 1
            assert c["policy_version"] == t["policy_version"] == t["step"] - 1


def test_rlax_show_prints_the_state_the_evaluations_and_the_latest_traces(
    preempted_and_resumed, capsys
):
    run_dir, _, _ = preempted_and_resumed
    capsys.readouterr()
    assert cli.main(["show", str(run_dir), "--traces", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    last = rows(run_dir, "metrics.jsonl")[-1]
    trace = rows(run_dir, "rollouts.jsonl")[-2]
    assert out[0] == f"run: {run_dir}"
    assert out[1] == "state: finished after step 3 (its final policy is in checkpoint/)"
    assert out[2].startswith(f"last metrics (step 3): reward {last['reward']:.4g}")
    assert out.index("held-out pass@k:   pass@1   pass@2") < out.index(
        "rollout traces of step 3 (1 groups):"
    )
    assert any(line.startswith("  step 2 ") for line in out)
    assert f"  prompt {trace['prompt']!r}  answer {trace['answer']!r}" in "\n".join(out)
    texts = [line for line in out if line.startswith("    ")]
    assert len(texts) == 8 and all(
        repr(c["text"]) in "\n".join(texts) for c in trace["completions"]
    )


def test_rlax_show_of_a_preempted_run_prints_the_command_that_resumes_it(tmp_path, capsys):
    (tmp_path / "operative_config.gin").write_text("")
    meta = tmp_path / "train_state" / "2" / "meta"
    meta.mkdir(parents=True)
    (meta / "metadata").write_text(json.dumps({"data": {"drawn": 16}}))
    (tmp_path / "train_state" / "2" / "commit_success.txt").write_text("")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 2, "reward": 0.5}) + "\n")
    assert cli.main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "state: 2 steps done, last at -; newest checkpoint: step 2" in out
    assert (
        f"resume with: rlax run --gin {tmp_path}/operative_config.gin --role inline "
        f"--resume {tmp_path}"
    ) in out
    assert cli.main(["show", str(tmp_path / "nope")]) == cli.EXIT_USAGE


def test_each_step_s_phases_add_up_to_its_wall_time(preempted_and_resumed):
    run_dir, _, _ = preempted_and_resumed
    for row in rows(run_dir, "metrics.jsonl"):
        phases = sum(row[f"{p}_s"] for p in PHASES)
        assert math.isclose(phases, row["step_s"], rel_tol=0.1), row
    times = [r["time"] for r in rows(run_dir, "metrics.jsonl")]
    assert times == sorted(times) and times[0] > 1.7e9  # wall-clock timestamps


def test_the_phase_clock_adds_up_and_tells_each_phase_as_it_starts():
    told = []
    clock = PhaseClock(told.append)
    for phase in ("wait_rollouts", "train", "wait_rollouts"):
        with clock(phase):
            pass
    metrics = clock.metrics()
    assert told == ["waiting for rollouts", "training", "waiting for rollouts"]
    assert sum(metrics[f"{p}_s"] for p in PHASES) <= metrics["step_s"]
    assert set(metrics) == {"step_s", "time", *(f"{p}_s" for p in PHASES)}


def test_curves_false_draws_no_png_where_the_default_draws_one(tmp_path):
    from rlax.core.trainer.observe import Observer

    rows = [{"step": s, "reward": 0.1 * s, "loss": 1.0 / s} for s in (1, 2, 3)]
    drawn, undrawn = tmp_path / "drawn", tmp_path / "undrawn"
    drawn.mkdir(), undrawn.mkdir()
    Observer(drawn).stopped(rows, None)  # a preemption's safe point: curves and eval.json
    Observer(undrawn, curves=False).stopped(rows, None)
    assert (drawn / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in undrawn.iterdir()) == ["eval.json"]
