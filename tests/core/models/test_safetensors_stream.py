"""The streaming safetensors writer: files the reference reader loads, made one tensor at a time."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from rlax.core.models.safetensors_stream import TensorOut, write_safetensors


def _out(name, value, made):
    def values():
        made.append(name)
        return value

    return TensorOut(name, value.shape, value.dtype, values)


def test_the_reference_reader_loads_every_tensor_and_the_metadata(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "a.weight": rng.standard_normal((3, 5)).astype(np.float32),
        "b.bias": rng.standard_normal((7,)).astype(np.float32),  # 28 bytes: b's end unaligned
        "c.half": rng.standard_normal((2, 2)).astype(ml_dtypes.bfloat16),
        "d.empty": np.zeros((0, 4), np.float32),
        "e.ids": np.arange(6, dtype=np.int64).reshape(2, 3),
    }
    made: list[str] = []
    path = tmp_path / "x.safetensors"
    write_safetensors(path, [_out(k, v, made) for k, v in arrays.items()], {"format": "pt"})
    assert made == list(arrays)  # each asked for once, in order
    back = load_file(str(path))
    assert set(back) == set(arrays)
    for name, value in arrays.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
        np.testing.assert_array_equal(back[name], value)
    with safe_open(str(path), "np") as f:
        assert f.metadata() == {"format": "pt"}
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    assert header_len % 8 == 0  # the data starts 8-byte aligned
    assert path.stat().st_size == 8 + header_len + sum(v.nbytes for v in arrays.values())


def test_values_unlike_their_declaration_and_duplicate_names_are_refused(tmp_path):
    bad = TensorOut("w", (2, 3), np.dtype(np.float32), lambda: np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"w: got float32\[3, 2\], declared float32\[2, 3\]"):
        write_safetensors(tmp_path / "bad.safetensors", [bad])
    twice = [_out("w", np.zeros(2, np.float32), []), _out("w", np.ones(2, np.float32), [])]
    with pytest.raises(ValueError, match="duplicate"):
        write_safetensors(tmp_path / "twice.safetensors", twice)
    odd = TensorOut("c", (1,), np.dtype(np.complex64), lambda: np.zeros(1, np.complex64))
    with pytest.raises(ValueError, match="complex64 is not supported"):
        write_safetensors(tmp_path / "odd.safetensors", [odd])
