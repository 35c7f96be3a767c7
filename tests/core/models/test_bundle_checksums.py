"""Exported models carry checksums: a damaged file is an error naming it; old exports load."""

from __future__ import annotations

import json
import pathlib
import shutil

import gin
import numpy as np
import pytest

from rlax.core import cli
from rlax.core.models.bundle import CHECKSUMS, load_model, save_model, verify_checksums

ROOT = pathlib.Path(__file__).resolve().parents[3]
BASE = ROOT / "assets" / "quickstart-base"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> pathlib.Path:
    """The quickstart's base policy saved again by save_model (so with checksums)."""
    return save_model(tmp_path_factory.mktemp("export") / "model", load_model(BASE))


@pytest.fixture
def copy(exported, tmp_path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(exported, tmp_path / "model"))


def largest_file(path: pathlib.Path) -> pathlib.Path:
    return max((p for p in path.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def flip(path: pathlib.Path, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    for i in range(count):
        data[len(data) // 2 + i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_every_saved_file_is_listed_and_the_export_loads_verified(exported):
    record = json.loads((exported / CHECKSUMS).read_text())
    saved = {p.relative_to(exported).as_posix() for p in exported.rglob("*") if p.is_file()}
    assert record["format"] == "rlax-checksums/1" and record["algorithm"] == "xxh3_128"
    assert set(record["files"]) == saved - {CHECKSUMS}
    assert "model.json" in record["files"] and any(n.startswith("params/") for n in saved)
    assert verify_checksums(exported) is True
    again, base = load_model(exported), load_model(BASE)
    np.testing.assert_array_equal(again.model.embed.embedding[...], base.model.embed.embedding[...])


def test_a_flipped_byte_is_an_error_naming_the_file(copy):
    damaged = largest_file(copy / "params")
    flip(damaged, count=1)
    with pytest.raises(ValueError, match="checksum mismatch") as err:
        load_model(copy)
    assert str(err.value).startswith(f"{damaged}: checksum mismatch")


def test_a_missing_listed_file_is_an_error_naming_it(copy):
    (copy / "params" / "_METADATA").unlink()
    with pytest.raises(ValueError, match=r"_METADATA: missing \(listed in .*checksums.json\)"):
        load_model(copy)


def test_a_model_without_checksums_loads_as_before(copy):
    (copy / CHECKSUMS).unlink()
    assert verify_checksums(copy) is False
    assert load_model(copy).config == load_model(BASE).config
    assert not (BASE / CHECKSUMS).exists()  # the shipped base policy is such a model


def test_rlax_eval_of_a_damaged_export_exits_2_with_one_line(copy, capsys):
    damaged = largest_file(copy / "params")
    flip(damaged)  # 64 bytes, as in the issue: once 0.0% pass@k with exit 0
    gin.clear_config()
    argv = [
        "eval",
        "--gin",
        str(ROOT / "configs/experiments/quickstart.gin"),
        "--checkpoint",
        str(copy),
    ]
    assert cli.main(argv) == cli.EXIT_USAGE
    gin.clear_config()
    out, err = capsys.readouterr()
    assert err == (
        f"rlax: error: --checkpoint: {damaged}: checksum mismatch (the file is damaged or was "
        "changed since it was saved)\n"
    )
    assert out == ""  # nothing was evaluated
