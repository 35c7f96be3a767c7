"""A run's life through `rlax run --role inline` with tiny settings: step numbers, resume,
finished runs, the saved config, `rlax eval --out` and exported checksums."""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import shlex
import sys
import textwrap

import gin
import pytest
from cli_runs import NO_CURVES

from rlax.core import cli
from rlax.core.trainer.phases import WALL_CLOCK

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = ROOT / "assets" / "quickstart-base"
TINY = [
    "--gin",
    str(ROOT / "configs/experiments/quickstart.gin"),
    f"--gin.INIT_CHECKPOINT='{BASE}'",
    "--gin.PROMPTS_PER_STEP=8",
    "--gin.tasks.arithmetic.num_eval=8",
    "--gin.rlax.held_out.samples=2",
    "--gin.rlax.held_out.ks=(1,)",
    "--gin.rlax.train.progress=False",
    NO_CURVES,
    "--gin.rlax.evaluate.progress=False",
]

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


@pytest.mark.e2e
def test_one_step_number_in_hooks_metrics_and_checkpoints_across_a_resume(
    tmp_path, recorder, capsys
):
    run_dir = tmp_path / "run"
    every = "--gin.rlax.checkpointing.every=1"
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


@pytest.mark.e2e
def test_steps_that_keep_no_group_are_reported_in_the_log(tmp_path, monkeypatch, caplog):
    # Every sample scores 1, so the quickstart's zero_variance filter drops every group.
    (tmp_path / "rlax_test_always_one.py").write_text(textwrap.dedent(ALWAYS_ONE))
    monkeypatch.syspath_prepend(str(tmp_path))
    reward = "--gin.REWARD=@rewards.always_one()"
    with caplog.at_level("WARNING", logger="rlax.trainer"):
        status = run(
            "--run-dir", str(tmp_path / "run"), "-p", "rlax_test_always_one", reward, steps=4
        )
    sys.modules.pop("rlax_test_always_one", None)
    assert status == 0
    warnings = [r.getMessage() for r in caplog.records if "kept no group" in r.getMessage()]
    assert warnings == [
        (
            "steps 1-3 (3 in a row) kept no group, so nothing was trained: the "
            "curation filters (ZeroVarianceFilter) dropped every group (0 more as stale); "
            "does the reward score every sample alike?"
        )
    ]


def test_empty_step_warning_repeats_as_the_streak_doubles_and_resets(caplog):
    from rlax.core.trainer.loop import EmptyStepWatch

    watch = EmptyStepWatch([], after=2)
    kept = [0, 1, 0, 0, 0, 0, 0, 0, 0, 0]  # steps 1..10: a streak of 1, then one of 8
    with caplog.at_level("WARNING", logger="rlax.trainer"):
        for step, groups in enumerate(kept, start=1):
            watch.see(step, {"groups_kept": groups, "dropped_stale": 1})
    assert [r.getMessage().split(" kept")[0] for r in caplog.records] == [
        "steps 3-4 (2 in a row)",
        "steps 3-6 (4 in a row)",
        "steps 3-10 (8 in a row)",
    ]
    assert "curation filters (none)" in caplog.records[-1].getMessage()
    assert "(8 more as stale)" in caplog.records[-1].getMessage()


# -- the run directory: printed at start, resumed, finished ------------------------------


def snapshot(path: pathlib.Path) -> dict[str, tuple[int, int]]:
    """Every file under ``path`` with its size and modification time."""
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[pathlib.Path, str]:
    """A finished 2-step run made by rlax.train itself (run_root/tiny-STAMP); its stdout."""
    root = tmp_path_factory.mktemp("runs")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        gin.clear_config()
        status = run(
            f"--gin.rlax.train.run_root='{root}'", "--gin.rlax.train.run_name='tiny'", steps=2
        )
        gin.clear_config()
    assert status == 0
    (run_dir,) = root.iterdir()
    return run_dir, out.getvalue()


@pytest.mark.e2e
def test_the_run_directory_is_printed_first_before_base_evaluation(finished):
    run_dir, out = finished
    lines = out.splitlines()
    assert lines[0] == f"run directory: {run_dir}"
    assert lines.index(f"run directory: {run_dir}") < lines.index(
        "held-out pass@k of the base policy (8 problems x 2 samples)"
    )


@pytest.mark.e2e
@pytest.mark.parametrize(
    "where",
    [["--resume"], ["--resume", "DIR"], ["--run-dir", "DIR"], ["--role", "all", "--resume"]],
)
def test_rerunning_a_finished_run_says_so_and_changes_nothing(finished, capsys, where):
    run_dir, _ = finished
    root = run_dir.parent
    before = snapshot(run_dir)
    argv = [str(run_dir) if a == "DIR" else a for a in where]
    common = [f"--gin.rlax.train.run_root='{root}'", "--gin.rlax.train.run_name='tiny'"]
    status = cli.main(
        ["run", *TINY, "--gin.rlax.train.steps=2", *common, "--role", "inline", *argv]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out == f"rlax: {run_dir} is finished (2 of 2 steps); nothing to do\n"
    assert snapshot(run_dir) == before  # no evaluation, no export, no config rewritten
    assert list(root.iterdir()) == [run_dir]  # and no new run


def test_resume_without_a_directory_takes_the_newest_run_of_that_name(tmp_path):
    from rlax.core.runtime.run_dir import RunDir

    def make(name: str, marker: str = "operative_config.gin") -> pathlib.Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / marker).write_text("")
        return tmp_path / name

    make("tiny-20250101-120000")
    newest = make("tiny-20250102-090000-2")
    make("tiny-20250102-090000-1")
    make("tiny-big-20991231-000000")  # another run name
    (tmp_path / "tiny-20991231-000000").mkdir()  # not a run: nothing in it
    assert RunDir.newest(tmp_path, "tiny").path == newest
    assert RunDir.newest(tmp_path, "tiny-big").path == tmp_path / "tiny-big-20991231-000000"


@pytest.mark.parametrize(
    ("resume", "expected"),
    [
        (["--resume", "{tmp}/nowhere"], "--resume {tmp}/nowhere: no such run directory"),
        (
            ["--resume", "{tmp}/empty"],
            "--resume {tmp}/empty: not a run directory (no operative_config.gin or train_state/)",
        ),
        (
            ["--resume"],
            (
                "--resume: no run named 'tiny' in {tmp}/runs/ (from rlax.train.run_root "
                "and rlax.train.run_name); give its directory: --resume DIR"
            ),
        ),
    ],
)
@pytest.mark.parametrize("role", ["inline", "all"])
def test_nothing_to_resume_is_a_one_line_error(tmp_path, capsys, resume, expected, role):
    (tmp_path / "empty").mkdir()
    (tmp_path / "runs").mkdir()
    args = [a.format(tmp=tmp_path) for a in resume]
    common = [
        f"--gin.rlax.train.run_root='{tmp_path / 'runs'}'",
        "--gin.rlax.train.run_name='tiny'",
    ]
    status = cli.main(["run", *TINY, *common, "--role", role, *args])
    assert status == cli.EXIT_USAGE
    assert capsys.readouterr().err == f"rlax: error: {expected.format(tmp=tmp_path)}\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["empty", "runs"]  # nothing made


def test_resume_and_run_dir_are_exclusive(capsys):
    assert cli.main(["run", *TINY, "--run-dir", "a", "--resume", "b"]) == cli.EXIT_USAGE
    assert "not allowed with argument" in capsys.readouterr().err


# -- preemption: the command that resumes -------------------------------------------------


@pytest.mark.e2e
def test_a_preempted_run_prints_the_command_that_resumes_it(tmp_path, capsys):
    notice = tmp_path / "notice"
    notice.write_text("")  # a notice from the start: the trainer stops at its first safe point
    bindings = [
        "--gin.rlax.train.preemption_notices=[@preemption.notice_file()]",
        f"--gin.preemption.notice_file.path='{notice}'",
        "--gin.preemption.notice_file.poll_s=0.05",
    ]
    run_dir = tmp_path / "run"
    assert run(*bindings, "--run-dir", str(run_dir), steps=2) == cli.EXIT_PREEMPTED
    err = capsys.readouterr().err.splitlines()
    hint = next(line for line in err if line.startswith("rlax: resume with: "))
    assert err.index(hint) == len(err) - 1  # the last word
    command = shlex.split(hint.removeprefix("rlax: resume with: "))
    assert command[:2] == ["rlax", "run"] and command[-2:] == ["--resume", str(run_dir)]
    assert "--run-dir" not in command and command[-4:-2] == ["--role", "inline"]

    notice.unlink()
    gin.clear_config()
    assert cli.main(command[1:]) == 0  # the printed command, as it is, finishes the run
    assert metric_steps(run_dir) == [1, 2]


def test_a_preempted_local_cluster_prints_the_command_that_resumes_it(
    tmp_path, monkeypatch, capsys
):
    from rlax.core.launch import local_cluster as roles

    monkeypatch.setattr(roles, "local_cluster", lambda spec, *, argv, env=None: 75)
    monkeypatch.chdir(tmp_path)  # the run directory r/x y is made here
    path = tmp_path / "exp.gin"
    path.write_text("include 'quickstart.gin'\n")
    status = cli.main(["run", "--gin", str(path), "--gin.SEED=3", "--run-dir", "r/x y"])
    assert status == cli.EXIT_PREEMPTED
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"rlax: resume with: rlax run --gin {path} --gin.SEED=3 --resume 'r/x y'"
    )


def test_the_resume_command_keeps_plugins_and_quotes_what_the_shell_would_split():
    from rlax.core.runtime.run_dir import RunDir

    command = RunDir(pathlib.Path("r")).resume_command(
        ["a b.gin"], ["rlax.run.seed=1"], ["my_plugin", "no:grpo"], "inline"
    )
    assert command == (
        "rlax run --gin 'a b.gin' --gin.rlax.run.seed=1 -p my_plugin -p no:grpo "
        "--role inline --resume r"
    )


# -- the saved config reproduces the run; rlax eval --out -------------------------------

TIMING = WALL_CLOCK  # every metric that depends on the wall clock


def rows_without_timing(run_dir: pathlib.Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


@pytest.mark.e2e
def test_the_saved_config_alone_reproduces_the_run(finished, tmp_path, capsys):
    run_dir, _ = finished
    config = str(run_dir / "operative_config.gin")
    again = tmp_path / "again"
    assert cli.main(["run", "--gin", config, "--role", "inline", "--run-dir", str(again)]) == 0
    assert rows_without_timing(again) == rows_without_timing(run_dir)
    assert (again / "eval.json").read_text() == (run_dir / "eval.json").read_text()
    assert "train.steps = 2" in (run_dir / "trainer_operative_config.gin").read_text()

    # rlax eval with it, --out FILE: the checkpoint evaluates as the run's final policy did.
    gin.clear_config()
    capsys.readouterr()
    out = tmp_path / "result.json"
    checkpoint = run_dir / "checkpoint"
    status = cli.main(["eval", "--gin", config, "--checkpoint", str(checkpoint), "--out", str(out)])
    assert status == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"results written to {out}"
    after = json.loads((run_dir / "eval.json").read_text())["after"]
    assert json.loads(out.read_text()) == {
        "checkpoint": str(checkpoint),
        "problems": 8,
        "samples": 2,
        "seed": 0,
        "pass_at_k": after,
    }


def test_the_saved_config_configures_every_role(finished, monkeypatch, tmp_path):
    from rlax.core.launch import local_cluster as roles
    from rlax.core.param_server import role as ps_role
    from rlax.core.worker import role as worker

    seen = {}

    def record(name):
        def role(spec, **kwargs):
            seen[name] = spec
            return 0

        return role

    monkeypatch.setattr(roles, "local_cluster", record("all"))
    monkeypatch.setattr(ps_role, "param_server", record("param_server"))
    monkeypatch.setattr(worker, "worker", record("worker"))
    config = str(finished[0] / "operative_config.gin")
    for role in ("all", "param_server", "worker"):
        gin.clear_config()
        run_dir = str(tmp_path / role)
        assert cli.main(["run", "--gin", config, "--role", role, "--run-dir", run_dir]) == 0
    run = seen["all"]
    assert (run.server.address, run.local_cluster.num_workers) == ("127.0.0.1:50051", 2)
    # Every role builds the same run from the saved config alone.
    for name in ("param_server", "worker"):
        spec = seen[name]
        same = ("init_checkpoint", "seed", "prompts_per_step", "group_size", "server", "worker")
        assert {k: getattr(spec, k) for k in same} == {k: getattr(run, k) for k in same}, name
        parts = (spec.task, spec.reward, spec.sampler, *spec.curation)
        assert list(map(type, parts)) == list(
            map(type, (run.task, run.reward, run.sampler, *run.curation))
        )


def test_eval_out_in_a_missing_directory_is_an_error_before_any_work(finished, tmp_path, capsys):
    run_dir, _ = finished
    out = tmp_path / "no" / "result.json"
    argv = ["eval", *TINY, "--checkpoint", str(run_dir / "nowhere"), "--out", str(out)]
    assert cli.main(argv) == cli.EXIT_USAGE
    assert capsys.readouterr().err == f"rlax: error: --out {out}: no such directory {out.parent}\n"


def test_the_run_s_final_policy_is_exported_with_checksums(finished):
    from rlax.core.models.bundle import verify_checksums

    checkpoint = finished[0] / "checkpoint"
    listed = json.loads((checkpoint / "checksums.json").read_text())["files"]
    assert "model.json" in listed and verify_checksums(checkpoint) is True
