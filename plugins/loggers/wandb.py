"""``loggers.wandb``: a Weights & Biases run per rlax run, continued when the run resumes.

The W&B run id is kept in ``RUN/wandb_run_id``: a resumed run (``--resume``,
or a restarted trainer) opens the same W&B run (``resume="allow"``), so a
preempted run's curves continue where they stopped. W&B writes its files
under ``RUN/wandb/``. Without network access W&B cannot sync, so the mode
defaults to ``offline`` unless an API key is set (``WANDB_API_KEY``) or
``WANDB_MODE`` says otherwise; ``wandb sync RUN/wandb/offline-run-*`` uploads
an offline run later.
"""

from __future__ import annotations

import importlib.util
import math
import os
import pathlib
import secrets
from collections.abc import Sequence
from typing import Annotated, Any, cast

from rlax.core import hookimpl
from rlax.core.constraints import OneOf
from rlax.core.errors import ConfigError

ID_FILE = "wandb_run_id"
MODES = ("online", "offline", "disabled")
COLUMNS = ("step", "prompt", "completion", "reward", "reason", "tokens", "finish", "version")


def default_mode() -> str:
    """``WANDB_MODE`` if set, else online with an API key and offline without."""
    return os.environ.get("WANDB_MODE") or (
        "online" if os.environ.get("WANDB_API_KEY") else "offline"
    )


def run_id(run_dir: pathlib.Path) -> str:
    """The W&B run id of ``run_dir``: the one it keeps, or a new one saved there."""
    path = run_dir / ID_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    made = secrets.token_hex(4)  # 8 characters of [0-9a-f], as W&B's own ids
    path.write_text(made + "\n")
    return made


class WandbLogger:
    """One W&B run per rlax run.

    Args:
      project: the W&B project.
      entity: the W&B team or user (None: the account's default).
      name: the run's display name (None: the run directory's name).
      mode: ``"online"``, ``"offline"`` or ``"disabled"`` (None: :func:`default_mode`).
      tags: tags of the W&B run.
    """

    def __init__(
        self,
        *,
        project: str = "rlax",
        entity: str | None = None,
        name: str | None = None,
        mode: Annotated[str, OneOf(*MODES)] | None = None,
        tags: Sequence[str] = (),
    ):
        if importlib.util.find_spec("wandb") is None:
            raise ConfigError("loggers.wandb needs wandb: pip install 'rlax-llm[observe]'")
        if mode is not None and mode not in MODES:
            raise ConfigError(f"loggers.wandb.mode: one of {', '.join(MODES)}, got {mode!r}")
        self.project, self.entity, self.name, self.tags = project, entity, name, list(tags)
        self.mode = mode
        self.run: Any = None

    def open(self, run_dir: str, step: int) -> None:
        import wandb

        folder = pathlib.Path(run_dir)
        self.run = wandb.init(
            project=self.project,
            entity=self.entity,
            name=self.name or folder.name,
            id=run_id(folder),
            resume="allow",
            dir=str(folder),
            mode=cast(Any, self.mode or default_mode()),
            tags=self.tags,
            config={"run_dir": str(folder)},
        )

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        numbers = {
            k: v
            for k, v in metrics.items()
            if k != "step" and isinstance(v, int | float) and math.isfinite(v)
        }
        self.run.log(numbers, step=step)

    def log_traces(self, step: int, traces: list[dict[str, Any]]) -> None:
        import wandb

        rows = [
            [
                step,
                t["prompt"],
                c["text"],
                c["reward"],
                c["reason"],
                c["length"],
                c["finish_reason"],
                c["policy_version"],
            ]
            for t in traces
            for c in t["completions"]
        ]
        self.run.log({"rollouts": wandb.Table(columns=list(COLUMNS), data=rows)}, step=step)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


@hookimpl
def rlax_register_loggers():
    return {"wandb": WandbLogger}
