"""Packages found from the tree, so a new folder of code can never be left out of a wheel.

The user's layout keeps ``core/``, ``plugins/``, ``configs/`` and ``assets/`` at
the repository root; they install as ``rlax.core``, ``rlax.plugins``,
``rlax.configs`` and ``rlax.assets`` (``rlax`` itself is a namespace
package). Every folder under ``core/`` and ``plugins/`` that holds a ``.py``
file is a package; ``configs/`` ships the gin files of its folders and ``assets/`` the
quickstart's base policy, as package data. Everything else about the
distribution is in ``pyproject.toml``.
"""

from __future__ import annotations

import pathlib

from setuptools import setup

ROOT = pathlib.Path(__file__).resolve().parent
CODE = {"rlax.core": "core", "rlax.plugins": "plugins"}
DATA = {"rlax.configs": ("configs", ["*/*.gin"]), "rlax.assets": ("assets", ["**/*"])}
_SKIP = {"__pycache__"}


def _code_packages() -> dict[str, str]:
    """``{package name: folder}`` for every folder of code under the code roots."""
    found = {}
    for package, folder in CODE.items():
        for init in sorted((ROOT / folder).rglob("*.py")):
            directory = init.parent.relative_to(ROOT)
            if _SKIP.intersection(directory.parts):
                continue
            name = ".".join([package, *directory.parts[1:]])
            found[name] = directory.as_posix()
    return found


packages = {**_code_packages(), **{name: folder for name, (folder, _) in DATA.items()}}
setup(
    packages=sorted(packages),
    package_dir=packages,
    package_data={name: patterns for name, (_, patterns) in DATA.items()},
)
