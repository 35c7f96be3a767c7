"""The gin files that ship with rlax, found by name (``rlax run --gin NAME``, ``include``).

rlax's configs (``rlax.configs``) ship in folders, one per layer: ``base/``
(the role wiring, the optimiser), ``algorithms/``, ``tasks/``, ``models/`` and
``experiments/`` (what ``rlax run --gin NAME`` runs). A bare name is the
experiment of that name, else the one file of that name in another folder; a
name held by two of the other folders is an error that says which.
``FOLDER/NAME`` always names one file (``algorithms/dapo``).
"""

from __future__ import annotations

import os
import pathlib

from rlax.core.errors import ConfigError

__all__ = ["CONFIG_LAYERS", "find_gin_file", "find_packaged", "packaged_configs"]

# The folders of rlax.configs, in the order a bare name is looked up (experiments/ first).
CONFIG_LAYERS = ("experiments", "base", "algorithms", "tasks", "models")


def packaged_configs() -> dict[str, pathlib.Path]:
    """``{name: path}`` of the gin files that ship with rlax (``rlax.configs``), each under the
    shortest name :func:`find_gin_file` finds it by, experiments first.

    An experiment is its bare name (``quickstart``, ``dapo``); any other file is its bare
    name where that finds it (``grpo``, ``arithmetic``, ``roles``), else ``FOLDER/NAME``
    (``algorithms/dapo``: ``dapo`` is the experiment).
    """
    folder = _configs_folder()
    names: dict[str, pathlib.Path] = {}
    for layer in CONFIG_LAYERS:
        for path in sorted((folder / layer).glob("*.gin")):
            bare = _candidates(folder, path.stem) == [path]
            names[path.stem if bare else f"{layer}/{path.stem}"] = path
    return names


def find_gin_file(ref: str | os.PathLike[str]) -> str:
    """A gin file given as a path, or as the name of a packaged config (``quickstart``,
    ``algorithms/dapo``).

    Raises:
      ConfigError: neither a file nor a packaged config, or a bare name that two folders
        other than ``experiments/`` hold; the message lists the packaged names.
    """
    path = os.fspath(ref)
    if os.path.isfile(path):
        return path
    found = find_packaged(path)
    if found is not None:
        return found
    raise ConfigError(
        f"{path}: no such gin file, nor a packaged config of that name "
        f"(packaged: {', '.join(packaged_configs())})"
    )


def _configs_folder() -> pathlib.Path:
    import rlax.configs

    return pathlib.Path(rlax.configs.__file__).parent


def _candidates(folder: pathlib.Path, name: str) -> list[pathlib.Path]:
    """The packaged files ``name`` may mean: ``FOLDER/NAME`` that file; a bare name the
    experiment of that name, else every other folder's file of that name."""
    layer, _, stem = name.removesuffix(".gin").rpartition("/")
    if layer:
        path = folder / layer / f"{stem}.gin"
        return [path] if layer in CONFIG_LAYERS and path.is_file() else []
    found = [folder / where / f"{stem}.gin" for where in CONFIG_LAYERS]
    found = [p for p in found if p.is_file()]
    return found[:1] if found and found[0].parent.name == "experiments" else found


def find_packaged(name: str) -> str | None:
    """The packaged config called ``name`` (``dapo``, ``dapo.gin``, ``algorithms/dapo.gin``)."""
    found = _candidates(_configs_folder(), name)
    if len(found) > 1:
        raise ConfigError(
            f"{name}: ambiguous packaged config name, give its folder: "
            f"{' or '.join(f'{p.parent.name}/{p.stem}' for p in found)} "
            f"(packaged: {', '.join(packaged_configs())})"
        )
    return str(found[0]) if found else None
