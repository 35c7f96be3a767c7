"""A non-editable install works: the wheel holds every package of the tree, the configs,
the quickstart's base policy and the entry points, and trains from outside the clone."""

from __future__ import annotations

import configparser
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

import pytest
from cli_runs import SMALL_SIZES

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """A wheel built (offline, no isolation) from a clean copy of the project."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for name in ("core", "plugins", "configs", "assets"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--wheel-dir",
            str(work / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    (built,) = (work / "dist").glob("rlax_llm-*.whl")
    return built


def test_wheel_holds_the_rlax_namespace_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()

    for expected in (
        "rlax/core/__init__.py",
        "rlax/core/hookspecs.py",
        "rlax/core/plugins.py",
        "rlax/core/cli.py",
        "rlax/plugins/__init__.py",
        "rlax/plugins/algorithms/__init__.py",
        "rlax/plugins/rewards/__init__.py",
    ):
        assert expected in names
    top_level = {name.split("/")[0] for name in names}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"rlax"}
    assert "rlax/__init__.py" not in names  # rlax is a namespace package


def test_wheel_declares_the_entry_points(wheel):
    with zipfile.ZipFile(wheel) as zf:
        (path,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        parser.read_string(zf.read(path).decode())

    assert parser["console_scripts"]["rlax"] == "rlax.core.cli:main"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert dict(parser["rlax"]) == declared["rlax"]
    assert "grpo" in parser["rlax"]  # the built-ins load like third-party plugins


def test_unpacked_wheel_imports_without_the_editable_install(wheel, tmp_path):
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(wheel).extractall(unpacked)
    # -S: no site module, so the editable install's .pth finder is not active;
    # the venv's site-packages is on the path only for the dependencies.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(unpacked), sysconfig.get_paths()["purelib"]]),
    }
    code = (
        "import rlax.core, rlax.core.plugins, rlax.plugins.algorithms\n"
        "print(rlax.core.__file__)\n"
        "print(rlax.plugins.algorithms.__file__)\n"
        "print(rlax.core.plugins.PluginManager().project_name)\n"
    )

    result = subprocess.run(
        [sys.executable, "-S", "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )

    assert result.returncode == 0, result.stderr
    core_file, algorithms_file, project = result.stdout.split()
    assert pathlib.Path(core_file).is_relative_to(unpacked)
    assert pathlib.Path(algorithms_file).is_relative_to(unpacked)
    assert project == "rlax"


def _source_modules() -> list[str]:
    """Every module of the source tree, by the name it installs under."""
    roots = {
        "core": "rlax.core",
        "plugins": "rlax.plugins",
        "configs": "rlax.configs",
        "assets": "rlax.assets",
    }
    names = []
    for folder, package in roots.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            names.append(".".join([package, *(p for p in parts if p != "__init__")]))
    return names


def test_every_folder_of_code_is_a_package_of_the_wheel(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    folders = {
        p.parent
        for root in ("core", "plugins")
        for p in (ROOT / root).rglob("*.py")
        if "__pycache__" not in p.parts
    }

    missing = [
        str(f.relative_to(ROOT))
        for f in sorted(folders)
        if f"rlax/{f.relative_to(ROOT).as_posix()}/__init__.py" not in names
    ]

    assert missing == []
    assert "rlax/core/param_server/server.py" in names  # once left out by a hand-kept list


def test_the_wheel_ships_the_configs_and_the_base_policy(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())

    for config in (ROOT / "configs").rglob("*.gin"):
        assert f"rlax/{config.relative_to(ROOT).as_posix()}" in names
    for path in (ROOT / "assets" / "quickstart-base").rglob("*"):
        if path.is_file():
            assert f"rlax/{path.relative_to(ROOT).as_posix()}" in names


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> pathlib.Path:
    """A fresh virtual environment with the wheel installed (offline); the dependencies are
    this environment's, reached through a path entry (its editable rlax is not)."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # A path entry in a .pth file is added to sys.path, but .pth files inside it are not
    # run: the current environment's editable finder for rlax stays out.
    (pathlib.Path(purelib) / "_rlax_test_deps.pth").write_text(sysconfig.get_paths()["purelib"])
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    return venv


def test_the_installed_wheel_imports_every_module_of_the_tree(installed, tmp_path):
    modules = _source_modules()
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    assert module.__file__.startswith(sys.prefix), (name, module.__file__)\n"
        "print(len(sys.modules))\n"
    )

    result = subprocess.run(
        [installed / "bin" / "python", "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert len(modules) > 90


@pytest.mark.e2e
def test_the_installed_quickstart_trains_from_outside_the_clone(installed, tmp_path):
    """Three steps at the suite's shared sizes (cli_runs.SMALL_SIZES): what is tested is
    that the installed package runs its own config from anywhere, not what it learns."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [
            installed / "bin" / "rlax",
            "run",
            "--gin",
            "quickstart",
            "--gin.rlax.train.steps=3",
            *SMALL_SIZES,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=600,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").glob("quickstart-*")
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 3
    assert (run_dir / "checkpoint" / "model.json").is_file()
    assert not (tmp_path / "assets").exists()  # the base policy came from the package


def test_rlax_version_is_the_distribution_s(installed):
    result = subprocess.run(
        [installed / "bin" / "rlax", "--version"], capture_output=True, text=True, check=True
    )

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert result.stdout.strip() == f"rlax {declared}"
