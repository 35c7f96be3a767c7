"""Packaged configs found by name: experiments by their bare name, the other layers by
theirs where it is free or by FOLDER/NAME, and a name two folders hold is an error."""

from __future__ import annotations

import pathlib

import gin
import pytest

from rlax.core import config
from rlax.core.config import finder
from rlax.core.errors import ConfigError
from rlax.core.plugins import build_plugin_manager

# Every name of the flat configs/ folder before the layers, and the folder it lives in now.
FLAT_NAMES = {
    "quickstart": "experiments",
    "cispo": "experiments",
    "dapo": "experiments",
    "distill": "experiments",
    "drgrpo": "experiments",
    "gspo": "experiments",
    "ppo": "experiments",
    "reinforcepp": "experiments",
    "reinforcepp_baseline": "experiments",
    "rloo": "experiments",
    "gsm8k_tiny": "experiments",
    "multiturn_quickstart": "experiments",
    "smollm2_arithmetic": "experiments",
    "smollm2_tools": "experiments",
    "curate_gsm8k_tiny": "experiments",
    "roles": "base",
    "grpo": "algorithms",
    "arithmetic": "tasks",
    "quickstart_base": "models",
}


def write(path: pathlib.Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.fixture
def fake_configs(tmp_path, monkeypatch) -> pathlib.Path:
    """A configs folder where ``x`` is both a task and a model, and ``dapo`` an experiment
    and an algorithm."""
    folder = tmp_path / "configs"
    for name in ("experiments/dapo", "algorithms/dapo", "tasks/x", "models/x", "base/roles"):
        write(folder / f"{name}.gin", "")
    monkeypatch.setattr(finder, "_configs_folder", lambda: folder)
    monkeypatch.chdir(tmp_path)
    return folder


def test_every_packaged_name_finds_its_file_and_every_file_has_one_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    packaged = config.packaged_configs()
    folder = pathlib.Path(finder._configs_folder())
    files = sorted(p for layer in finder.CONFIG_LAYERS for p in (folder / layer).glob("*.gin"))

    assert sorted(packaged.values()) == files and len(files) >= 30
    for name, path in packaged.items():
        assert config.find_gin_file(name) == str(path)
        assert config.find_gin_file(f"{name}.gin") == str(path)
        assert config.find_gin_file(f"{path.parent.name}/{path.stem}") == str(path)


@pytest.mark.parametrize("name", sorted(FLAT_NAMES))
def test_every_name_of_the_flat_configs_folder_still_finds_its_file(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    path = pathlib.Path(config.find_gin_file(name))

    assert (path.parent.name, path.name) == (FLAT_NAMES[name], f"{name}.gin")


def test_an_experiment_has_its_bare_name_and_a_folder_names_the_other_file(fake_configs):
    assert config.find_gin_file("dapo") == str(fake_configs / "experiments" / "dapo.gin")
    assert config.find_gin_file("algorithms/dapo") == str(fake_configs / "algorithms/dapo.gin")
    assert config.find_gin_file("roles") == str(fake_configs / "base" / "roles.gin")
    assert list(config.packaged_configs()) == [
        "dapo",
        "roles",
        "algorithms/dapo",
        "tasks/x",
        "models/x",
    ]


def test_a_name_two_folders_other_than_experiments_hold_is_an_error_naming_both(fake_configs):
    with pytest.raises(ConfigError) as info:
        config.find_gin_file("x")

    assert str(info.value) == (
        "x: ambiguous packaged config name, give its folder: tasks/x or models/x "
        "(packaged: dapo, roles, algorithms/dapo, tasks/x, models/x)"
    )
    assert config.find_gin_file("models/x.gin") == str(fake_configs / "models" / "x.gin")


@pytest.mark.parametrize("name", ["nope", "tasks/dapo", "nope/x", "../configs/tasks/x", "tasks/"])
def test_an_unknown_name_is_one_line_that_lists_the_packaged_names(fake_configs, name):
    assert finder.find_packaged(name) is None
    with pytest.raises(ConfigError) as info:
        config.find_gin_file(name)

    assert str(info.value) == (
        f"{name}: no such gin file, nor a packaged config of that name "
        "(packaged: dapo, roles, algorithms/dapo, tasks/x, models/x)"
    )


@pytest.fixture
def pm():
    manager = build_plugin_manager()
    config.register_core_configurables()
    yield manager
    gin.clear_config()


def test_a_file_of_your_own_includes_the_layers_by_folder_and_name(tmp_path, monkeypatch, pm):
    monkeypatch.chdir(tmp_path)
    mine = write(
        tmp_path / "mine.gin",
        "include 'base/roles.gin'\ninclude 'base/optimizer.gin'\n"
        "include 'algorithms/ppo.gin'\ninclude 'tasks/gsm8k_tiny.gin'\n"
        "LEARNING_RATE = 1e-4\nINIT_CHECKPOINT = '/a/model'\n",
    )

    config.parse([mine], plugins=pm)

    assert gin.query_parameter("rlax.train.algorithm").selector == "algorithms.ppo"
    assert gin.query_parameter("TASK/gin.macro.value").selector == "tasks.dataset"
    files = gin.query_parameter("tasks.dataset.train_files")
    assert [pathlib.Path(f).is_file() for f in files] == [True]  # relative to tasks/


def test_a_file_written_before_the_layers_still_gets_grpo_and_its_optimiser(tmp_path, pm):
    """``include 'grpo.gin'`` still brings the optimiser, as the flat grpo.gin did."""
    mine = write(
        tmp_path / "mine.gin",
        "include 'roles.gin'\ninclude 'grpo.gin'\ninclude 'arithmetic.gin'\n"
        "include 'quickstart_base.gin'\nLEARNING_RATE = 1e-4\n",
    )

    config.parse([mine], plugins=pm)

    assert gin.query_parameter("rlax.train.algorithm").selector == "algorithms.grpo"
    assert gin.query_parameter("rlax.train.optimizer").selector == "rlax.clipped_optimizer"
    assert gin.query_parameter("optax.linear_schedule.end_value").selector == "gin.macro"
