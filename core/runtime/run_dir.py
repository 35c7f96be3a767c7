"""A run directory: the one owner of every file and folder a run keeps.

``rlax run`` makes it once (:meth:`RunDir.make`: ``RUN_ROOT/RUN_NAME-YYYYmmdd-HHMMSS[-i]``)
or finds it (``--run-dir DIR``, ``--resume [DIR]``) and hands its path to every role;
each role wraps the path in a :class:`RunDir` and asks it where a file goes::

    operative_config.gin           the whole gin config, every role (written before anything else)
    trainer_operative_config.gin   every value the trainer used, defaults included
    metrics.jsonl                  one line per step
    rollouts.jsonl                 sampled groups every ``trace_every`` steps
    curves.png                     learning curves
    eval.json                      held-out pass@k before, during, after
    checkpoint/                    the final policy (its info records the last step)
    adapter/                       with LoRA: the adapters in PEFT's layout
    train_state/                   resumable checkpoints of the whole trainer state
    param_server/                  the parameter server's queue and weights
    compile_cache/                 the programs the roles compiled (JAX's persistent cache)
    recovery.jsonl                 one line per restart: how long each role took to be useful
    processes/                     each supervisor and parameter-server process as it stopped:
                                   whether it imported JAX (neither should)

A directory holding ``operative_config.gin`` (or a ``train_state/``) is a run
that can be resumed; a run is finished once it has exported its final policy
and written ``eval.json``. No other module spells one of these names
(tests/test_architecture.py checks every name :meth:`RunDir.names` lists).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import pathlib
import re
import shlex
import shutil
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from rlax.core.errors import ConfigError
from rlax.core.models.bundle import saved_info

__all__ = ["RunDir"]

_STAMP = r"(?P<stamp>\d{8}-\d{6})(?:-(?P<i>\d+))?"


@dataclasses.dataclass(frozen=True)
class RunDir:
    """The run directory at ``path`` (see the module doc); ``str()`` is the path's.

    ``made_root``: the run root, when :meth:`make` made it too (:meth:`remove_fresh`).
    ``start_over``: if none of the run's checkpoints can be restored, train it again from
    step 0 (``rlax run --start-over``) rather than refuse to.
    """

    path: pathlib.Path
    made_root: pathlib.Path | None = dataclasses.field(default=None, compare=False)
    start_over: bool = dataclasses.field(default=False, compare=False)

    # Each file and folder of a run, named once (names(): every one of them).
    OPERATIVE_CONFIG: ClassVar[str] = "operative_config.gin"
    SPEC: ClassVar[str] = "spec.gin"
    TRAINER_CONFIG: ClassVar[str] = "trainer_operative_config.gin"
    METRICS: ClassVar[str] = "metrics.jsonl"
    ROLLOUTS: ClassVar[str] = "rollouts.jsonl"
    CURVES: ClassVar[str] = "curves.png"
    EVAL: ClassVar[str] = "eval.json"
    FINAL_POLICY: ClassVar[str] = "checkpoint"
    ADAPTER: ClassVar[str] = "adapter"
    TRAIN_STATE: ClassVar[str] = "train_state"
    PARAM_SERVER: ClassVar[str] = "param_server"
    COMPILE_CACHE: ClassVar[str] = "compile_cache"
    RECOVERY: ClassVar[str] = "recovery.jsonl"
    PROCESSES: ClassVar[str] = "processes"

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", pathlib.Path(self.path))

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every file and folder name a run keeps."""
        return tuple(v for k, v in vars(cls).items() if k.isupper() and isinstance(v, str))

    @classmethod
    def of(cls, where: RunDir | str | os.PathLike[str]) -> RunDir:
        """``where`` as a RunDir (a role is handed the path)."""
        return where if isinstance(where, RunDir) else cls(pathlib.Path(where))

    # -- the files and folders ---------------------------------------------------------

    @property
    def operative_config(self) -> pathlib.Path:
        return self.path / self.OPERATIVE_CONFIG

    @property
    def spec(self) -> pathlib.Path:
        """The run specification the supervisor built, as gin text its children read."""
        return self.path / self.SPEC

    @property
    def trainer_config(self) -> pathlib.Path:
        return self.path / self.TRAINER_CONFIG

    @property
    def metrics(self) -> pathlib.Path:
        return self.path / self.METRICS

    @property
    def rollouts(self) -> pathlib.Path:
        return self.path / self.ROLLOUTS

    @property
    def curves(self) -> pathlib.Path:
        return self.path / self.CURVES

    @property
    def eval_json(self) -> pathlib.Path:
        return self.path / self.EVAL

    @property
    def final_policy(self) -> pathlib.Path:
        return self.path / self.FINAL_POLICY

    @property
    def adapter(self) -> pathlib.Path:
        return self.path / self.ADAPTER

    @property
    def train_state(self) -> pathlib.Path:
        return self.path / self.TRAIN_STATE

    @property
    def param_server(self) -> pathlib.Path:
        return self.path / self.PARAM_SERVER

    @property
    def compile_cache(self) -> pathlib.Path:
        return self.path / self.COMPILE_CACHE

    @property
    def recovery(self) -> pathlib.Path:
        return self.path / self.RECOVERY

    @property
    def processes(self) -> pathlib.Path:
        """The JAX-free roles' record of themselves (:mod:`rlax.core.runtime.jax_free`)."""
        return self.path / self.PROCESSES

    def staged_final_policy(self, which: Literal["new", "old"]) -> pathlib.Path:
        """Beside the final policy: the one being exported (new), the one replaced (old)."""
        return self.path / f"{self.FINAL_POLICY}.{which}"

    # -- making, finding, finishing ----------------------------------------------------

    @classmethod
    def owning(cls, path: str | os.PathLike[str]) -> RunDir | None:
        """The run ``path`` is a file or folder of (its final policy), or None."""
        run = cls(pathlib.Path(path).resolve().parent)
        return run if run.holds_run() else None

    @classmethod
    def make(cls, run_root: str | os.PathLike[str], run_name: str) -> RunDir:
        """A new directory ``run_root/run_name-STAMP`` (``-1``, ``-2``... if taken)."""
        root = pathlib.Path(run_root)
        made_root = None if root.exists() else root
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for i in itertools.count():
            path = root / (f"{run_name}-{stamp}" + (f"-{i}" if i else ""))
            try:
                path.mkdir(parents=True)
                return cls(path, made_root)
            except FileExistsError:
                continue
        raise AssertionError("unreachable")

    def remove_fresh(self) -> None:
        """Removes this directory, made a moment ago by :meth:`make` (nothing was trained in
        it: the roles refused their settings), and the run root if it made that too."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self.made_root is not None:
            with contextlib.suppress(OSError):  # only if nothing else is in it
                self.made_root.rmdir()

    def contents(self) -> frozenset[pathlib.Path]:
        """Every path under this directory (none if it is not there)."""
        return frozenset(self.path.rglob("*")) if self.path.is_dir() else frozenset()

    def remove_new(self, before: frozenset[pathlib.Path]) -> None:
        """Removes what appeared under this directory since ``before`` (:meth:`contents`):
        the roles refused their settings. What was there before stays as it was, and if a
        checkpoint appeared meanwhile (a role refused only after training began), nothing
        is removed: a saved step is never taken back."""
        new = self.contents() - before
        if any(path.is_relative_to(self.train_state) for path in new):
            return
        for path in sorted(new, key=lambda p: len(p.parts)):
            if path.is_dir() and not path.is_symlink():  # the outermost new one first
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists() or path.is_symlink():
                path.unlink(missing_ok=True)

    def open(self) -> RunDir:
        """Makes the directory if it is not there yet (``--run-dir`` may name a new one)."""
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    def holds_run(self) -> bool:
        """Whether this is a run directory (it has the config every run writes first)."""
        return self.operative_config.is_file() or self.train_state.is_dir()

    def checked(self, what: str) -> RunDir:
        """Itself if it holds a run; else ConfigError ``"{what}: not a run directory ..."``."""
        if not self.holds_run():
            raise ConfigError(
                f"{what}: not a run directory (no {self.OPERATIVE_CONFIG} or {self.TRAIN_STATE}/)"
            )
        return self

    @classmethod
    def resumed(
        cls, resume: str | os.PathLike[str] | Literal[True], run_root: str, run_name: str
    ) -> RunDir:
        """``--resume DIR``: DIR, checked; bare ``--resume``: the newest run of that name.

        Raises:
          ConfigError: DIR does not exist or holds no run; no run of that name.
        """
        if resume is True:
            return cls.newest(run_root, run_name)
        if not pathlib.Path(resume).is_dir():
            raise ConfigError(f"--resume {resume}: no such run directory")
        return cls.of(resume).checked(f"--resume {resume}")

    @classmethod
    def newest(cls, run_root: str | os.PathLike[str], run_name: str) -> RunDir:
        """The newest run named ``run_name`` under ``run_root`` (by the stamp in its name).

        Raises:
          ConfigError: there is none.
        """
        pattern = re.compile(re.escape(run_name) + "-" + _STAMP)
        root = pathlib.Path(run_root)
        found = []
        for path in root.iterdir() if root.is_dir() else ():
            match = pattern.fullmatch(path.name)
            if match and path.is_dir() and cls(path).holds_run():
                found.append(((match["stamp"], int(match["i"] or 0)), path))
        if not found:
            raise ConfigError(
                f"--resume: no run named {run_name!r} in {root}/ "
                "(from rlax.train.run_root and rlax.train.run_name); give its directory: "
                "--resume DIR"
            )
        return cls(max(found)[1])

    def finished(self) -> int | None:
        """The last step of the exported final policy, or None: the run is not finished."""
        if not self.eval_json.is_file():
            return None
        try:
            step = saved_info(self.final_policy).get("step")
        except (OSError, ValueError):
            return None  # no final policy (or a damaged one): the run finishes it again
        return step if isinstance(step, int) else None

    def finished_message(self, steps: int) -> str | None:
        """The line saying the run has nothing left to do at ``steps`` steps, or None."""
        done = self.finished()
        if done is None or done < steps:
            return None
        count = (
            f"{done} of {steps}" if done == steps else f"{done}, more than the {steps} asked for,"
        )
        return f"rlax: {self} is finished ({count} steps); nothing to do"

    def resume_command(
        self, gin_files: Sequence[str], bindings: Sequence[str], plugins: Sequence[str], role: str
    ) -> str:
        """The ``rlax run`` command line that resumes this run with the same configuration."""
        argv = ["rlax", "run"]
        for path in gin_files:
            argv += ["--gin", path]
        argv += [f"--gin.{b}" for b in bindings]
        for plugin in plugins:
            argv += ["-p", plugin]
        if role != "all":
            argv += ["--role", role]
        return shlex.join([*argv, "--resume", str(self)])

    # -- writing and reading -----------------------------------------------------------

    def write_eval(self, results: dict[str, Any]) -> None:
        """Writes ``eval.json`` (the one writer: the trainer's observer calls it)."""
        self.eval_json.write_text(json.dumps(results, indent=2) + "\n")

    def read_eval(self) -> dict[str, Any]:
        """``eval.json``, or ``{}`` before it is written."""
        return json.loads(self.eval_json.read_text()) if self.eval_json.is_file() else {}

    def swap_in_final_policy(self) -> None:
        """The staged new final policy becomes the final policy; the replaced one is deleted."""
        new, old = self.staged_final_policy("new"), self.staged_final_policy("old")
        if self.final_policy.exists():
            self.final_policy.rename(old)
        new.rename(self.final_policy)
        shutil.rmtree(old, ignore_errors=True)

    def clear_staged_final_policy(self) -> None:
        """Deletes what a lost export left beside the final policy."""
        for which in ("new", "old"):
            shutil.rmtree(self.staged_final_policy(which), ignore_errors=True)


def read_json_lines(path: pathlib.Path) -> list[dict[str, Any]]:
    """The JSON rows of a run's ``.jsonl`` file (none if it is missing); a torn last line
    (a process killed mid-write) is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
