"""Bad input, as a new user types it: one line, exit status 2, within seconds, nothing left behind.

Each case runs the command line's entry point (``rlax.core.cli.main``) in a fresh
working directory, the way the README's quickstart is run, and checks:

- exit status 2 and one line on stderr, ``rlax: error: ...``, that says what
  is wrong and names the binding or file it came from (only ``rlax: warning:``
  lines may come before it: the malformed rows a task skipped);
- no traceback anywhere in the output;
- it took seconds (before any evaluation or training), not minutes;
- nothing was left behind: no run directory, or the run's files unchanged.

The entry point runs in this process (what a case checks is the command's
logic, not the interpreter's start); stderr is read at the file descriptor, so
the lines of any process it starts count too. What only a real process shows
is checked through one: the exit status a shell sees, warnings in rlax's format
on a process's stderr, and a port another process holds.
"""

from __future__ import annotations

import json
import logging
import pathlib
import socket
import subprocess
import sys
import time

import pytest
from cli_runs import CLUSTER_STEPS, NO_CURVES, rlax_process

ROOT = pathlib.Path(__file__).resolve().parents[1]
SECONDS = 60  # generous for a loaded 2-core machine; each case takes a few seconds quietly
FAST = [
    "--gin.rlax.train.progress=False",
    NO_CURVES,
    "--gin.tasks.arithmetic.num_eval=16",
    "--gin.EVAL_SAMPLES=2",
    "--gin.EVAL_KS=(1, 2)",
]


def rlax(*args: str, cwd: pathlib.Path, env: dict[str, str] | None = None):
    """``python -m rlax.core.cli ARGS`` as a process: (its result, seconds)."""
    start = time.monotonic()
    result = rlax_process(*args, cwd=cwd, env=env)
    return result, time.monotonic() - start


@pytest.fixture
def rlax_main(monkeypatch, capfd):
    """``rlax ARGS`` through the entry point in this process: (a CompletedProcess of what it
    printed and returned, seconds). Its working directory and environment are set for the call only; its log
    records reach stderr in rlax's format, as a process's do (``terminal.Lines``)."""
    import gin

    from rlax.core import cli
    from rlax.core.runtime import terminal

    def call(*args: str, cwd: pathlib.Path, env: dict[str, str] | None = None):
        with monkeypatch.context() as patch:
            patch.chdir(cwd)
            for name, value in (env or {}).items():
                patch.setenv(name, value)
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(terminal.Lines())
            logging.root.addHandler(handler)
            capfd.readouterr()
            start = time.monotonic()
            try:
                status = cli.main(list(args))
            finally:
                logging.root.removeHandler(handler)
                gin.clear_config()
            seconds = time.monotonic() - start
            out, err = capfd.readouterr()
        return subprocess.CompletedProcess(list(args), status, out, err), seconds

    return call


def write(path: pathlib.Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def dataset_gin(tmp: pathlib.Path, *, train: str, test: str, on_malformed: str) -> str:
    """The quickstart with a dataset task whose rows the base policy's tokenizer can encode."""
    write(tmp / "data" / "train.jsonl", train)
    write(tmp / "data" / "test.jsonl", test)
    return write(
        tmp / "dataset.gin",
        f"""
include 'quickstart.gin'
TASK = @tasks.dataset()
tasks.dataset.train_files = ['data/train.jsonl']
tasks.dataset.eval_files = ['data/test.jsonl']
tasks.dataset.template = '{{question}}'
tasks.dataset.on_malformed = '{on_malformed}'
""",
    )


GOOD_ROWS = '{"question": "1+2=", "answer": "3"}\n{"question": "4+4=", "answer": "8"}\n'


def case_malformed_row_is_an_error(tmp):
    gin_file = dataset_gin(
        tmp, train=GOOD_ROWS + "{not json\n", test=GOOD_ROWS, on_malformed="error"
    )
    return ["run", "--gin", gin_file, *FAST], "rlax.run.task: train split: "


def case_every_eval_row_malformed(tmp):
    gin_file = dataset_gin(
        tmp, train=GOOD_ROWS, test='{"question": "1+2="}\n{broken\n', on_malformed="skip"
    )
    return ["run", "--gin", gin_file, *FAST], (
        "rlax.run.task: eval split: no prompts (were all of its rows malformed?)"
    )


def test_the_rows_a_task_skips_are_warned_one_line_each(tmp_path):
    gin_file = dataset_gin(
        tmp_path, train=GOOD_ROWS, test='{"question": "1+2="}\n{broken\n', on_malformed="skip"
    )

    result, _ = rlax("run", "--gin", gin_file, "--role", "inline", *FAST, cwd=tmp_path)

    test_file = tmp_path / "data" / "test.jsonl"
    assert result.stderr.splitlines() == [
        (
            f"rlax: warning: tasks.dataset: skipping malformed row: {test_file} row 1: "
            "invalid JSON: Expecting property name enclosed in double quotes"
        ),
        (
            f"rlax: warning: tasks.dataset: skipping malformed row: {test_file} row 0: "
            "missing field 'answer'"
        ),
        "rlax: error: rlax.run.task: eval split: no prompts (were all of its rows malformed?)",
    ]


def case_param_server_without_a_token(tmp):
    return (
        ["run", "--gin", "quickstart", "--role", "param_server"],
        "--role param_server: parameter server: no token; set RLAX_PS_TOKEN",
    )


def case_resuming_garbage(tmp):
    run = tmp / "runs" / "garbage"
    (run / "train_state" / "5" / "state").mkdir(parents=True)
    (run / "train_state" / "5" / "state" / "data").write_bytes(bytes(range(256)))
    (run / "operative_config.gin").write_bytes(b"\x00\xff not a config \xfe")
    return (
        ["run", "--gin", "quickstart", "--role", "inline", "--resume", str(run), *FAST],
        (f"{run / 'train_state'}: no checkpoint can be restored (the newest, step 5: "),
    )


def case_model_without_its_tokenizer(tmp):
    meta = json.loads((ROOT / "assets" / "quickstart-base" / "model.json").read_text())
    del meta["tokenizer"]
    model = tmp / "model"
    write(model / "model.json", json.dumps(meta))
    return (
        ["eval", "--gin", "quickstart", "--checkpoint", str(model), *FAST],
        (
            f"--checkpoint: {model / 'model.json'}: no 'tokenizer': not a complete rlax model "
            "(its model.json holds the format, the config and the tokenizer)"
        ),
    )


def case_gin_file_not_utf8(tmp):
    gin_file = tmp / "latin1.gin"
    gin_file.write_bytes("include 'quickstart.gin'\n# caf\u00e9 au lait\n".encode("latin-1"))
    return (
        ["run", "--gin", str(gin_file)],
        f"{gin_file}:2: not UTF-8 text (byte 0xe9 at column 6)",
    )


def case_dataset_template_without_a_column(tmp):
    gin_file = dataset_gin(tmp, train=GOOD_ROWS, test=GOOD_ROWS, on_malformed="skip")
    return (
        ["run", "--gin", gin_file, "--gin.tasks.dataset.template='Question:'"],
        (
            "--gin.tasks.dataset.template='Question:': tasks.dataset.template: 'Question:' "
            "shows no column (e.g. '{question}')"
        ),
    )


CASES = {
    "a string for an int": (
        ["run", "--gin", "quickstart", "--gin.rlax.train.steps='five'"],
        "--gin.rlax.train.steps='five': rlax.train.steps: expected int, got str",
    ),
    "a string for a float": (
        ["run", "--gin", "quickstart", "--gin.samplers.jax.temperature='hot'"],
        "samplers.jax.temperature: expected float, got str",
    ),
    "a string for a macro's number": (
        ["run", "--gin", "quickstart", "--gin.LEARNING_RATE='fast'"],
        (
            "--gin.LEARNING_RATE='fast': optax.linear_schedule.end_value (via %LEARNING_RATE): "
            "expected bool, int, float or complex, got str"
        ),
    ),
    "a bare word": (
        ["run", "--gin", "quickstart", "--gin.rlax.train.steps=five"],
        "--gin.rlax.train.steps=five: syntax error: five is not a value",
    ),
    "pass@k beyond the samples": (
        ["run", "--gin", "quickstart", "--gin.EVAL_KS=(1, 32)"],
        (
            "--gin.EVAL_KS=(1, 32): rlax.held_out.ks: pass@k needs 1 <= k <= the samples per problem (16); "
            "got k = 32"
        ),
    ),
    "a misspelt parameter": (
        ["run", "--gin", "quickstart", "--gin.rlax.train.stpes=5"],
        "rlax.train has no parameter 'stpes'; did you mean 'steps'?",
    ),
    "a misspelt config": (
        ["run", "--gin", "quikstart"],
        "quikstart: no such gin file, nor a packaged config of that name",
    ),
    "blocking a plugin that is not there": (
        ["run", "--gin", "quickstart", "-p", "no:grpoo"],
        "-p no:grpoo: no installed plugin is named 'grpoo'; did you mean 'grpo'",
    ),
    "one role's reward alone": (
        ["run", "--gin", "quickstart", "--gin.rlax.train.reward=@rewards.length()"],
        (
            "--gin.rlax.train.reward=@rewards.length(): rlax.train.reward is the run's now, one "
            "value for every role: bind rlax.run.reward instead (configs/base/roles.gin)"
        ),
    ),
    "a required value left unset": (["run", "--gin", "roles"], "TASK is required ("),
    "a malformed row under on_malformed='error'": case_malformed_row_is_an_error,
    "an evaluation set of malformed rows": case_every_eval_row_malformed,
    "a parameter server without a token": case_param_server_without_a_token,
    "a negative number of saved weight versions": (
        [
            "run",
            "--gin",
            "quickstart",
            "--role",
            "param_server",
            "--gin.rlax.param_server.saved_weights=-1",
        ],
        "rlax.param_server.saved_weights: must be >= 0 (0: save none), got -1",
    ),
    "--resume with no run of that name": (
        ["run", "--gin", "quickstart", "--resume"],
        "--resume: no run named 'quickstart' in runs/",
    ),
    "--resume of a directory that is not there": (
        ["run", "--gin", "quickstart", "--resume", "nope"],
        "--resume nope: no such run directory",
    ),
    "--resume of a directory that holds no run": (
        ["run", "--gin", "quickstart", "--resume", "."],
        "--resume .: not a run directory (no operative_config.gin or train_state/)",
    ),
    "a negative evaluation period": (
        ["run", "--gin", "quickstart", "--gin.rlax.watch.eval_every=-1"],
        ("--gin.rlax.watch.eval_every=-1: rlax.watch.eval_every: must be >= 0 (0: never), got -1"),
    ),
    "no group to trace": (
        ["run", "--gin", "quickstart", "--gin.rlax.watch.trace_groups=0"],
        "rlax.watch.trace_groups: must be >= 1, got 0",
    ),
    "a string for a trace period": (
        ["run", "--gin", "quickstart", "--gin.rlax.watch.trace_every='often'"],
        "rlax.watch.trace_every: expected int, got str",
    ),
    "no checkpoint kept": (
        ["run", "--gin", "quickstart", "--gin.rlax.checkpointing.keep=0"],
        "--gin.rlax.checkpointing.keep=0: rlax.checkpointing.keep: must be >= 1, got 0",
    ),
    "a settings object bound but not taken": (
        ["run", "--gin", "quickstart", "--gin.rlax.trainer_settings.microbatches=2"],
        (
            "--gin.rlax.trainer_settings.microbatches=2: rlax.trainer_settings.microbatches is "
            "bound, but rlax.train.trainer_settings is not @rlax.trainer_settings(), so it would "
            "be ignored"
        ),
    ),
    "a misspelt logger": (
        ["run", "--gin", "quickstart", "--gin.rlax.watch.loggers=[@loggers.tensorbord()]"],
        "No loggers plugin is named 'tensorbord'; valid loggers: tensorboard, wandb",
    ),
    "a W&B mode that is none": (
        [
            "run",
            "--gin",
            "quickstart",
            "--gin.rlax.watch.loggers=[@loggers.wandb()]",
            "--gin.loggers.wandb.mode='later'",
            *FAST,
        ],
        "loggers.wandb.mode: one of online, offline, disabled, got 'later'",
    ),
    # The table of issue 36: plausible mistakes, each refused before any role starts.
    "a temperature of 0 for greedy": (
        ["run", "--gin", "quickstart", "--gin.samplers.jax.temperature=0.0"],
        (
            "--gin.samplers.jax.temperature=0.0: samplers.jax.temperature: must be > 0 "
            "(for greedy decoding set method='greedy'), got 0.0"
        ),
    ),
    "a top_p above 1": (
        ["run", "--gin", "quickstart", "--gin.samplers.jax.top_p=1.5"],
        "--gin.samplers.jax.top_p=1.5: samplers.jax.top_p: must be in (0, 1] (1: off), got 1.5",
    ),
    "no new tokens": (
        ["run", "--gin", "quickstart", "--gin.samplers.jax.max_new_tokens=0"],
        "--gin.samplers.jax.max_new_tokens=0: samplers.jax.max_new_tokens: must be >= 1, got 0",
    ),
    "no prompts per step": (
        ["run", "--gin", "quickstart", "--gin.PROMPTS_PER_STEP=0"],
        "(via %PROMPTS_PER_STEP): must be >= 1, got 0",
    ),
    "a negative group size": (
        ["run", "--gin", "quickstart", "--gin.GROUP_SIZE=-4"],
        "(via %GROUP_SIZE): must be >= 1, got -4",
    ),
    "a negative learning rate": (
        ["run", "--gin", "quickstart", "--gin.LEARNING_RATE=-0.001"],
        (
            "--gin.LEARNING_RATE=-0.001: optax.linear_schedule.end_value (via %LEARNING_RATE): "
            "must be >= 0 (a learning rate; below 0 the loss would go up), got -0.001"
        ),
    ),
    "no workers": (
        ["run", "--gin", "quickstart", "--gin.rlax.local_cluster.num_workers=0"],
        (
            "--gin.rlax.local_cluster.num_workers=0: rlax.local_cluster.num_workers: "
            "must be >= 1, got 0"
        ),
    ),
    "an infinite temperature": (
        ["run", "--gin", "quickstart", "--gin.samplers.jax.temperature=1e999"],
        "samplers.jax.temperature: must be a finite number, got inf",
    ),
    # Rules on text, checked as the numbers are: before any role starts.
    "a dataset template that shows no column": case_dataset_template_without_a_column,
    "a format pattern that is not a regular expression": (
        ["run", "--gin", "quickstart", "--gin.rewards.format.pattern='<answer>(.*'"],
        (
            "--gin.rewards.format.pattern='<answer>(.*': rewards.format.pattern: not a regular "
            "expression (missing ), unterminated subpattern at position 8): '<answer>(.*'"
        ),
    ),
    "a format tag that is not a word": (
        ["run", "--gin", "quickstart", "--gin.rewards.format.answer_tag='final answer'"],
        "rewards.format.answer_tag: a tag is a word (letters, digits, _ or -), got 'final answer'",
    ),
    "an arithmetic template without the problem": (
        ["run", "--gin", "quickstart", "--gin.tasks.arithmetic.template='Solve it:'"],
        "tasks.arithmetic.template: 'Solve it:' does not show {problem}",
    ),
    "in-flight reloads of a sampler that cannot do them": (
        ["run", "--gin", "quickstart", "--gin.rlax.worker.reload_in_flight=True"],
        (  # a rule between the run's sampler and the worker's part: checked on the spec
            "rlax.worker.reload_in_flight: JaxSampler is not Resumable (no generate_groups), so "
            "it loads weights between batches only; set it to False"
        ),
    ),
    "resuming a run whose checkpoint and config are garbage": case_resuming_garbage,
    "a model folder without its tokenizer": case_model_without_its_tokenizer,
    "a gin file that is not UTF-8": case_gin_file_not_utf8,
    "eval --out into a missing folder": (
        [
            "eval",
            "--gin",
            "quickstart",
            "--checkpoint",
            str(ROOT / "assets" / "quickstart-base"),
            "--out",
            "missing/eval.json",
        ],
        "--out missing/eval.json: no such directory",
    ),
}


# The run specification checked as a whole before any work (core/spec/checks.py), one row
# list per class of issue 51 item 2: rules between settings, rules a plugin declares
# about its own settings, facts of this machine, and gin's own errors in one line.
WHOLE_SECONDS = 15
PACKED = ["--gin.rlax.train.trainer_settings=@rlax.trainer_settings()"]
SPEC_CLASSES: dict[str, dict[str, object]] = {
    "between settings": {
        "packed rows shorter than the longest sequence": (
            ["run", "--gin", "quickstart", *PACKED, "--gin.rlax.trainer_settings.row_tokens=6"],
            "rlax.trainer_settings.row_tokens: 6 is shorter than the longest sequence",
        ),
        "a deterministic run that trains on stale groups": (
            ["run", "--gin", "quickstart", "--gin.rlax.run.deterministic=True"],
            "rlax.run.deterministic needs rlax.run.max_staleness = 0",
        ),
        "in-flight reloads of a sampler that cannot do them": (
            ["run", "--gin", "quickstart", "--gin.rlax.worker.reload_in_flight=True"],
            "rlax.worker.reload_in_flight: JaxSampler is not Resumable",
        ),
        "a sampling budget whose cache outgrows the machine": (
            ["run", "--gin", "quickstart", "--gin.samplers.jax.max_new_tokens=50000000"],
            "rlax.run.sampler: its cache for",
        ),
        "a reference left uncalled": (
            ["run", "--gin", "quickstart", "--gin.rlax.train.algorithm=@algorithms.grpo"],
            "rlax.train.algorithm: got the factory grpo itself",
        ),
    },
    "a plugin's own rules": {
        "an agent asking for a model the endpoint does not serve": (
            ["run", "--gin", "agents_quickstart", "--gin.samplers.agents.model='gpt-4o'"],
            (
                "samplers.agents.model: the endpoint serves 'gpt-4o' but the agent asks for "
                "'rlax-policy'"
            ),
        ),
        "a chat template that cannot render a conversation": (
            [
                "run",
                "--gin",
                "agents_quickstart",
                "--gin.samplers.agents.chat_template='{{ messages[0].nope() }}'",
            ],
            "samplers.agents.chat_template: cannot render a conversation",
        ),
        "a chat template that drops what was said": (
            ["run", "--gin", "agents_quickstart", "--gin.samplers.agents.chat_template='x'"],
            "samplers.agents.chat_template: the chat template drops the messages' content",
        ),
        "a third-party component's check_run": lambda tmp: (
            [
                "run",
                "--gin",
                "quickstart",
                "-p",
                plugin_with_a_rule(tmp),
                "--gin.REWARD=@rewards.picky()",
            ],
            "rewards.picky.threshold: 0.5 needs a group size of at least 16, got 8",
        ),
    },
    "facts of this machine": {
        "a compile cache that is a file": lambda tmp: (
            [
                "run",
                "--gin",
                "quickstart",
                f"--gin.rlax.compile_cache.path='{write(tmp / 'cache', 'x')}'",
            ],
            "rlax.compile_cache.path: ",
        ),
        "a run root that is a file": lambda tmp: (
            [
                "run",
                "--gin",
                "quickstart",
                f"--gin.rlax.train.run_root='{write(tmp / 'root', 'x')}'",
            ],
            "rlax.train.run_root: ",
        ),
        "a core that does not exist": (
            ["run", "--gin", "quickstart", "--gin.rlax.placement.worker_cores=(4096,)"],
            "rlax.placement.worker_cores: ",
        ),
        "a starting checkpoint that is not there": (
            ["run", "--gin", "quickstart", "--gin.INIT_CHECKPOINT='no/such/model'"],
            "rlax.run.init_checkpoint: 'no/such/model': no such file or folder",
        ),
        "an unknown weight lane": (
            [
                "run",
                "--gin",
                "quickstart",
                "--gin.rlax.ps_settings.weight_lanes=['carrier_pigeon']",
            ],
            "unknown weight lane 'carrier_pigeon'",
        ),
    },
    "gin's own errors": {
        "an undefined macro": (
            ["run", "--gin", "quickstart", "--gin.rlax.train.steps=%STEPS"],
            "%STEPS is used but never set",
        ),
        "a missing include": lambda tmp: (
            [
                "run",
                "--gin",
                write(tmp / "mine.gin", "include 'quickstart.gin'\ninclude 'nope.gin'\n"),
            ],
            "mine.gin:2: include 'nope.gin': no such file",
        ),
        "a moved role binding": (
            ["run", "--gin", "quickstart", "--gin.rlax.worker.reward=@rewards.length()"],
            "rlax.worker.reward is the run's now, one value for every role: bind rlax.run.reward",
        ),
    },
}

PICKY_REWARD = """
from rlax.core import hookimpl
from rlax.core.errors import BadSetting


class PickyReward:
    # A rule about its own setting that only the whole run can check.
    def __init__(self, *, threshold: float = 0.5):
        self.threshold = threshold

    def check_run(self, spec):
        if spec.group_size < 16:
            raise BadSetting(
                "threshold", f"{self.threshold} needs a group size of at least 16, "
                f"got {spec.group_size}"
            )

    def score(self, prompt, completion):
        return 0.0


@hookimpl
def rlax_register_rewards():
    return {"picky": PickyReward}
"""


def plugin_with_a_rule(tmp: pathlib.Path) -> str:
    """A plugin module beside ``tmp`` (importable from it) whose reward declares a rule."""
    write(tmp.parent / f"{tmp.name}-plugins" / "picky_reward.py", PICKY_REWARD)
    return "picky_reward"


@pytest.mark.parametrize(
    ("klass", "name"), [(k, n) for k, rows in SPEC_CLASSES.items() for n in rows]
)
def test_the_whole_spec_is_checked_before_anything_starts(
    klass, name, tmp_path, rlax_main, monkeypatch
):
    """Each class of whole-run rule: exit 2 and one line naming the setting, in seconds,
    before a run directory or any process exists."""
    monkeypatch.syspath_prepend(str(tmp_path.parent / f"{tmp_path.name}-plugins"))
    case = SPEC_CLASSES[klass][name]
    args, expected = case(tmp_path) if callable(case) else case
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    result, seconds = rlax_main(*args, cwd=tmp_path)

    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    *warned, error = result.stderr.splitlines()
    assert error.startswith("rlax: error: ") and expected in error, result.stderr
    # Before it only rlax's own warnings, one line each (e.g. host malloc after a JAX start).
    assert all(line.startswith("rlax: warning: ") for line in warned), result.stderr
    assert seconds < WHOLE_SECONDS
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_every_class_of_whole_run_rule_has_at_least_two_rows():
    assert len(SPEC_CLASSES) == 4
    assert all(len(rows) >= 2 for rows in SPEC_CLASSES.values())


def check_one_case(name: str, tmp_path: pathlib.Path, run) -> None:
    case = CASES[name]
    args, expected = case(tmp_path) if callable(case) else case
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    env = {"RLAX_PS_TOKEN": ""} if "param_server" in args else None

    result, seconds = run(*args, cwd=tmp_path, env=env)

    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    *warned, error = result.stderr.splitlines()
    assert error.startswith("rlax: error: ")
    assert expected in error
    # The error is one line; before it only rlax's own warnings, one line each.
    assert all(line.startswith("rlax: warning: ") for line in warned), result.stderr
    assert seconds < SECONDS
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2_in_seconds_and_leaves_nothing(name, tmp_path, rlax_main):
    check_one_case(name, tmp_path, rlax_main)


@pytest.mark.parametrize(
    "name", ["a string for an int", "a misspelt config", "a parameter server without a token"]
)
def test_a_real_process_exits_2_with_the_same_one_line(name, tmp_path):
    """The status a shell sees: rejected before (the parser), while (gin) and after
    (a role's own check) the configuration is read."""
    check_one_case(name, tmp_path, rlax)


def test_a_busy_port_for_the_parameter_server_is_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        result, _ = rlax(
            "run",
            "--gin",
            "quickstart",
            "--role",
            "param_server",
            cwd=tmp_path,
            env={"RLAX_PS_TOKEN": "t", "RLAX_PS_ADDRESS": address},
        )

    assert result.returncode == 2
    assert result.stderr == (
        f"rlax: error: rlax.ps_settings.address: cannot listen on {address} "
        "(Address already in use); RLAX_PS_ADDRESS overrides the address\n"
    )


PICKY_TASK = """
from rlax.core import hookimpl


class PickyTask:
    # What only the data shows: no rule on the literal settings can see it.
    def __init__(self, *, rows: str = "rows.txt"):
        with open(rows) as f:
            if not f.read().strip():
                raise ValueError(f"tasks.picky: {rows} holds no rows")


@hookimpl
def rlax_register_tasks():
    return {"picky": PickyTask}
"""


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ("", "tasks.picky: rows.txt holds no rows"),
        (None, "tasks.picky: [Errno 2] No such file or directory: 'rows.txt'"),
    ],
)
def test_a_component_refusing_its_settings_as_it_is_built_is_one_line(
    tmp_path, rlax_main, monkeypatch, rows, expected
):
    """Refused as gin builds the role's components: exit 2, one line naming the
    component, which a supervisor does not restart (a crash would be)."""
    plugins = tmp_path.parent / f"{tmp_path.name}-plugins"
    write(plugins / "picky_task.py", PICKY_TASK)
    monkeypatch.syspath_prepend(str(plugins))
    if rows is not None:
        write(tmp_path / "rows.txt", rows)
    before = sorted(tmp_path.rglob("*"))

    result, seconds = rlax_main(
        "run",
        "--gin",
        "quickstart",
        "-p",
        "picky_task",
        "--role",
        "param_server",
        "--gin.TASK=@tasks.picky()",
        cwd=tmp_path,
        env={"RLAX_PS_TOKEN": "t", "RLAX_PS_ADDRESS": "127.0.0.1:0"},
    )

    assert (result.returncode, result.stderr) == (2, f"rlax: error: {expected}\n")
    assert seconds < SECONDS
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.e2e
def test_a_component_only_the_roles_can_check_ends_the_run_in_one_line(
    tmp_path, rlax_main, monkeypatch
):
    """The roles that build it refuse it as they start (each with exit status 2): no
    process is restarted, the run ends with status 2 and one line however many refused,
    and the run directory made for it is gone."""
    plugins = tmp_path.parent / f"{tmp_path.name}-plugins"
    write(plugins / "picky_task.py", PICKY_TASK)
    monkeypatch.syspath_prepend(str(plugins))
    write(tmp_path / "rows.txt", "")

    result, seconds = rlax_main(
        "run",
        "--gin",
        "quickstart",
        "-p",
        "picky_task",
        "--gin.TASK=@tasks.picky()",
        *FAST,
        cwd=tmp_path,
        env={"PYTHONPATH": str(plugins)},
    )

    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr == "rlax: error: tasks.picky: rows.txt holds no rows\n"
    assert "restarting" not in result.stderr + result.stdout
    assert seconds < SECONDS
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["rows.txt"]


@pytest.mark.e2e
def test_resuming_garbage_with_every_role_is_one_line_and_leaves_the_run_as_it_was(
    tmp_path, rlax_main
):
    """The trainer child refuses it after the parameter server child made its state:
    that state is taken back, and the run's own files are untouched."""
    args, expected = case_resuming_garbage(tmp_path)
    args = [a for a in args if a not in ("--role", "inline")]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    folders = sorted(p for p in tmp_path.rglob("*") if p.is_dir())

    result, seconds = rlax_main(*args, cwd=tmp_path)

    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(f"rlax: error: {expected}")
    assert result.stderr.count("\n") == 1 and "restarting" not in result.stderr + result.stdout
    assert seconds < SECONDS
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert sorted(p for p in tmp_path.rglob("*") if p.is_dir()) == folders


@pytest.mark.e2e
def test_asking_to_start_over_trains_the_garbage_run_again_from_step_0(tmp_path, rlax_main):
    args, _ = case_resuming_garbage(tmp_path)
    run = tmp_path / "runs" / "garbage"

    result, _ = rlax_main(*args, "--start-over", "--gin.rlax.train.steps=1", cwd=tmp_path)

    assert result.returncode == 0, result.stderr[-2000:]
    assert "train_state/5 cannot be restored" in result.stderr  # said once, as a warning
    assert sorted(p.name.split("-")[0] for p in (run / "train_state").iterdir()) == [
        "1",
        "5.corrupt",
    ]
    assert json.loads((run / "eval.json").read_text())["after"]


@pytest.fixture
def cluster_run(cluster_run_sync) -> pathlib.Path:
    """A finished --role all run (shared with the local-cluster tests: read, never changed)."""
    return cluster_run_sync


@pytest.mark.e2e
def test_a_damaged_exported_model_is_one_line_naming_the_file(cluster_run, tmp_path, rlax_main):
    import shutil

    model = tmp_path / "checkpoint"
    shutil.copytree(cluster_run / "checkpoint", model)
    damaged = max(
        (p for p in model.rglob("*") if p.is_file() and p.name != "checksums.json"),
        key=lambda p: p.stat().st_size,
    )
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(
        b ^ 0xFF for b in data[len(data) // 2 :][:64]
    )
    damaged.write_bytes(bytes(data))

    result, seconds = rlax_main(
        "eval", "--gin", "quickstart", "--checkpoint", str(model), *FAST, cwd=tmp_path
    )

    assert result.returncode == 2
    assert result.stderr == (
        f"rlax: error: --checkpoint: {damaged}: checksum mismatch (the file is damaged or was "
        "changed since it was saved)\n"
    )
    assert seconds < SECONDS


@pytest.mark.e2e
def test_resuming_a_cluster_run_inline_is_one_line_and_changes_nothing(cluster_run, rlax_main):
    files = {p: p.stat().st_mtime_ns for p in cluster_run.rglob("*") if p.is_file()}

    result, seconds = rlax_main(
        "run",
        "--gin",
        "quickstart",
        "--role",
        "inline",
        "--resume",
        str(cluster_run),
        *FAST,
        f"--gin.rlax.train.steps={CLUSTER_STEPS + 2}",
        cwd=cluster_run.parent,
    )

    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines()[-1] == (
        f"rlax: error: {cluster_run}: its checkpoint at step {CLUSTER_STEPS} was trained with a parameter "
        "server and workers (--role all, or trainer); resume it the same way"
    )
    assert "Traceback" not in result.stderr
    assert seconds < SECONDS
    assert {p: p.stat().st_mtime_ns for p in cluster_run.rglob("*") if p.is_file()} == files
