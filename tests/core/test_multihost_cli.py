"""`rlax run --role trainer` joins the trainer processes before the trainer runs.

JAX's multi-process runtime must start before anything touches a device. gin
builds the run specification (the sampler, the task, ...: none touches a device
until a role sets it up); the CLI checks it whole, then reads
``spec.train.distributed`` (or the ``RLAX_*`` environment) and initializes before
``train(spec)`` is called. Asked for two processes without a coordinator, it
refuses as a configuration error before the trainer is ever called.
"""

from __future__ import annotations

import pathlib

import gin
import jax
import pytest

from rlax.core import cli
from rlax.core.trainer import role as experiment

ROOT = pathlib.Path(__file__).resolve().parents[2]
GIN = ["--gin", str(ROOT / "configs/experiments/quickstart.gin")]


@pytest.fixture(autouse=True)
def fresh_gin(monkeypatch):
    for var in (
        "RLAX_COORDINATOR",
        "RLAX_NUM_PROCESSES",
        "RLAX_PROCESS_ID",
        "JOB_COMPLETION_INDEX",
    ):
        monkeypatch.delenv(var, raising=False)
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture
def train_calls(monkeypatch):
    calls = []

    def train(spec, **kwargs):
        calls.append((spec, kwargs))
        return 0

    monkeypatch.setattr(experiment, "train", train)  # the CLI calls train(spec, ...)
    return calls


def test_gin_distributed_settings_are_applied_before_the_trainer_is_built(train_calls, capsys):
    status = cli.main(
        [
            "run",
            *GIN,
            "--role",
            "trainer",
            "--gin.rlax.train.distributed=@rlax.distributed()",
            "--gin.rlax.distributed.num_processes=2",
        ]
    )
    assert status == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "rlax.train.distributed" in err and "coordinator" in err
    assert train_calls == []  # refused before the trainer was called


def test_the_environment_alone_asks_for_several_processes(train_calls, monkeypatch, capsys):
    monkeypatch.setenv("RLAX_NUM_PROCESSES", "2")
    assert cli.main(["run", *GIN, "--role", "trainer"]) == cli.EXIT_USAGE
    assert "RLAX_COORDINATOR" in capsys.readouterr().err
    assert train_calls == []


def test_one_process_starts_no_distributed_runtime(train_calls):
    assert cli.main(["run", *GIN, "--role", "trainer"]) == cli.EXIT_OK
    assert len(train_calls) == 1 and not jax.distributed.is_initialized()


def test_several_processes_with_a_server_that_keeps_no_weights_are_refused(train_calls, capsys):
    # A restarted server would wait for weights only a one-process trainer publishes again.
    status = cli.main(
        [
            "run",
            *GIN,
            "--role",
            "trainer",
            "--gin.rlax.train.distributed=@rlax.distributed()",
            "--gin.rlax.distributed.num_processes=2",
            "--gin.rlax.param_server.saved_weights=0",
        ]
    )
    assert status == cli.EXIT_USAGE
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith(
        "rlax.param_server.saved_weights = 0 needs a one-process trainer, this one has 2: "
        "after a server restart only one process publishes its weights again; "
        "keep saved_weights >= 1"
    )
    assert train_calls == []


def test_one_process_may_keep_no_weights(train_calls):
    status = cli.main(["run", *GIN, "--role", "trainer", "--gin.rlax.param_server.saved_weights=0"])
    assert status == cli.EXIT_OK and len(train_calls) == 1
    ((spec, _),) = train_calls
    assert spec.param_server.saved_weights == 0
