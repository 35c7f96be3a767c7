"""A restarted role compiles nothing its previous incarnation compiled (issue 38, item 3).

The role's JAX work runs in processes of its own (``compile_cache_role.py``): the
first incarnation against an empty run directory, the restart against the cache the
first one filled, and a role of another jaxlib release against the same cache.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from rlax.core.errors import ConfigError
from rlax.core.runtime import compile_cache
from rlax.core.runtime.compile_cache import CompileCacheSettings
from rlax.core.runtime.run_dir import RunDir

ROLE = pathlib.Path(__file__).with_name("compile_cache_role.py")


def _role(run: pathlib.Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [sys.executable, str(ROLE), str(run), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _report(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_a_restarted_role_reads_every_program_back_and_compiles_none(tmp_path):
    run = RunDir(tmp_path)
    first = _report(_role(tmp_path))
    restarts = _role(tmp_path), _role(tmp_path, "other-jaxlib")  # at once: they share it
    again, other = (_report(p) for p in restarts)

    assert first["cache"] == again["cache"] == str(run.compile_cache)
    # The first incarnation compiled every program it asked for and wrote each one.
    assert first["misses"] == first["requests"] > 0 and first["hits"] == 0
    # The restart compiled nothing: the train step came back whole (its steps traced
    # nothing), every other program the first one compiled it read back from the cache.
    assert first["loaded"] == 0 and first["steps_traced"] > 0
    assert again["loaded"] == 1 and again["steps_traced"] == 0
    assert again["requests"] == first["requests"] - again["loaded"]
    assert again["hits"] == first["misses"] - again["loaded"] and again["misses"] == 0
    assert again["losses"] == first["losses"]  # the same programs, the same numbers
    # Another jaxlib never reads the entries of this one: it compiles and adds its own.
    assert other["hits"] == 0 and other["misses"] == other["requests"] > 0
    entries = list(run.compile_cache.glob("*-cache"))
    assert len(entries) == first["misses"] + other["misses"]


def test_where_the_cache_lives(tmp_path, monkeypatch):
    run = RunDir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert CompileCacheSettings().directory(run) == tmp_path / "compile_cache"
    assert CompileCacheSettings().directory(None) is None  # no run: no cache
    assert CompileCacheSettings(path="~/jax").directory(run) == tmp_path / "home" / "jax"
    assert CompileCacheSettings(path="/c").directory(None) == pathlib.Path("/c")
    for off in ("", False):
        assert CompileCacheSettings(path=off).directory(run) is None


def test_a_trainer_without_a_run_directory_starts_the_cache_in_the_one_it_makes(
    tmp_path, monkeypatch
):
    turned_on: list[tuple[pathlib.Path, float]] = []
    monkeypatch.setattr(compile_cache, "_turn_on", lambda *a: turned_on.append(a))
    monkeypatch.setattr(compile_cache, "_pending", None)
    run = RunDir(tmp_path)

    assert compile_cache.start(CompileCacheSettings(min_compile_time_s=2.0), None) is None
    assert turned_on == []  # nothing yet: it waits for the run directory
    assert compile_cache.start_in_run(run) == run.compile_cache
    assert turned_on == [(run.compile_cache, 2.0)]
    assert compile_cache.start_in_run(run) is None  # once

    compile_cache.start(CompileCacheSettings(path=False), None)
    assert compile_cache.start_in_run(run) is None and len(turned_on) == 1  # off stays off
    compile_cache.start(CompileCacheSettings(path=str(tmp_path / "c")), None)
    assert turned_on[-1] == (tmp_path / "c", 0.0) and compile_cache.start_in_run(run) is None


def test_a_negative_minimum_compile_time_is_refused():
    with pytest.raises(ConfigError, match="must be >= 0 .0: every program., got -1.0"):
        CompileCacheSettings(min_compile_time_s=-1.0)


# -- the command: which processes turn it on, and what a refused role leaves ---------------


def _jit_something() -> None:
    import jax
    import jax.numpy as jnp

    jax.jit(lambda x: x * 3 + 1)(jnp.arange(5.0)).block_until_ready()


@pytest.fixture
def roles(site, monkeypatch, tmp_path):
    """Replaces the trainer, the worker and the local cluster: each records the JAX cache
    folder it ran with (None: none), compiles a program and returns 0, or refuses its
    settings (a ConfigError) when the run's seed is 2."""
    import jax

    from rlax.core.launch import local_cluster
    from rlax.core.trainer import role as trainer_role
    from rlax.core.worker import role as worker_role

    seen: dict[str, str | None] = {}

    def fake(name: str):
        def role(spec, **_):
            seen[name] = jax.config.jax_compilation_cache_dir
            _jit_something()
            if spec.seed == 2:  # the test's way of asking the role to refuse
                raise ConfigError(f"{name} refused")
            return 0

        return role

    monkeypatch.setattr(trainer_role, "train", fake("train"))
    monkeypatch.setattr(worker_role, "worker", fake("worker"))
    monkeypatch.setattr(local_cluster, "local_cluster", fake("local_cluster"))
    monkeypatch.chdir(tmp_path)
    site.install_run_components()
    site.run_gin(tmp_path)  # exp.gin: a run of components that load nothing
    return seen


@pytest.mark.parametrize(("role", "name"), [("inline", "train"), ("worker", "worker")])
def test_a_role_compiles_with_the_run_s_cache_and_only_while_it_runs(roles, tmp_path, role, name):
    import jax

    from rlax.core import cli

    status = cli.main(["run", "--gin", "exp.gin", "--role", role, "--run-dir", "run"])

    assert status == 0
    assert roles[name] == str(tmp_path / "run" / "compile_cache")
    assert len(list((tmp_path / "run" / "compile_cache").glob("*-cache"))) > 0
    assert jax.config.jax_compilation_cache_dir is None  # off again once the command returned


def test_the_supervisor_never_turns_it_on(roles):
    from rlax.core import cli

    assert cli.main(["run", "--gin", "exp.gin", "--run-dir", "run"]) == 0
    assert roles["local_cluster"] is None  # its children do, with --run-dir


def test_a_role_refused_after_it_compiled_leaves_no_cache_folder(roles, tmp_path):
    from rlax.core import cli

    args = ["run", "--gin", "exp.gin", "--role", "inline", "--run-dir", "run"]
    assert cli.main([*args, "--gin.SEED=2"]) == 2
    assert roles["train"] == str(tmp_path / "run" / "compile_cache")
    assert not (tmp_path / "run" / "compile_cache").exists()
    # A cache that was there before stays (another role's, or an earlier incarnation's).
    assert cli.main(args) == 0
    before = sorted((tmp_path / "run" / "compile_cache").iterdir())
    assert cli.main([*args, "--gin.SEED=2"]) == 2
    assert sorted((tmp_path / "run" / "compile_cache").iterdir()) == before


def test_compile_cache_false_turns_it_off(roles, tmp_path):
    from rlax.core import cli

    args = ["run", "--gin", "exp.gin", "--role", "worker", "--run-dir", "run"]
    assert cli.main([*args, "--gin.rlax.compile_cache.path=False"]) == 0
    assert roles["worker"] is None and not (tmp_path / "run").exists()


def test_a_process_that_compiled_before_the_cache_was_turned_on_still_writes_it(tmp_path):
    # JAX decides at a process's first compilation whether it uses a cache; a trainer that
    # compiled while loading its policy, before it made its run directory, must still get one.
    import jax
    import jax.numpy as jnp

    from rlax.core.runtime import compile_cache
    from rlax.core.runtime.run_dir import RunDir

    jax.jit(lambda x: x * 5.5 - 2.25)(jnp.arange(3.0)).block_until_ready()  # no cache yet
    run = RunDir(tmp_path / "run")
    with compile_cache.session():
        assert compile_cache.start(compile_cache.CompileCacheSettings(), run) == (
            run.compile_cache.absolute()
        )
        jax.jit(lambda x: x * 7.5 - 4.25)(jnp.arange(3.0)).block_until_ready()

    assert len(list(run.compile_cache.glob("*-cache"))) == 1
    assert jax.config.jax_compilation_cache_dir is None
