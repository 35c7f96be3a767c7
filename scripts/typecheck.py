"""Type-checks ``rlax.core`` and ``rlax.plugins`` with mypy; the exit status is mypy's.

The folders ``core/`` and ``plugins/`` install as ``rlax.core`` and
``rlax.plugins`` through setuptools' ``package_dir`` mapping, and the editable
install finds them with an import hook that mypy cannot follow. So the check
runs over a view of the tree as it is installed: a folder ``rlax/`` (a namespace
package, as installed) holding the links ``core -> core/``,
``plugins -> plugins/`` and ``configs -> configs/``, put on ``MYPYPATH``. The view lives at a fixed place in
mypy's own (git-ignored) cache folder, so that the incremental cache, which
records each file's path, still holds on the next run; the paths mypy prints
are rewritten back to the repository's (``core/cli.py``, not the view's).

The settings are in ``pyproject.toml`` (``[tool.mypy]``); arguments are passed
on to mypy::

    python scripts/typecheck.py
    python scripts/typecheck.py --no-incremental
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
VIEW = ROOT / ".mypy_cache" / "rlax-view"
FOLDERS = ("core", "plugins")  # checked
IMPORTED = ("configs",)  # in the view only, for ``import rlax.configs``


def build_view(view: pathlib.Path = VIEW) -> pathlib.Path:
    """Links ``view/rlax/<folder>`` to each code folder (idempotent); returns ``view``."""
    package = view / "rlax"
    package.mkdir(parents=True, exist_ok=True)
    for folder in (*FOLDERS, *IMPORTED):
        link = package / folder
        if link.is_symlink() and link.resolve() == ROOT / folder:
            continue
        if link.is_symlink():
            link.unlink()  # a view left by a clone at another path
        link.symlink_to(ROOT / folder, target_is_directory=True)
    return view


def mypy_command(extra: list[str]) -> list[str]:
    """mypy over both packages with the repository's settings, then ``extra``."""
    packages = [arg for folder in FOLDERS for arg in ("-p", f"rlax.{folder}")]
    config = ["--config-file", str(ROOT / "pyproject.toml")]
    return [sys.executable, "-m", "mypy", *config, *packages, *extra]


def repository_paths(line: str, prefixes: list[str]) -> str:
    """``line`` with each view path (absolute or relative) turned into the repository's."""
    for prefix in prefixes:
        line = line.replace(prefix, "")
    return line


def main(argv: list[str]) -> int:
    view = build_view()
    env = {**os.environ, "MYPYPATH": str(view)}
    prefixes = [f"{view / 'rlax'}{os.sep}", f"{(view / 'rlax').relative_to(ROOT)}{os.sep}"]
    with subprocess.Popen(
        mypy_command(argv), cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    ) as mypy:
        assert mypy.stdout is not None  # stdout=PIPE
        for line in mypy.stdout:
            sys.stdout.write(repository_paths(line, prefixes))
    return mypy.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
