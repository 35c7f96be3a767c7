"""Run directories: the one to resume, whether a run is finished, the command that resumes it.

``rlax.train`` makes a run directory ``RUN_ROOT/RUN_NAME-YYYYmmdd-HHMMSS[-i]``
(:func:`rlax.core.runtime.runs.make_run_dir`) and writes ``operative_config.gin``
into it before anything else, so a directory holding that file (or a
``train_state/``) is a run that can be resumed. A run is finished once it has
exported its final policy (``checkpoint/``, whose info records the last step)
and written ``eval.json``.
"""

from __future__ import annotations

import itertools
import pathlib
import re
import shlex
import time
from collections.abc import Sequence

from rlax.core.errors import ConfigError
from rlax.core.models.bundle import saved_info

__all__ = [
    "finished_message",
    "finished_steps",
    "holds_run",
    "newest_run",
    "resumable",
    "resume_command",
]

_STAMP = r"(?P<stamp>\d{8}-\d{6})(?:-(?P<i>\d+))?"


def holds_run(path: pathlib.Path) -> bool:
    """Whether ``path`` is a run directory (it has the config every run writes first)."""
    return (path / "operative_config.gin").is_file() or (path / "train_state").is_dir()


def resumable(path: pathlib.Path) -> pathlib.Path:
    """``path`` if it is a run directory to resume.

    Raises:
      ConfigError: it does not exist or holds no run.
    """
    if not path.is_dir():
        raise ConfigError(f"--resume {path}: no such run directory")
    if not holds_run(path):
        raise ConfigError(
            f"--resume {path}: not a run directory (no operative_config.gin or train_state/)"
        )
    return path


def newest_run(run_root: str | pathlib.Path, run_name: str) -> pathlib.Path:
    """The newest run named ``run_name`` under ``run_root`` (by the time stamp in its name).

    Raises:
      ConfigError: there is none.
    """
    pattern = re.compile(re.escape(run_name) + "-" + _STAMP)
    root = pathlib.Path(run_root)
    found = []
    for path in root.iterdir() if root.is_dir() else ():
        match = pattern.fullmatch(path.name)
        if match and path.is_dir() and holds_run(path):
            found.append(((match["stamp"], int(match["i"] or 0)), path))
    if not found:
        raise ConfigError(
            f"--resume: no run named {run_name!r} in {root}/ "
            "(from rlax.train.run_root and rlax.train.run_name); give its directory: --resume DIR"
        )
    return max(found)[1]


def finished_steps(run_dir: pathlib.Path) -> int | None:
    """The last step of the run's exported final policy, or None if the run is not finished."""
    if not (run_dir / "eval.json").is_file():
        return None
    try:
        step = saved_info(run_dir / "checkpoint").get("step")
    except (OSError, ValueError):
        return None  # no final policy (or a damaged one): the run finishes it again
    return step if isinstance(step, int) else None


def finished_message(run_dir: pathlib.Path, steps: int) -> str | None:
    """The line that says the run in ``run_dir`` has nothing left to do, or None."""
    done = finished_steps(run_dir)
    if done is None or done < steps:
        return None
    count = f"{done} of {steps}" if done == steps else f"{done}, more than the {steps} asked for,"
    return f"rlax: {run_dir} is finished ({count} steps); nothing to do"


def resume_command(
    gin_files: Sequence[str],
    bindings: Sequence[str],
    plugins: Sequence[str],
    role: str,
    run_dir: pathlib.Path,
) -> str:
    """The ``rlax run`` command line that resumes ``run_dir`` with the same configuration."""
    argv = ["rlax", "run"]
    for path in gin_files:
        argv += ["--gin", path]
    argv += [f"--gin.{b}" for b in bindings]
    for plugin in plugins:
        argv += ["-p", plugin]
    if role != "all":
        argv += ["--role", role]
    return shlex.join([*argv, "--resume", str(run_dir)])


def make_run_dir(run_root: str | pathlib.Path, run_name: str) -> pathlib.Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in itertools.count():
        path = pathlib.Path(run_root) / (f"{run_name}-{stamp}" + (f"-{i}" if i else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")
