"""HF safetensors checkpoints <-> rlax parameters.

Import reads a model directory's ``config.json`` and either one
``model.safetensors`` or shards listed by ``model.safetensors.index.json``;
export writes ``config.json``, ``generation_config.json``, the safetensors
(sharded with an index past ``max_shard_bytes``) and the tokenizer files, so
``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` loads the policy.

HF stores a linear layer's weight as [out, in]; nnx's kernel is [in, out].
Name map (``L`` a layer index), HF -> rlax path::

    model.embed_tokens.weight                 embed/embedding
    model.layers.L.input_layernorm.weight     blocks/L/attn_norm/scale
    model.layers.L.self_attn.{q,k,v,o}_proj   blocks/L/attn/{q,k,v,o}/{kernel,bias}
    model.layers.L.self_attn.{q,k}_norm       blocks/L/attn/{q,k}_norm/scale
    model.layers.L.post_attention_layernorm   blocks/L/mlp_norm/scale
    model.layers.L.mlp.{gate,up,down}_proj    blocks/L/mlp/{gate,up,down}/kernel
    model.norm.weight                         final_norm/scale
    lm_head.weight                            head/kernel (absent when tied)

A mixture-of-experts layer's names are in :mod:`rlax.core.models.hf_moe`; an
expert's tensor is one slice of a stacked kernel, so its path ends with the
expert's index (``blocks/L/mlp/experts/gate/j``).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.hf_config import config_from_hf, config_to_hf
from rlax.core.models.hf_moe import moe_name_family, moe_names
from rlax.core.models.safetensors_stream import TensorOut, write_safetensors
from rlax.core.models.transformer import Transformer, abstract_transformer

__all__ = [
    "WeightsError",
    "hf_names",
    "load_hf_model",
    "params_from_tensors",
    "read_safetensors",
    "save_hf_model",
    "tensors_from_params",
]

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


class WeightsError(ValueError):
    """A checkpoint whose tensors are missing, misshapen or unreadable."""


def hf_names(cfg: TransformerConfig) -> Iterator[tuple[str, tuple[Any, ...], bool]]:
    """Every (HF tensor name, rlax pure-dict path, transposed) the architecture has."""
    yield "model.embed_tokens.weight", ("embed", "embedding"), False
    for i in range(cfg.num_layers):
        pre = f"model.layers.{i}."
        yield pre + "input_layernorm.weight", ("blocks", i, "attn_norm", "scale"), False
        yield pre + "post_attention_layernorm.weight", ("blocks", i, "mlp_norm", "scale"), False
        for name, biased in (
            ("q", cfg.qkv_bias),
            ("k", cfg.qkv_bias),
            ("v", cfg.qkv_bias),
            ("o", cfg.o_bias),
        ):
            yield f"{pre}self_attn.{name}_proj.weight", ("blocks", i, "attn", name, "kernel"), True
            if biased:
                yield f"{pre}self_attn.{name}_proj.bias", ("blocks", i, "attn", name, "bias"), False
        if cfg.qk_norm:
            for name in ("q", "k"):
                path = ("blocks", i, "attn", f"{name}_norm", "scale")
                yield f"{pre}self_attn.{name}_norm.weight", path, False
        if cfg.is_moe_layer(i):
            for name, path, transposed, expert in moe_names(cfg, moe_name_family(cfg), i):
                yield name, path if expert is None else (*path, expert), transposed
            continue
        for name in ("gate", "up", "down"):
            yield f"{pre}mlp.{name}_proj.weight", ("blocks", i, "mlp", name, "kernel"), True
    yield "model.norm.weight", ("final_norm", "scale"), False
    if not cfg.tie_embeddings:
        yield "lm_head.weight", ("head", "kernel"), True


def _get(tree: Mapping, path: tuple[Any, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _shape(shapes: Mapping, path: tuple[Any, ...]) -> tuple[int, ...]:
    """The shape at ``path``; an expert's slice (a path ending in its index) drops the E axis."""
    if isinstance(path[-1], int) and path[-2] in ("gate", "up", "down"):
        return tuple(_get(shapes, path[:-1]).shape[1:])
    return tuple(_get(shapes, path).shape)


def _stack_experts(tree: dict) -> None:
    """Each ``{j: expert j's slice}`` dict of :func:`params_from_tensors` as one [E, ...] array."""
    for key, value in tree.items():
        experts = isinstance(value, dict) and value and all(isinstance(k, int) for k in value)
        if experts and key in ("gate", "up", "down"):
            tree[key] = np.stack([value[j] for j in range(len(value))])
        elif isinstance(value, dict):
            _stack_experts(value)


def _set(tree: dict, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _to_device_in_place(tree: dict) -> None:
    """Replaces every leaf of a nested dict by ``jnp.asarray`` of it, one at a time."""
    for key, value in tree.items():
        if isinstance(value, dict):
            _to_device_in_place(value)
        else:
            tree[key] = jax.numpy.asarray(value)
            del value  # the host leaf goes now, not when the whole tree is done


def params_from_tensors(
    tensors: Mapping[str, np.ndarray], cfg: TransformerConfig, *, where: str = "checkpoint"
) -> dict:
    """HF-named tensors -> the model's pure parameter dict (float32).

    Raises:
      WeightsError: a tensor is missing or has the wrong shape (names both).
    """
    model = abstract_transformer(cfg)
    shapes = nnx.to_pure_dict(nnx.state(model))
    out: dict = {}
    missing = []
    for name, path, transposed in hf_names(cfg):
        if name not in tensors:
            missing.append(name)
            continue
        value = np.asarray(tensors[name], dtype=np.float32)
        value = value.T if transposed else value
        want = _shape(shapes, path)
        if value.shape != want:
            got = value.T.shape if transposed else value.shape
            raise WeightsError(
                f"{where}: tensor {name!r} has shape {tuple(got)}, the config needs "
                f"{tuple(reversed(want)) if transposed else want}"
            )
        _set(out, path, value)
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise WeightsError(f"{where}: missing tensor(s) {shown}")
    _stack_experts(out)
    return out


def tensors_from_params(params: Any, cfg: TransformerConfig) -> dict[str, np.ndarray]:
    """The model's parameters (an nnx State or pure dict) as HF-named float32 arrays."""
    return {t.name: np.ascontiguousarray(t.values()) for t in _tensors_out(params, cfg)}


def read_safetensors(model_dir: str | pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of a directory's single file or index-listed shards, as numpy."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    model_dir = pathlib.Path(model_dir)
    index = model_dir / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise WeightsError(f"{index}: malformed index ({err!r})") from None
        files = sorted(set(weight_map.values()))
    elif (model_dir / SINGLE).is_file():
        files, weight_map = [SINGLE], None
    else:
        raise WeightsError(f"{model_dir}: neither {SINGLE} nor {INDEX}")
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        path = model_dir / name
        if not path.is_file():
            raise WeightsError(f"{index}: lists shard {name!r}, which does not exist")
        try:
            tensors.update(load_file(str(path)))  # bfloat16 arrives as ml_dtypes' bfloat16
        except (SafetensorError, OSError, ValueError) as err:
            raise WeightsError(f"{path}: unreadable safetensors file: {err}") from None
    if weight_map is not None:
        absent = sorted(set(weight_map) - set(tensors))
        if absent:
            raise WeightsError(f"{index}: lists tensors its shards lack: {absent[:5]}")
    return tensors


def load_hf_model(model_dir: str | pathlib.Path) -> Transformer:
    """A :class:`Transformer` with the weights of an HF safetensors directory."""
    model_dir = pathlib.Path(model_dir)
    cfg = config_from_hf(model_dir)
    params = params_from_tensors(read_safetensors(model_dir), cfg, where=str(model_dir))
    return model_from_params(cfg, params)  # the tensors' only other holder is gone


def model_from_params(cfg: TransformerConfig, params: dict) -> Transformer:
    """A live model holding ``params`` (a pure dict), never materialising random weights.

    ``params`` is consumed: each host leaf is replaced by its JAX copy in turn,
    so a leaf's host memory can go as soon as it is copied (the caller holding
    no other reference): the peak is one copy of the weights plus one tensor,
    not two copies.
    """
    model = abstract_transformer(cfg)
    state = nnx.state(model)
    _to_device_in_place(params)
    nnx.replace_by_pure_dict(state, params)
    nnx.update(model, state)
    return model


def save_hf_model(
    model_dir: str | pathlib.Path,
    model: Transformer,
    *,
    params: Any = None,
    tokenizer: Any = None,
    max_shard_bytes: int = 2 << 30,
) -> pathlib.Path:
    """Writes ``model`` (or ``params`` for its architecture) as an HF directory.

    Args:
      model_dir: created if missing.
      model: the architecture (and weights unless ``params`` is given).
      params: optional nnx State / pure dict to export instead of the model's own.
      tokenizer: an object with ``save_hf(dir)`` (e.g. :class:`HFTokenizer`),
        whose special ids also go into ``config.json`` and ``generation_config.json``.
      max_shard_bytes: above this many bytes the weights are split into shards
        with a ``model.safetensors.index.json``.
    """
    model_dir = pathlib.Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    tensors = _tensors_out(params if params is not None else nnx.state(model), cfg)
    special = (
        tokenizer.special_ids()
        if tokenizer is not None and hasattr(tokenizer, "special_ids")
        else {}
    )
    (model_dir / "config.json").write_text(
        json.dumps(config_to_hf(cfg, **special), indent=2) + "\n"
    )
    generation = {"_from_model_config": True, **special}
    (model_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    shards = _shard(tensors, max_shard_bytes)
    if len(shards) == 1:
        write_safetensors(model_dir / SINGLE, shards[0], metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(model_dir / name, shard, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys((t.name for t in shard), name))
        total = sum(t.nbytes for t in tensors)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (model_dir / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    if tokenizer is not None and hasattr(tokenizer, "save_hf"):
        tokenizer.save_hf(model_dir)
    return model_dir


def _tensors_out(params: Any, cfg: TransformerConfig) -> list[TensorOut]:
    """Each HF tensor's name, shape and a way to make its float32 values when it is written
    (a kernel is transposed then, one at a time: the export never holds a second model)."""
    tree = params if isinstance(params, dict) else nnx.to_pure_dict(params)
    out = []
    for name, path, transposed in hf_names(cfg):
        leaf = _get(tree, path)
        shape = tuple(reversed(leaf.shape)) if transposed else tuple(leaf.shape)

        def values(leaf: Any = leaf, transposed: bool = transposed) -> np.ndarray:
            value = np.asarray(jax.device_get(leaf), dtype=np.float32)
            return value.T if transposed else value

        out.append(TensorOut(name, shape, np.dtype(np.float32), values))
    return out


def _shard(tensors: list[TensorOut], max_bytes: int) -> list[list[TensorOut]]:
    shards: list[list[TensorOut]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards
