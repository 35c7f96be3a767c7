"""``loggers.tensorboard``: every metric of every step, and the rollout traces, as TensorBoard events.

The event files go to ``RUN/<subdir>/`` (``tensorboard --logdir RUN``), written
with tensorboardX's ``SummaryWriter``, which needs neither TensorFlow nor
TensorBoard itself. A resumed run writes a new event file in the same folder
that purges the events after its checkpoint's step, so a step redone after a
crash is shown once.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
import re
from typing import Annotated, Any

from rlax.core import hookimpl
from rlax.core.constraints import Positive
from rlax.core.errors import ConfigError

#: tensorboardX replaces these characters in a tag with ``_`` (rlax's own metric names have none).
_INVALID_TAG = re.compile(r"[^-/\w.]")


def tag(name: str) -> str:
    """The TensorBoard tag a metric is written under."""
    return _INVALID_TAG.sub("_", name).lstrip("/")


def traces_markdown(traces: list[dict[str, Any]], max_chars: int = 300) -> str:
    """The traces of one step as a markdown table (TensorBoard's text dashboard renders it)."""
    lines = [
        "| prompt | completion | reward | reason | tokens | finish | version |",
        "|---|---|---|---|---|---|---|",
    ]
    for trace in traces:
        for c in trace["completions"]:
            cells = [
                trace["prompt"],
                c["text"][:max_chars],
                f"{c['reward']:g}",
                c["reason"],
                str(c["length"]),
                c["finish_reason"],
                str(c["policy_version"]),
            ]
            lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


class TensorBoardLogger:
    """TensorBoard event files in ``RUN/<subdir>``.

    Args:
      subdir: the folder under the run directory for the event files.
      flush_secs: how often the writer flushes to disk, in seconds.
    """

    def __init__(
        self, *, subdir: str = "tensorboard", flush_secs: Annotated[float, Positive] = 10.0
    ):
        if importlib.util.find_spec("tensorboardX") is None:
            raise ConfigError(
                "loggers.tensorboard needs tensorboardX: pip install 'rlax-llm[observe]'"
            )
        if not subdir or pathlib.PurePath(subdir).is_absolute() or ".." in subdir:
            raise ConfigError(
                f"loggers.tensorboard.subdir: a folder inside the run, got {subdir!r}"
            )
        self.subdir, self.flush_secs = subdir, flush_secs
        self.writer: Any = None

    def open(self, run_dir: str, step: int) -> None:
        from tensorboardX import SummaryWriter

        # purge_step: events of the steps after the checkpoint, written by the run that was
        # lost, are hidden (those steps are redone).
        self.writer = SummaryWriter(
            str(pathlib.Path(run_dir) / self.subdir),
            flush_secs=self.flush_secs,
            purge_step=step + 1 if step else None,
        )

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        wall = metrics.get("time")
        for name, value in metrics.items():
            if name in ("step", "time"):
                continue
            if isinstance(value, int | float) and math.isfinite(value):
                self.writer.add_scalar(tag(name), float(value), step, walltime=wall)

    def log_traces(self, step: int, traces: list[dict[str, Any]]) -> None:
        self.writer.add_text("rollouts", traces_markdown(traces), step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


@hookimpl
def rlax_register_loggers():
    return {"tensorboard": TensorBoardLogger}
