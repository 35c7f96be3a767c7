"""RunDir: the owner of a run's files, on hand-built directories (no training)."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from rlax.core.errors import ConfigError
from rlax.core.models.bundle import HF_INFO
from rlax.core.runtime import run_dir as run_dir_module
from rlax.core.runtime.run_dir import RunDir


def finished_at(path: pathlib.Path, step: int | None, *, eval_json: bool = True) -> RunDir:
    """A run directory as a finished run leaves it: a final policy whose info records
    ``step`` (None: no final policy) and ``eval.json``."""
    run = RunDir(path).open()
    run.operative_config.write_text("")
    if step is not None:
        run.final_policy.mkdir()
        (run.final_policy / HF_INFO).write_text(json.dumps({"step": step}))
    if eval_json:
        run.write_eval({"before": {"pass@1": 0.1}, "after": {"pass@1": 0.2}})
    return run


def test_make_makes_a_fresh_stamped_directory_and_two_in_one_second_differ(tmp_path, monkeypatch):
    monkeypatch.setattr(run_dir_module.time, "strftime", lambda _: "20250102-030405")
    root = tmp_path / "runs"
    made = [RunDir.make(root, "tiny") for _ in range(3)]
    assert [r.path.name for r in made] == [
        "tiny-20250102-030405",
        "tiny-20250102-030405-1",
        "tiny-20250102-030405-2",
    ]
    assert all(r.path.is_dir() and not any(r.path.iterdir()) for r in made)
    assert made[0].made_root == root and made[1].made_root is None  # the first made the root


def test_make_stamps_with_the_clock(tmp_path):
    made = RunDir.make(tmp_path, "run")
    assert re.fullmatch(r"run-\d{8}-\d{6}", made.path.name)
    assert made.made_root is None


def test_remove_fresh_removes_what_make_made_and_no_more(tmp_path):
    root = tmp_path / "runs"
    first, second = RunDir.make(root, "a"), RunDir.make(root, "b")
    first.param_server.mkdir()  # a child had started writing
    first.remove_fresh()  # it made the root, but the root holds another run
    assert not first.path.exists() and [p.name for p in root.iterdir()] == [second.path.name]
    again = RunDir.make(root, "c")
    second.remove_fresh()  # it did not make the root
    assert [p.name for p in root.iterdir()] == [again.path.name]
    only = RunDir.make(tmp_path / "new", "d")
    only.remove_fresh()
    assert not (tmp_path / "new").exists()  # the root it made, empty again, goes too


def test_remove_new_takes_back_what_appeared_and_leaves_what_was_there(tmp_path):
    run = RunDir(tmp_path / "run")
    (run.path / "train_state" / "5").mkdir(parents=True)
    (run.path / "operative_config.gin").write_text("old")
    before = run.contents()
    (run.path / "param_server" / "weights").mkdir(parents=True)
    (run.path / "param_server" / "queue.sqlite").write_text("q")
    (run.path / "train_state" / "5" / "note").write_text("")  # inside train_state: not removed
    (run.path / "train.log").write_text("log")

    run.remove_new(before | {run.path / "train_state" / "5" / "note"})

    assert run.contents() == before | {run.path / "train_state" / "5" / "note"}
    assert (run.path / "operative_config.gin").read_text() == "old"


def test_remove_new_removes_nothing_once_a_checkpoint_appeared(tmp_path):
    run = RunDir(tmp_path / "run")
    (run.path / "train_state").mkdir(parents=True)
    before = run.contents()
    (run.path / "param_server").mkdir()
    (run.path / "train_state" / "1").mkdir()  # a step was saved before a role refused

    run.remove_new(before)

    assert run.contents() == before | {run.path / "param_server", run.path / "train_state" / "1"}


def test_finished_is_the_final_policy_s_step_with_eval_json(tmp_path):
    assert finished_at(tmp_path / "done", 4).finished() == 4
    assert finished_at(tmp_path / "no_eval", 4, eval_json=False).finished() is None
    assert finished_at(tmp_path / "no_policy", None).finished() is None
    damaged = finished_at(tmp_path / "damaged", 4)
    (damaged.final_policy / HF_INFO).write_text("{not json")
    assert damaged.finished() is None  # finished again rather than trusted
    assert RunDir(tmp_path / "nowhere").finished() is None


def test_the_finished_message_says_the_steps_and_none_when_more_are_asked(tmp_path):
    run = finished_at(tmp_path / "done", 4)
    assert run.finished_message(4) == f"rlax: {run.path} is finished (4 of 4 steps); nothing to do"
    assert run.finished_message(3) == (
        f"rlax: {run.path} is finished (4, more than the 3 asked for, steps); nothing to do"
    )
    assert run.finished_message(5) is None


def test_holds_run_needs_the_config_or_the_train_state(tmp_path):
    run = RunDir(tmp_path / "r").open()
    assert not run.holds_run()
    with pytest.raises(ConfigError) as err:
        run.checked("--resume X")
    assert str(err.value) == (
        "--resume X: not a run directory (no operative_config.gin or train_state/)"
    )
    run.train_state.mkdir()
    assert run.holds_run() and run.checked("x") is run
    other = RunDir(tmp_path / "s").open()
    other.operative_config.write_text("")
    assert other.holds_run()


def test_resume_takes_the_newest_run_of_the_name_or_the_directory_given(tmp_path):
    for name in (
        "tiny-20250101-120000",
        "tiny-20250102-090000-2",
        "tiny-20250102-090000-1",
        "tiny-big-20991231-000000",
    ):
        RunDir(tmp_path / name).open().operative_config.write_text("")
    (tmp_path / "tiny-20991231-000000").mkdir()  # not a run: nothing in it
    assert RunDir.resumed(True, str(tmp_path), "tiny").path.name == "tiny-20250102-090000-2"
    assert RunDir.resumed(tmp_path / "tiny-20250101-120000", "x", "y").path == (
        tmp_path / "tiny-20250101-120000"
    )
    with pytest.raises(ConfigError, match="no such run directory"):
        RunDir.resumed(tmp_path / "gone", "x", "y")
    with pytest.raises(ConfigError, match="not a run directory"):
        RunDir.resumed(tmp_path / "tiny-20991231-000000", "x", "y")
    with pytest.raises(ConfigError, match="no run named 'other'"):
        RunDir.resumed(True, str(tmp_path), "other")


def test_every_file_and_folder_is_named_once_in_names(tmp_path):
    run = RunDir(tmp_path)
    paths = [getattr(run, name) for name, v in vars(RunDir).items() if isinstance(v, property)]
    assert len(paths) == len(RunDir.names()) == 14  # spec.gin and processes/ among them
    assert {p.name for p in paths} == set(RunDir.names())
    assert all(p.parent == tmp_path for p in paths)
    assert run.staged_final_policy("new").name == "checkpoint.new"


def test_a_role_handed_a_path_gets_the_same_run_dir(tmp_path):
    run = RunDir.of(str(tmp_path))
    assert RunDir.of(run) is run and run == RunDir(tmp_path) and str(run) == str(tmp_path)


def test_the_final_policy_is_swapped_in_whole(tmp_path):
    run = finished_at(tmp_path / "r", 2)
    new = run.staged_final_policy("new")
    new.mkdir()
    (new / HF_INFO).write_text(json.dumps({"step": 5}))
    run.swap_in_final_policy()
    assert run.finished() == 5
    assert sorted(p.name for p in run.path.iterdir()) == [
        "checkpoint",
        "eval.json",
        "operative_config.gin",
    ]
