"""A safetensors file written one tensor at a time.

``safetensors.numpy.save_file`` takes every tensor at once and turns each into
``bytes`` before writing, so an export holds the weights twice beside the
model (three times with a transposed copy per tensor): 1.1 GB more than the
trainer's state for SmolLM2. :func:`write_safetensors` needs only the names,
shapes and dtypes up front (the header comes first in the file) and asks for
each tensor's array when its turn comes, so at most one tensor's copy exists.

The format (https://github.com/huggingface/safetensors, "Format"): an 8-byte
little-endian header length N; N bytes of JSON mapping each name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the data
that follows the header), plus an optional ``"__metadata__"`` of strings;
then the tensors' bytes, C order, little-endian, back to back. The header is
padded with spaces to a multiple of 8 bytes, as the reference writer does, so
the data starts aligned.
"""

from __future__ import annotations

import json
import pathlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = ["TensorOut", "write_safetensors"]

_DTYPES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
}


@dataclass(frozen=True)
class TensorOut:
    """One tensor of a file: its name, shape and dtype, and how to get its values."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    values: Callable[[], np.ndarray]  # called once, when the tensor is written

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def _header(tensors: Sequence[TensorOut], metadata: dict[str, str] | None) -> bytes:
    entries: dict[str, object] = {}
    if metadata:
        entries["__metadata__"] = dict(metadata)
    offset = 0
    for t in tensors:
        if np.dtype(t.dtype) not in _DTYPES:
            raise ValueError(f"safetensors: {t.name}: dtype {t.dtype} is not supported")
        entries[t.name] = {
            "dtype": _DTYPES[np.dtype(t.dtype)],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def write_safetensors(
    path: str | pathlib.Path,
    tensors: Sequence[TensorOut],
    metadata: dict[str, str] | None = None,
) -> None:
    """Writes ``tensors`` to ``path`` in order, asking each for its values in turn.

    Raises:
      ValueError: a duplicate name, an unsupported dtype, or values whose shape
        or dtype differ from what the tensor declared (the header is already
        written then: the file is left incomplete, and the caller's directory
        is not to be used).
    """
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise ValueError(f"safetensors: duplicate tensor names in {path}")
    header = _header(tensors, metadata)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for t in tensors:
            value = np.ascontiguousarray(t.values())
            if value.shape != tuple(t.shape) or value.dtype != np.dtype(t.dtype):
                raise ValueError(
                    f"safetensors: {t.name}: got {value.dtype}{list(value.shape)}, "
                    f"declared {np.dtype(t.dtype)}{list(t.shape)}"
                )
            if value.dtype.byteorder == ">":
                value = value.byteswap().view(value.dtype.newbyteorder("<"))
            f.write(value.reshape(-1).view(np.uint8).data)  # bytes as they are (bfloat16 too)
            del value  # the only copy of this tensor: gone before the next one is made
