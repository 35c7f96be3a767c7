"""A non-editable install works: the wheel holds rlax.core / rlax.plugins and the entry points."""

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

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """A wheel built (offline, no isolation) from a clean copy of the project."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for name in ("core", "plugins"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
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
