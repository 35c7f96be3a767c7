"""The ``rlax`` command: listing plugins, run/eval start-up, exit statuses."""

from __future__ import annotations

import json
import pathlib
import sys

import gin
import pytest

from rlax.core import cli, config
from rlax.core.errors import Preempted
from rlax.core.evaluation import evaluate as evaluation
from rlax.core.runtime import terminal
from rlax.core.runtime.run_dir import RunDir
from rlax.core.trainer import role as experiment

RECORDER = """
    from rlax.core import hookimpl

    CALLS = []

    @hookimpl
    def rlax_on_step_end(step, metrics):
        CALLS.append((step, dict(metrics)))
"""


@pytest.fixture(autouse=True)
def fresh_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture
def fake_experiment(site, monkeypatch):
    """Installs RUN_PLUGIN and replaces the roles ``rlax run`` / ``rlax eval`` start with
    fakes; returns the calls they received (the specification each was handed)."""
    site.install_run_components()
    calls: dict[str, dict] = {}

    def train(spec, *, hook, run_dir=None, inline=False):
        calls["train"] = {"spec": spec, "run_dir": run_dir, "inline": inline}
        for step in range(1, spec.train.steps + 1):
            hook.rlax_on_step_end(step=step, metrics={"loss": 1.0 / step})
        return spec.seed  # the test's status: the run's seed

    def evaluate(spec, *, hook, checkpoint, out=None):
        calls["evaluate"] = {"spec": spec, "checkpoint": checkpoint, "out": out}
        return 0

    monkeypatch.setattr(experiment, "train", train)
    monkeypatch.setattr(evaluation, "evaluate", evaluate)
    return calls


def gin_file(tmp_path: pathlib.Path, text: str, name: str = "exp.gin") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- rlax plugins ----------------------------------------------------------


def test_plugins_json_lists_each_component_with_exactly_five_keys(site, capsys):
    site.install("rlax-fake", "1.2", {"fake_cli": site.rewards("b_reward", "a_reward")})

    assert cli.main(["plugins", "--json"]) == cli.EXIT_OK

    assert json.loads(capsys.readouterr().out) == [
        {
            "kind": "rewards",
            "name": n,
            "plugin": "fake_cli",
            "distribution": "rlax-fake",
            "version": "1.2",
        }
        for n in ("a_reward", "b_reward")
    ]


def test_plugins_table(site, capsys):
    site.install("rlax-fake", "1.2", {"fake_cli": site.rewards("loud")})

    assert cli.main(["plugins"]) == cli.EXIT_OK

    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        ["KIND", "NAME", "PLUGIN", "DISTRIBUTION", "VERSION"],
        ["rewards", "loud", "fake_cli", "rlax-fake", "1.2"],
    ]


def test_p_no_blocks_and_p_module_adds(site, capsys):
    site.install("rlax-fake", "1.0", {"fake_blocked": site.rewards("blocked")})
    module = site.module("fake_added", site.rewards("added"))

    assert cli.main(["plugins", "--json", "-p", "no:fake_blocked", "-p", module]) == 0

    rows = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["plugin"], r["distribution"]) for r in rows] == [("added", module, "-")]


def test_disable_autoload_lists_the_builtins_and_says_so(site, monkeypatch, capsys):
    site.install("rlax-llm", "0.1", {"fake_builtin": site.rewards("builtin")})
    site.install("rlax-fake", "1.0", {"fake_auto": site.rewards("auto")})
    monkeypatch.setenv("RLAX_DISABLE_PLUGIN_AUTOLOAD", "1")

    assert cli.main(["plugins", "--json"]) == 0

    captured = capsys.readouterr()
    assert [r["name"] for r in json.loads(captured.out)] == ["builtin"]
    assert captured.err == (
        "rlax: RLAX_DISABLE_PLUGIN_AUTOLOAD is set: only the built-in plugins and those "
        "named with -p are loaded\n"
    )


def test_plugins_prints_no_autoload_notice_by_default(site, capsys):
    site.install("rlax-fake", "1.0", {"fake_auto": site.rewards("auto")})

    assert cli.main(["plugins", "--json"]) == 0

    captured = capsys.readouterr()
    assert [r["name"] for r in json.loads(captured.out)] == ["auto"]
    assert captured.err == ""


# -- rlax run / eval ---------------------------------------------------------


def test_run_all_starts_every_child_on_the_specification_it_built(
    site, fake_experiment, monkeypatch, tmp_path, capsys
):
    from rlax.core.config.spec_building import SPEC_DIGEST_ENV
    from rlax.core.launch import local_cluster as roles

    site.install("rlax-extra", "1.0", {"fake_extra": site.rewards("extra")})
    seen = {}

    def local_cluster(spec, *, argv, env=None):
        seen.update(spec=spec, argv=list(argv), env=dict(env or {}))
        return 0

    monkeypatch.setattr(roles, "local_cluster", local_cluster)
    out = tmp_path / "out"
    bindings = ["--gin.SEED=7", "--gin.rlax.local_cluster.num_workers=3"]
    args = [
        "--gin",
        site.run_gin(tmp_path),
        *bindings,
        "-p",
        "no:fake_extra",
        "--run-dir",
        str(out),
    ]
    assert cli.main(["run", *args]) == 0

    spec, spec_file = seen["spec"], out / "spec.gin"
    assert (spec.seed, spec.local_cluster.num_workers) == (7, 3)
    assert spec.init_checkpoint == str(tmp_path / "model")  # beside the file that named it
    # The children get the written specification alone (with the plugins and the run).
    assert seen["argv"] == ["--gin", str(spec_file), "-pno:fake_extra", "--run-dir", str(out)]
    assert "SEED = 7" in spec_file.read_text()

    # A child started on it builds the same run, and its build matches the supervisor's.
    monkeypatch.setenv(SPEC_DIGEST_ENV, seen["env"][SPEC_DIGEST_ENV])
    child = ["run", "--role", "trainer", "--gin", str(spec_file), "-pno:fake_extra"]
    assert cli.main([*child, "--run-dir", str(out)]) == 7  # the fake trainer returns the seed
    built = fake_experiment["train"]["spec"]
    assert (built.seed, built.local_cluster.num_workers) == (7, 3)
    assert built.init_checkpoint == spec.init_checkpoint
    assert built.train.steps == spec.train.steps and built.server == spec.server

    # A child whose build differs from the supervisor's refuses to start.
    capsys.readouterr()
    assert cli.main([*child, "--gin.SEED=8", "--run-dir", str(out)]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.startswith(
        "rlax: error: the run specification differs from the supervisor's"
    )


def test_run_calls_train_with_the_specification_and_the_hook(site, fake_experiment, tmp_path):
    recorder = site.module("fake_recorder", RECORDER)
    path = site.run_gin(tmp_path, "rlax.train.steps = 2\nrlax.train.run_name = 'from file'\n")

    args = ["--role", "trainer", "--gin", path, "--gin.rlax.train.run_name='cli'", "-p", recorder]
    status = cli.main(["run", *args, "--run-dir", "out"])

    assert status == cli.EXIT_OK
    call = fake_experiment["train"]
    # The run directory as a RunDir: it carries --start-over (a RunDir equals one of its path).
    assert (call["run_dir"], call["inline"]) == (RunDir(pathlib.Path("out")), False)
    assert (call["spec"].train.steps, call["spec"].train.run_name) == (2, "cli")
    assert sys.modules[recorder].CALLS == [(1, {"loss": 1.0}), (2, {"loss": 0.5})]


def test_run_inline_trains_in_this_process(site, fake_experiment, tmp_path):
    assert cli.main(["run", "--role", "inline", "--gin", site.run_gin(tmp_path)]) == cli.EXIT_OK
    assert fake_experiment["train"]["inline"] is True


def test_run_returns_train_s_status(site, fake_experiment, tmp_path):
    path = site.run_gin(tmp_path, "SEED = 3\n")  # the fake trainer returns the run's seed

    assert cli.main(["run", "--role", "trainer", "--gin", path]) == 3
    assert fake_experiment["train"]["run_dir"] is None


def test_eval_calls_evaluate_with_the_checkpoint_as_the_starting_policy(
    site, fake_experiment, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt" / "7").mkdir(parents=True)
    path = site.run_gin(tmp_path, "rlax.evaluate.progress = False\n")

    argv = ["eval", "--gin", path, "--checkpoint", "ckpt/7", "--out", "e.json"]
    assert cli.main(argv) == cli.EXIT_OK

    call = fake_experiment["evaluate"]
    assert (call["checkpoint"], call["out"]) == (pathlib.Path("ckpt/7"), pathlib.Path("e.json"))
    assert call["spec"].init_checkpoint == "ckpt/7"  # as given, from the working directory
    assert call["spec"].evaluate.progress is False


def test_a_run_that_breaks_a_rule_of_the_whole_specification_starts_no_role(
    site, fake_experiment, tmp_path, capsys
):
    path = site.run_gin(tmp_path, "rlax.run.deterministic = True\nMAX_STALENESS = 1\n")

    assert cli.main(["run", "--role", "trainer", "--gin", path, "--run-dir", "out"]) == 2

    assert capsys.readouterr().err == (
        "rlax: error: rlax.run.deterministic needs rlax.run.max_staleness = 0 (MAX_STALENESS), "
        "got 1: a resumed run could otherwise train on other groups\n"
    )
    assert "train" not in fake_experiment and not pathlib.Path("out").exists()


def test_preempted_exits_75(site, fake_experiment, monkeypatch, tmp_path, capsys):
    def train(spec, *, hook, run_dir=None, inline=False):
        raise Preempted("SIGTERM at step 4")

    monkeypatch.setattr(experiment, "train", train)

    assert cli.main(["run", "--role", "trainer", "--gin", site.run_gin(tmp_path)]) == 75
    assert "SIGTERM at step 4" in capsys.readouterr().err


def test_failure_exits_1_with_a_traceback(site, fake_experiment, monkeypatch, tmp_path, capsys):
    def train(spec, *, hook, run_dir=None, inline=False):
        raise RuntimeError("boom")

    monkeypatch.setattr(experiment, "train", train)

    assert cli.main(["run", "--role", "trainer", "--gin", site.run_gin(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: boom" in err


# -- usage and configuration errors: status 2, one line, no traceback --------


def usage_error(argv: list[str], capsys) -> str:
    assert cli.main(argv) == cli.EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_gin_syntax_error_exits_2(site, fake_experiment, tmp_path, capsys):
    path = gin_file(tmp_path, "rlax.train.steps = 1\nrlax.train.run_name 'x'\n")

    err = usage_error(["run", "--gin", path], capsys)

    assert err.startswith(f"rlax: error: {path}:2: syntax error")
    assert "train" not in fake_experiment


def test_unknown_binding_exits_2(site, fake_experiment, tmp_path, capsys):
    err = usage_error(["run", "--gin", site.run_gin(tmp_path), "--gin.rlax.train.stepz=3"], capsys)

    assert err == (
        "rlax: error: --gin.rlax.train.stepz=3: rlax.train has no parameter 'stepz'; "
        "did you mean 'steps'? "
        "(valid: algorithm, checkpointing, distributed, lora, mesh, optimizer, "
        "preemption_notices, progress, run_name, run_root, steps, teacher, trainer_settings, "
        "watch)\n"
    )


def test_unknown_plugin_name_exits_2_listing_valid_names(site, fake_experiment, tmp_path, capsys):
    site.install("rlax-fake", "1.0", {"fake_cli": site.rewards("loud", "quiet")})
    path = gin_file(tmp_path, "REWARD = @rewards.shout()\n")

    err = usage_error(["run", "--gin", path], capsys)

    assert err.startswith(f"rlax: error: {path}:1: ")
    assert err.endswith("valid rewards: fake, loud, quiet\n")  # fake: fake_experiment's


def test_duplicate_plugin_exits_2(site, capsys):
    site.install("rlax-a", "1.0", {"dup_a": site.rewards("same")})
    site.install("rlax-b", "1.0", {"dup_b": site.rewards("same")})

    err = usage_error(["plugins"], capsys)

    assert "plugin 'dup_a' from rlax-a 1.0" in err and "plugin 'dup_b' from rlax-b 1.0" in err


def test_broken_plugin_exits_2(site, capsys):
    site.install("rlax-fake", "1.0", {"fake_broken": "raise ImportError('half-installed')"})

    err = usage_error(["plugins"], capsys)

    assert "'fake_broken'" in err and "rlax-fake 1.0" in err and "half-installed" in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], "required: COMMAND"),
        (["run"], "required: --gin"),
        (["eval", "--gin", "x.gin"], "required: --checkpoint"),
        (["run", "--gin", "x.gin", "--gin.train.steps"], "--gin.NAME=VALUE"),
        (["plugins", "--gin.train.steps=1"], "apply to 'run' and 'eval' only"),
    ],
)
def test_bad_arguments_exit_2(site, capsys, argv, expected):
    assert expected in usage_error(argv, capsys)


def test_missing_gin_file_exits_2(site, fake_experiment, capsys):
    assert usage_error(["run", "--gin", "does-not-exist.gin"], capsys) == (
        "rlax: error: does-not-exist.gin: no such gin file, nor a packaged config of that name "
        f"(packaged: {', '.join(config.packaged_configs())})\n"
    )


def test_blocking_a_plugin_that_does_not_exist_is_an_error_naming_the_closest(site, capsys):
    assert cli.main(["plugins", "-p", "no:grpoo"]) == 2

    err = capsys.readouterr().err
    assert err.startswith(
        "rlax: error: -p no:grpoo: no installed plugin is named 'grpoo'; did you mean 'grpo'"
    )
    assert err.count("\n") == 1


def test_an_rlax_warning_is_shown_once_as_one_line(capsys):
    import warnings

    from rlax.core.trainer.checkpoint import CorruptCheckpointWarning

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = terminal.show_warning
            warnings.warn(
                "checkpoint runs/x/2 cannot be restored (ValueError: bad); moved",
                CorruptCheckpointWarning,
                stacklevel=1,
            )
    finally:
        warnings.showwarning = terminal.PYTHON_SHOWWARNING

    assert capsys.readouterr().err == (
        "rlax: warning: checkpoint runs/x/2 cannot be restored (ValueError: bad); moved\n"
    )
