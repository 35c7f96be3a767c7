"""RUN/spec.gin: the run specification the supervisor built, as every child reads it."""

from __future__ import annotations

import os
import re

import pytest

from rlax.core import config
from rlax.core.config.spec_building import SPEC_DIGEST_ENV
from rlax.core.plugins import build_plugin_manager
from rlax.core.runtime.run_dir import RunDir


@pytest.fixture
def plugins():
    pm = build_plugin_manager()
    config.register_core_configurables()
    return pm


def test_a_relative_path_from_the_command_line_names_the_same_file_from_the_run(
    plugins, tmp_path, monkeypatch
):
    """A path given on the command line is the working directory's; spec.gin is read in
    the run's folder, so it is written absolute, and a child building from it elsewhere
    gets the supervisor's run (the same checkpoint, the same digest)."""
    (tmp_path / "models" / "policy").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    config.parse(["quickstart"], ["INIT_CHECKPOINT = 'models/policy'"], plugins=plugins)
    supervisor = config.build_spec(plugins)
    run = RunDir(tmp_path / "runs" / "r")

    path, env = config.save_spec(run)

    text = re.sub(r"\\\n\s*", "", path.read_text())  # gin folds a long line with a backslash
    assert "INIT_CHECKPOINT = " + repr(str(tmp_path / "models" / "policy")) in text
    monkeypatch.chdir(tmp_path / "runs")  # a child's own working directory: irrelevant now
    monkeypatch.setenv(SPEC_DIGEST_ENV, env[SPEC_DIGEST_ENV])
    config.parse([str(path)], [], plugins=plugins)
    child = config.build_spec(plugins)  # refuses if its digest differs from the supervisor's
    assert os.fspath(child.init_checkpoint) == str(tmp_path / "models" / "policy")
    assert os.path.isabs(os.fspath(supervisor.init_checkpoint)) is False  # as typed, until saved
