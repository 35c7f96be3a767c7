"""``rlax curate``: run offline curation filters over a dataset; write it and a report.

The task (``tasks.dataset``) reads its rows; every offline filter, in order,
keeps some prompts and drops others with a reason; the rows of the kept
prompts are written unchanged, so the output is a dataset of the same format
the task reads. The output directory::

    OUT/<split>.jsonl   the kept rows, in their original order and fields
    OUT/report.json     counts per filter, every malformed and dropped row with its reason

Configured in gin as ``rlax.curate`` (see ``configs/experiments/curate_gsm8k_tiny.gin``).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlax.core.contracts import Dataset, Encoder, OfflineFilter
from rlax.core.errors import ConfigError
from rlax.core.types import Prompt

__all__ = ["TextTokenizer", "curate"]


class TextTokenizer:
    """Token ids = the UTF-8 bytes: lets any text through when no model is named."""

    def encode(self, text: str, *, bos: bool = False) -> np.ndarray:
        return np.frombuffer(text.encode(), np.uint8).astype(np.int32)


def _where(prompt: Prompt) -> dict[str, Any]:
    return {k: prompt.metadata.get(k) for k in ("source", "index")} | {"id": prompt.id}


def curate(
    *,
    hook: Any = None,
    task: Dataset,
    filters: Sequence[OfflineFilter] = (),
    output_dir: str,
    split: str = "train",
    tokenizer_checkpoint: str = "",
) -> int:
    """Curates ``split`` of ``task`` with ``filters``; writes the dataset and report; returns 0.

    Args:
      hook: the plugin manager's hook relay (unused; for symmetry with train).
      task: a task with a finite dataset (:class:`rlax.core.contracts.Dataset`,
        e.g. ``tasks.dataset``).
      filters: offline filters (:class:`rlax.core.contracts.OfflineFilter`),
        applied in order.
      output_dir: where to write ``<split>.jsonl`` and ``report.json``.
      split: the task's split to curate.
      tokenizer_checkpoint: a model directory whose tokenizer encodes the
        prompts ("" : UTF-8 bytes; only ``curation.length`` with unit tokens cares).
    """
    _check_capabilities(task, filters)
    prompts = task.load(split, tokenizer=_tokenizer(tokenizer_checkpoint))
    report: dict[str, Any] = {
        "split": split,
        "malformed": [
            {"source": m.source, "index": m.index, "reason": m.reason} for m in task.malformed
        ],
        "prompts": len(prompts),
        "filters": [],
        "dropped": [],
    }
    for f in filters:
        name = type(f).__name__
        result = f.offline(prompts)
        report["filters"].append(
            {"filter": name, "input": len(prompts), "dropped": len(result.dropped)}
        )
        report["dropped"] += [
            _where(d.prompt) | {"filter": name, "reason": d.reason} for d in result.dropped
        ]
        prompts = result.kept
    report["kept"] = len(prompts)
    out = pathlib.Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{split}.jsonl", "w", encoding="utf-8") as rows:
        rows.writelines(json.dumps(row, default=str) + "\n" for row in task.rows(prompts))
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    _print_summary(report, out, split)
    return 0


def _check_capabilities(task: Dataset, filters: Sequence[OfflineFilter]) -> None:
    """Raises ConfigError unless ``task`` has a finite dataset and every filter is offline.

    Gin builds whatever component it is told to, so the types are checked here.
    """
    if not isinstance(task, Dataset):
        raise ConfigError(
            f"rlax.curate.task: {type(task).__name__} has no finite dataset "
            "(rlax.core.contracts.Dataset: load, rows, malformed)"
        )
    for f in filters:
        if not isinstance(f, OfflineFilter):
            raise ConfigError(f"rlax.curate.filters: {type(f).__name__} has no offline()")


def _tokenizer(checkpoint: str) -> Encoder:
    """The tokenizer of the model in ``checkpoint``; UTF-8 bytes without one."""
    if not checkpoint:
        return TextTokenizer()
    from rlax.core.models.bundle import load_model

    return load_model(checkpoint).tokenizer


def _print_summary(report: dict[str, Any], out: pathlib.Path, split: str) -> None:
    print(
        f"curated {split}: {report['prompts']} prompts "
        f"({len(report['malformed'])} malformed rows skipped)"
    )
    for row in report["filters"]:
        print(f"  {row['filter']:<24} dropped {row['dropped']:>6} of {row['input']}")
    print(f"kept {report['kept']}: {out / f'{split}.jsonl'}; report: {out / 'report.json'}")
