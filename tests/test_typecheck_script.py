"""scripts/typecheck.py: the view mypy checks is the tree as installed, and paths come back."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / "scripts" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_view_links_each_installed_package_to_its_folder_and_can_be_rebuilt(tmp_path):
    typecheck = load_script()

    view = typecheck.build_view(tmp_path / "view")
    typecheck.build_view(tmp_path / "view")  # a second run keeps the links as they are

    links = sorted(p.name for p in (view / "rlax").iterdir())
    assert links == ["configs", "core", "plugins"]
    assert not (view / "rlax" / "__init__.py").exists()  # rlax is a namespace package
    for name in links:
        assert (view / "rlax" / name).resolve() == ROOT / name


def test_a_link_left_by_a_clone_elsewhere_is_pointed_back_at_this_tree(tmp_path):
    typecheck = load_script()
    (tmp_path / "view" / "rlax").mkdir(parents=True)
    (tmp_path / "view" / "rlax" / "core").symlink_to(tmp_path, target_is_directory=True)

    view = typecheck.build_view(tmp_path / "view")

    assert (view / "rlax" / "core").resolve() == ROOT / "core"


def test_mypy_s_paths_are_printed_as_the_repository_s():
    typecheck = load_script()
    view = typecheck.VIEW / "rlax"
    prefixes = [f"{view}{os.sep}", f"{view.relative_to(ROOT)}{os.sep}"]
    relative = ".mypy_cache/rlax-view/rlax/core/cli.py:3: error: x  [misc]\n"

    assert typecheck.repository_paths(f"{view}/core/cli.py:3: error: x\n", prefixes) == (
        "core/cli.py:3: error: x\n"
    )
    assert typecheck.repository_paths(relative, prefixes) == "core/cli.py:3: error: x  [misc]\n"
    assert typecheck.repository_paths("Success: no issues\n", prefixes) == "Success: no issues\n"


def test_the_command_checks_both_packages_with_the_repository_s_settings():
    typecheck = load_script()

    command = typecheck.mypy_command(["--no-incremental"])

    assert command[1:3] == ["-m", "mypy"]
    assert command[3:5] == ["--config-file", str(ROOT / "pyproject.toml")]
    assert command[5:] == ["-p", "rlax.core", "-p", "rlax.plugins", "--no-incremental"]


def test_ci_installs_the_checker_and_runs_it_after_the_tests():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    ci = (ROOT / ".ci" / "run").read_text()

    assert any(
        spec.startswith("mypy==") for spec in project["project"]["optional-dependencies"]["test"]
    )
    assert project["tool"]["mypy"]["python_version"] == "3.11"
    assert ci.index("python -m pytest -q") < ci.index(".venv/bin/python scripts/typecheck.py")
