"""tasks.dataset: jsonl / parquet through datasets, field mapping, templates, malformed rows."""

from __future__ import annotations

import itertools
import json
import logging

import pytest

from rlax.core.models.tokenizer import CharTokenizer
from rlax.plugins.tasks.dataset import DatasetTask, held_out

TOK = CharTokenizer("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789?:.,\n+-=")

ROWS = [
    {"q": "What is one plus one?", "sol": "2", "meta": {"level": 1, "id": "a"}},
    {"q": "What is two plus two?", "sol": "4", "meta": {"level": 2, "id": "b"}},
    {"q": "What is three plus three?", "sol": "6", "meta": {"level": 3, "id": "c"}},
]


def write_jsonl(path, rows, extra_lines=()):
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def task(files, **kwargs):
    defaults = {"template": "Q: {q}\nA:", "answer_field": "sol"}
    return DatasetTask(train_files=files, **(defaults | kwargs))


def test_jsonl_rows_become_prompts_through_the_template(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    t = task([path], id_field="meta.id", metadata_fields=["meta.level"])
    prompts = t.load("train", tokenizer=TOK)
    assert [p.text for p in prompts] == [f"Q: {r['q']}\nA:" for r in ROWS]
    assert [p.answer for p in prompts] == ["2", "4", "6"]
    assert [p.id for p in prompts] == ["a", "b", "c"]
    assert prompts[1].metadata == {"split": "train", "source": path, "index": 1, "meta.level": 2}
    assert prompts[0].tokens.tolist() == TOK.encode(prompts[0].text, bos=True).tolist()


def test_parquet_reads_the_same_as_jsonl(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "d.parquet"))
    jsonl = task([write_jsonl(tmp_path / "d.jsonl", ROWS)]).load("train", tokenizer=TOK)
    parquet = task([str(tmp_path / "d.parquet")]).load("train", tokenizer=TOK)
    assert [(p.id, p.text, p.answer) for p in parquet] == [(p.id, p.text, p.answer) for p in jsonl]


BAD_LINES = [
    '{"q": "broken',
    '{"q": "No answer here"}',
    '{"q": "", "sol": "1"}',
    '["a list"]',
    '{"q": "Emoji \\u2603 here", "sol": "1"}',
]


def test_malformed_rows_are_reported_with_their_index_and_skipped(tmp_path, caplog):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS, BAD_LINES)
    t = task([path])
    with caplog.at_level(logging.WARNING, logger="rlax.tasks.dataset"):
        prompts = t.load("train", tokenizer=TOK)
    assert [p.answer for p in prompts] == ["2", "4", "6"]
    reported = {(m.index, m.reason.split(":")[0]) for m in t.malformed}
    assert reported == {
        (3, "invalid JSON"),
        (4, "missing field 'sol'"),
        (5, "empty field 'q'"),
        (6, "not a JSON object"),
        (7, "cannot tokenize"),
    }
    assert f"{path} row 3: invalid JSON" in caplog.text


def test_a_malformed_row_is_fatal_when_asked(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS + [{"q": "Missing the answer"}])
    with pytest.raises(ValueError, match=r"d\.jsonl row 3: missing field 'sol'"):
        task([path], on_malformed="error").load("train", tokenizer=TOK)


def test_held_out_split_is_disjoint_and_independent_of_order_and_seed(tmp_path):
    rows = [{"q": f"What is {i} plus {i}?", "sol": str(2 * i)} for i in range(200)]
    forward = task([write_jsonl(tmp_path / "f.jsonl", rows)], eval_fraction=0.2)
    backward = task([write_jsonl(tmp_path / "b.jsonl", rows[::-1])], eval_fraction=0.2)
    eval_ids = {p.id for p in forward.load("eval", tokenizer=TOK)}
    train_ids = {p.id for p in forward.load("train", tokenizer=TOK)}
    assert not eval_ids & train_ids and len(eval_ids | train_ids) == 200
    assert 20 <= len(eval_ids) <= 60
    assert eval_ids == {p.id for p in backward.load("eval", tokenizer=TOK)}
    assert all(held_out(p.text, 0.2) for p in forward.load("eval", tokenizer=TOK))


def test_train_stream_is_endless_and_reshuffled_by_seed(tmp_path):
    t = task([write_jsonl(tmp_path / "d.jsonl", ROWS)])

    def ids(seed):
        return [p.id for p in itertools.islice(t.prompts("train", tokenizer=TOK, seed=seed), 9)]

    assert ids(0) == ids(0)
    assert len(ids(0)) == 9 and sorted(ids(0)[:3]) == sorted(ids(0)[3:6])  # each epoch: all rows
    assert any(ids(s) != ids(0) for s in range(1, 5))
    assert list(t.prompts("eval", tokenizer=TOK, seed=0)) == []  # no eval files, no hold-out


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"train_files": []}, "train_files"),
        ({"on_malformed": "ignore"}, "on_malformed"),
        ({"template": "no fields"}, "tasks.dataset.template: 'no fields' shows no column"),
        ({"template": "{"}, "tasks.dataset.template: '{' is not a str.format string"),
        ({"eval_fraction": 1.0}, "eval_fraction"),
    ],
)
def test_bad_settings_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DatasetTask(**({"train_files": ["x.jsonl"]} | kwargs))


def test_a_single_path_string_is_refused_naming_the_list_to_write():
    with pytest.raises(ValueError, match=r"train_files: a list of paths, got one: 'a.jsonl'"):
        DatasetTask(train_files="a.jsonl")


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        task([str(tmp_path / "none.jsonl")]).load("train", tokenizer=TOK)
    (tmp_path / "d.csv").write_text("q,sol\n")
    with pytest.raises(ValueError, match="unknown format"):
        task([str(tmp_path / "d.csv")]).load("train", tokenizer=TOK)
