"""Prompts from a dataset: local jsonl / parquet files (or a hub name) through ``datasets``.

A row becomes a :class:`~rlax.core.types.Prompt` by two settings: ``template``
(a ``str.format`` string over the row's columns, e.g. ``"Question:
{question}\\nAnswer:"``) and ``answer_field`` (the column handed to the
reward as ``prompt.answer``). Columns may be nested: ``{meta.level}``. In gin::

    tasks.dataset.train_files = ['data/gsm8k/train.jsonl']
    tasks.dataset.eval_files = ['data/gsm8k/test.jsonl']
    tasks.dataset.template = 'Question: {question}\\nAnswer:'
    tasks.dataset.answer_field = 'answer'

A malformed row (broken JSON, a missing or empty field, text the tokenizer
cannot encode) is reported with its file and index, then skipped
(``on_malformed = 'skip'``) or fatal (``'error'``). Without ``eval_files``, a
share ``eval_fraction`` of the training rows is held out by a hash of the
prompt text, so the split never depends on the file order or the seed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import pathlib
import string
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

import numpy as np

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, OneOf, Range, check_arguments, check_rules, checked_by
from rlax.core.errors import BadSetting
from rlax.core.types import ConfigPath, Prompt

__all__ = ["DatasetTask", "MalformedRow", "load_rows"]

log = logging.getLogger("rlax.tasks.dataset")
_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


@dataclasses.dataclass(frozen=True)
class MalformedRow:
    """A row that could not become a prompt."""

    source: str
    index: int
    reason: str

    def __str__(self) -> str:
        return f"{self.source} row {self.index}: {self.reason}"


def _format_of(path: str) -> str:
    suffix = pathlib.Path(path).suffix.lower()
    if suffix not in _FORMATS:
        raise ValueError(f"tasks.dataset: {path}: unknown format (use .jsonl, .json or .parquet)")
    return _FORMATS[suffix]


def _json_lines(path: str) -> tuple[list[dict], list[MalformedRow]]:
    """Parses a jsonl file line by line (used when ``datasets`` rejects the file)."""
    rows, bad = [], []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                bad.append(MalformedRow(path, i, f"invalid JSON: {exc.msg}"))
                continue
            if not isinstance(row, dict):
                bad.append(MalformedRow(path, i, "not a JSON object"))
                continue
            rows.append({**row, "__index__": i})
    return rows, bad


@contextlib.contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """No progress bar and no log lines from ``datasets`` while it reads a local file.

    Its JSON reader logs an ERROR for a file with one bad line before raising;
    that row is reported once, as a :class:`MalformedRow`, by :func:`_json_lines`.
    """
    bars, verbosity = datasets.is_progress_bar_enabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL + 10)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


def load_rows(path: str) -> tuple[list[dict], list[MalformedRow]]:
    """Every row of a local file as a dict (with ``__index__``), and the unreadable rows.

    Raises:
      FileNotFoundError: no such file.
    """
    import datasets

    if not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"tasks.dataset: {path}: no such file")
    kind = _format_of(path)
    try:
        with _quiet(datasets):
            data = datasets.load_dataset(kind, data_files=path, split="train")
    except Exception:  # datasets rejects a whole file for one bad line: find which
        if kind != "json":
            raise
        return _json_lines(path)
    return [{**row, "__index__": i} for i, row in enumerate(data)], []


def _hub_rows(name: str, config: str | None, split: str) -> list[dict]:
    import datasets

    data = datasets.load_dataset(name, config, split=split)
    return [{**row, "__index__": i} for i, row in enumerate(data)]


def _field(row: dict, name: str) -> Any:
    value: Any = row
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(name)
        value = value[part]
    return value


def held_out(text: str, eval_fraction: float) -> bool:
    """True if the prompt ``text`` belongs to the held-out share."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 10_000 < eval_fraction * 10_000


def template_fields(template: str) -> list[str]:
    """The columns ``template`` shows (``"Q: {question}"``: ``["question"]``).

    Raises:
      ValueError: ``template`` is not a ``str.format`` string.
    """
    return [field for _, field, _, _ in string.Formatter().parse(template) if field]


def _sources_and_template(
    *,
    train_files: Any = (),
    eval_files: Any = (),
    hub_name: str = "",
    template: str = "{question}",
    **_: Any,
) -> None:
    """BadSetting: a path where a list of paths belongs, no source of rows, or a
    template that shows no column (or is not a ``str.format`` string)."""
    for name, files in (("train_files", train_files), ("eval_files", eval_files)):
        if isinstance(files, str | pathlib.Path):
            raise BadSetting(
                name, f"a list of paths, got one: {str(files)!r} (write [{str(files)!r}])"
            )
    if not train_files and not hub_name:
        raise BadSetting("train_files", "set train_files (local files) or hub_name")
    if not isinstance(template, str):
        return  # the annotation's check says so
    try:
        fields = template_fields(template)
    except ValueError as err:
        raise BadSetting("template", f"{template!r} is not a str.format string: {err}") from None
    if not fields:
        raise BadSetting("template", f"{template!r} shows no column (e.g. '{{question}}')")


@checked_by(_sources_and_template)
class DatasetTask:
    """Prompts from jsonl / parquet files or a hub dataset.

    Args:
      train_files: local files of the training split.
      eval_files: local files of the evaluation split (empty: hold out
        ``eval_fraction`` of the training rows).
      hub_name: a hub dataset name used instead of files (needs the network).
      hub_config: the hub dataset's configuration (e.g. ``"main"``).
      hub_splits: hub split names for ``(train, eval)``.
      template: the prompt text, ``str.format`` over the row's columns.
      answer_field: the column that becomes ``prompt.answer``.
      id_field: the column of a stable id ("" : a hash of the prompt text).
      metadata_fields: columns copied into ``prompt.metadata``.
      eval_fraction: held-out share when there are no ``eval_files``.
      num_eval: at most this many evaluation prompts (0: all).
      on_malformed: ``"skip"`` (report and skip) or ``"error"`` (report and stop).
      reward: the name of the reward this task is meant for.
    """

    def __init__(
        self,
        *,
        train_files: Sequence[ConfigPath] = (),
        eval_files: Sequence[ConfigPath] = (),
        hub_name: str = "",
        hub_config: str | None = None,
        hub_splits: Sequence[str] = ("train", "test"),
        template: str = "{question}",
        answer_field: str = "answer",
        id_field: str = "",
        metadata_fields: Sequence[str] = (),
        eval_fraction: Annotated[float, Range(ge=0, lt=1)] = 0.0,
        num_eval: Annotated[int, AtLeast(0, means="0: all")] = 0,
        on_malformed: Annotated[str, OneOf("skip", "error")] = "skip",
        reward: str = "math",
    ) -> None:
        check_arguments(DatasetTask.__init__, locals(), owner="tasks.dataset")
        check_rules(
            DatasetTask,
            "tasks.dataset",
            train_files=train_files,
            eval_files=eval_files,
            hub_name=hub_name,
            template=template,
        )
        fields = template_fields(template)
        self.train_files, self.eval_files = list(train_files), list(eval_files)
        self.hub_name, self.hub_config, self.hub_splits = hub_name, hub_config, tuple(hub_splits)
        self.template, self.template_fields = template, fields
        self.answer_field, self.id_field = answer_field, id_field
        self.metadata_fields = list(metadata_fields)
        self.eval_fraction, self.num_eval = eval_fraction, num_eval
        self.on_malformed = on_malformed
        self.default_reward = reward
        self.malformed: list[MalformedRow] = []

    # -- reading ---------------------------------------------------------------

    def _source_rows(self, split: str) -> Iterator[tuple[str, dict]]:
        if self.hub_name:
            hub_split = self.hub_splits[0 if split == "train" else 1]
            for row in _hub_rows(self.hub_name, self.hub_config, hub_split):
                yield f"{self.hub_name}:{hub_split}", row
            return
        for path in self.eval_files if split == "eval" and self.eval_files else self.train_files:
            rows, bad = load_rows(path)
            for problem in bad:
                self._malformed(problem)
            for row in rows:
                yield path, row

    def _malformed(self, problem: MalformedRow) -> None:
        if self.on_malformed == "error":
            raise ValueError(f"tasks.dataset: malformed row: {problem}")
        log.warning("tasks.dataset: skipping malformed row: %s", problem)
        self.malformed.append(problem)

    def _prompt(self, source: str, row: dict, split: str, tokenizer: Any) -> Prompt | None:
        index = row["__index__"]
        try:
            values = {name: _field(row, name) for name in self.template_fields}
            answer = _field(row, self.answer_field)
        except KeyError as exc:
            self._malformed(MalformedRow(source, index, f"missing field {exc.args[0]!r}"))
            return None
        for name, value in [*values.items(), (self.answer_field, answer)]:
            if value is None or (isinstance(value, str) and not value.strip()):
                # datasets fills a column missing from a row with None
                what = "missing" if value is None else "empty"
                self._malformed(MalformedRow(source, index, f"{what} field {name!r}"))
                return None
        text = self.template.format_map(values)
        try:
            tokens = tokenizer.encode(text, bos=True)
        except ValueError as exc:
            self._malformed(MalformedRow(source, index, f"cannot tokenize: {exc}"))
            return None
        if self.id_field and _present(row, self.id_field):
            pid = str(_field(row, self.id_field))
        else:
            pid = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
        metadata = {"split": split, "source": source, "index": index}
        metadata.update({f: _field(row, f) for f in self.metadata_fields if _present(row, f)})
        return Prompt(id=pid, text=text, tokens=tokens, answer=answer, metadata=metadata)

    def load(self, split: str, *, tokenizer: Any) -> list[Prompt]:
        """Every well-formed prompt of ``split`` in file order (malformed ones reported)."""
        if split not in ("train", "eval"):
            raise ValueError(f"tasks.dataset: unknown split {split!r} (use 'train' or 'eval')")
        hold_out = not self.eval_files and not self.hub_name and self.eval_fraction > 0
        if split == "eval" and not self.eval_files and not self.hub_name and not hold_out:
            return []
        prompts = []
        for source, row in self._source_rows(split):
            prompt = self._prompt(source, row, split, tokenizer)
            if prompt is None:
                continue
            if hold_out and held_out(prompt.text, self.eval_fraction) != (split == "eval"):
                continue
            prompts.append(prompt)
        if split == "eval" and self.num_eval:
            prompts = prompts[: self.num_eval]
        return prompts

    def rows(self, prompts: Sequence[Prompt]) -> list[dict]:
        """The source row of each prompt from :meth:`load`, fields as read (``rlax curate``).

        A prompt of a local file is looked up by its ``source`` and ``index``;
        one without a file (a hub dataset) is recorded as its id, text and answer.
        """
        files: dict[str, dict[int, dict]] = {}
        out = []
        for prompt in prompts:
            source = prompt.metadata.get("source")
            if not (source and pathlib.Path(source).is_file()):
                out.append({"id": prompt.id, "text": prompt.text, "answer": prompt.answer})
                continue
            if source not in files:
                files[source] = {row["__index__"]: row for row in load_rows(source)[0]}
            row = files[source][prompt.metadata["index"]]
            out.append({k: v for k, v in row.items() if k != "__index__"})
        return out

    def prompts(self, split: str, *, tokenizer: Any, seed: int) -> Iterator[Prompt]:
        """``"train"``: an endless stream, reshuffled every epoch from ``seed``.
        ``"eval"``: every evaluation prompt once, in file order.
        """
        prompts = self.load(split, tokenizer=tokenizer)
        if split == "eval":
            yield from prompts
            return
        if not prompts:
            raise ValueError("tasks.dataset: the training split has no well-formed prompt")
        rng = np.random.default_rng(seed)
        while True:
            for i in rng.permutation(len(prompts)):
                yield prompts[i]


def _present(row: dict, name: str) -> bool:
    try:
        return _field(row, name) is not None
    except KeyError:
        return False


@hookimpl
def rlax_register_tasks():
    return {"dataset": DatasetTask}
