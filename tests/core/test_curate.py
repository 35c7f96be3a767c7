"""`rlax curate`: a gin file in, a curated dataset and a report of every drop out."""

from __future__ import annotations

import json
import pathlib

import pytest

from rlax.core import cli
from rlax.core.models.tokenizer import CharTokenizer
from rlax.plugins.tasks.dataset import DatasetTask

ROOT = pathlib.Path(__file__).resolve().parents[2]

ROWS = [
    {"question": "Ann has 3 pens and buys 4 more. How many pens does she have?", "answer": "7"},
    {"question": "ann has 3 pens, and buys 4 more; how many pens does she have", "answer": "7"},
    {
        "question": "Bo reads 15 pages every day for 3 weeks. How many pages in all?",
        "answer": "315",
    },
    {"question": "Cy?", "answer": "1"},
    {
        "question": "Di bakes 6 trays of 12 cookies and eats 5. How many cookies are left?",
        "answer": "67",
    },
    {
        "question": "Ed walks 2 km to school and 2 km back, 5 days a week. How many km?",
        "answer": "20",
    },
]
EVAL = {"question": "Bo reads 15 pages every day for 3 weeks. How many pages does he read?"}


@pytest.fixture
def dataset(tmp_path) -> pathlib.Path:
    lines = (
        [json.dumps(r) for r in ROWS[:3]]
        + ['{"question": "broken']
        + [json.dumps(r) for r in ROWS[3:]]
    )
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "test.jsonl").write_text(json.dumps(EVAL) + "\n")
    return tmp_path


def gin_file(tmp_path: pathlib.Path, body: str) -> str:
    path = tmp_path / "curate.gin"
    path.write_text(
        "rlax.curate.task = @tasks.dataset()\n"
        f"tasks.dataset.train_files = ['{tmp_path / 'train.jsonl'}']\n"
        f"rlax.curate.output_dir = '{tmp_path / 'out'}'\n" + body
    )
    return str(path)


def test_curate_writes_the_kept_rows_and_says_why_each_other_row_went(dataset, capsys):
    config = gin_file(
        dataset,
        "rlax.curate.filters = [@curation.dedup(), @curation.decontaminate(), @curation.length()]\n"
        f"curation.decontaminate.eval_files = ['{dataset / 'test.jsonl'}']\n"
        "curation.length.min_length = 10\n",
    )
    assert cli.main(["curate", "--gin", config]) == cli.EXIT_OK
    out = dataset / "out"
    kept = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert kept == [ROWS[0], ROWS[4], ROWS[5]]  # the original rows, unchanged, in order
    report = json.loads((out / "report.json").read_text())
    assert report["malformed"] == [
        {
            "source": str(dataset / "train.jsonl"),
            "index": 3,
            "reason": report["malformed"][0]["reason"],
        }
    ] and report["malformed"][0]["reason"].startswith("invalid JSON")
    why = {(d["index"], d["filter"]): d["reason"] for d in report["dropped"]}
    assert set(why) == {(1, "Dedup"), (2, "Decontaminate"), (4, "LengthFilter")}
    assert why[(1, "Dedup")].startswith("exact duplicate of")
    assert why[(4, "LengthFilter")] == "too short: 3 chars < 10"
    assert [f["dropped"] for f in report["filters"]] == [1, 1, 1]
    assert report["prompts"] == 6 and report["kept"] == 3
    assert "kept 3:" in capsys.readouterr().out
    # The output is a dataset the task reads again.
    again = DatasetTask(train_files=[str(out / "train.jsonl")])
    assert len(again.load("train", tokenizer=CharTokenizer("".join(map(chr, range(32, 127)))))) == 3


def test_out_overrides_the_configured_directory(dataset):
    config = gin_file(dataset, "rlax.curate.filters = []\n")
    assert cli.main(["curate", "--gin", config, "--out", str(dataset / "elsewhere")]) == 0
    assert len((dataset / "elsewhere" / "train.jsonl").read_text().splitlines()) == 6


def test_a_filter_without_offline_is_a_configuration_error(dataset, capsys):
    config = gin_file(dataset, "rlax.curate.filters = [@curation.zero_variance()]\n")
    assert cli.main(["curate", "--gin", config]) == cli.EXIT_USAGE
    assert "ZeroVarianceFilter has no offline()" in capsys.readouterr().err


def test_pass_rate_filter_samples_the_current_model(tmp_path):
    """The real path: the quickstart's base model, the JAX sampler, the arithmetic verifier."""
    problems = [f"{a}+{b}=" for a, b in [(12, 30), (5, 7), (40, 41), (9, 9), (33, 21), (1, 2)]]
    rows = [{"q": p, "a": str(eval(p[:-1]))} for p in problems]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = gin_file(
        tmp_path,
        "tasks.dataset.template = '{q}'\ntasks.dataset.answer_field = 'a'\n"
        "rlax.curate.filters = [@curation.pass_rate()]\n"
        f"curation.pass_rate.checkpoint = '{ROOT / 'assets' / 'quickstart-base'}'\n"
        "curation.pass_rate.policy = @samplers.jax()\n"
        "samplers.jax.max_new_tokens = 4\n"
        "curation.pass_rate.reward = @rewards.arithmetic()\n"
        "curation.pass_rate.samples = 8\n"
        "curation.pass_rate.min_rate = 0.25\ncuration.pass_rate.max_rate = 0.75\n",
    )
    assert cli.main(["curate", "--gin", config]) == cli.EXIT_OK
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["kept"] + len(report["dropped"]) == 6
    for drop in report["dropped"]:
        passed = int(drop["reason"].split()[2].split("/")[0])
        assert passed < 2 or passed > 6, drop  # outside [0.25, 0.75] of 8
