"""LoRA: low-rank adapters on a frozen base, for the trainer and the weight path.

A target projection (an ``nnx.Linear`` whose module name, e.g.
``"blocks/0/attn/q"``, ``re.search``-matches one of :attr:`LoraConfig.targets`,
the way the sharding rules of :mod:`rlax.core.parallel.mesh` match parameter
names) gets two trainable matrices beside its frozen kernel ``W`` [I, O]:
``a`` [I, r] and ``b`` [r, O], and computes

    y = x W + bias + (alpha / r) · dropout(x) a b

(Hu et al. 2021, https://arxiv.org/abs/2106.09685, eq. 3, written for the
[in, out] kernel layout). ``a`` starts uniform in ±1/sqrt(I) (PEFT's default,
Kaiming-uniform with a = sqrt(5)) and ``b`` at zero, so the adapted model
starts as the base exactly. The merged weights ``W + (alpha / r) a b`` give
the same function without dropout (:func:`merged_state`): what samplers,
workers and exports use.

:class:`LoraParams` is the trainer's parameter tree under LoRA: the frozen
base (float32 or bfloat16), the adapters (float32, the only thing the
optimiser sees) and the dropout key (advanced every update, so a resumed run
draws the same masks). Shapes: I a projection's input dim, O its output dim,
r the rank.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlax.core.errors import ConfigError
from rlax.core.models.lora_config import BASE_DTYPES, LoraConfig

__all__ = [
    "LoraLinear",
    "LoraParams",
    "adapters_of",
    "attach",
    "base_fingerprint",
    "init_adapters",
    "joined",
    "merged_state",
    "model_of",
    "reference",
    "target_names",
    "updated",
]


def _key(k: Any) -> Any:
    """A pytree path entry's key (dict key, sequence index or attribute name)."""
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return getattr(k, attr)
    return k


def _name(path: tuple) -> str:
    """``"blocks/0/attn/q/kernel"`` for a key path (an nnx ``value`` attribute dropped)."""
    return "/".join(str(_key(k)) for k in path if _key(k) != "value")


def _kernels(base: Any) -> dict[str, tuple[tuple, Any]]:
    """module name -> (module path, kernel) for every 2-d ``kernel`` leaf of ``base``."""
    pure = nnx.to_pure_dict(base) if isinstance(base, nnx.State) else base
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(pure)[0]:
        keys = tuple(_key(k) for k in path if _key(k) != "value")
        if keys[-1] == "kernel" and np.ndim(leaf) == 2:
            out[_name(keys[:-1])] = (keys[:-1], leaf)
    return out


def target_names(base: Any, config: LoraConfig) -> list[str]:
    """The module names of the linear layers that get adapters, in tree order.

    Raises:
      ConfigError: no linear layer matches ``config.targets`` (lists them).
    """
    kernels = _kernels(base)
    names = [n for n in kernels if any(re.search(p, n) for p in config.targets)]
    if not names:
        shown = ", ".join(sorted({re.sub(r"/\d+/", "/L/", n) for n in kernels}))
        raise ConfigError(
            f"rlax.lora.targets {list(config.targets)} match no linear layer; the model has {shown}"
        )
    return names


def _nested_set(tree: dict, keys: tuple, value: Any) -> None:
    for key in keys[:-1]:
        tree = tree.setdefault(str(key), {})
    tree[str(keys[-1])] = value


def init_adapters(base: Any, config: LoraConfig) -> dict:
    """``{"lora": {module path...: {"a": [I, r], "b": [r, O]}}}``, float32, ``b`` = 0."""
    kernels = _kernels(base)
    key = jax.random.key(config.seed)
    out: dict = {}
    for i, name in enumerate(target_names(base, config)):
        keys, kernel = kernels[name]
        d_in, d_out = np.shape(kernel)
        bound = 1.0 / np.sqrt(d_in)
        a = jax.random.uniform(
            jax.random.fold_in(key, i), (d_in, config.rank), jnp.float32, -bound, bound
        )
        _nested_set(out, keys, {"a": a, "b": jnp.zeros((config.rank, d_out), jnp.float32)})
    return {"lora": out}


def adapter_pairs(adapters: dict) -> dict[str, tuple[Any, Any]]:
    """module name -> (a, b) of an adapter tree (as :func:`init_adapters` builds it)."""
    out: dict[str, tuple[Any, Any]] = {}

    def walk(tree: dict, prefix: tuple) -> None:
        if set(tree) == {"a", "b"}:
            out["/".join(prefix)] = (tree["a"], tree["b"])
            return
        for key, sub in tree.items():
            walk(sub, (*prefix, key))

    walk(adapters["lora"], ())
    return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LoraParams:
    """The trainer's parameters under LoRA (a pytree; ``config`` is static).

    Attributes:
      base: the frozen base model's state (never updated).
      adapters: the trainable adapters (:func:`init_adapters`).
      key: the dropout key [2] uint32, or None (no dropout: the reference, eval).
      config: the LoRA settings.
      base_id: :func:`base_fingerprint` of ``base``: what an adapter version names.
    """

    base: Any
    adapters: dict
    key: Any
    config: LoraConfig = dataclasses.field(metadata={"static": True})
    base_id: bytes = dataclasses.field(default=b"", metadata={"static": True})


def attach(params: nnx.State, config: LoraConfig) -> LoraParams:
    """``params`` as a frozen base (in ``config.base_dtype``) with fresh adapters."""
    dtype = BASE_DTYPES[config.base_dtype]
    base = jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params
    )
    key = jax.random.PRNGKey(config.seed + 1) if config.dropout > 0 else None
    return LoraParams(base, init_adapters(params, config), key, config, base_fingerprint(base))


def adapters_of(params: Any) -> Any:
    """What the optimiser trains: the adapters under LoRA, else ``params`` itself."""
    return params.adapters if isinstance(params, LoraParams) else params


def joined(params: Any, adapters: Any) -> Any:
    """``params`` with ``adapters`` as its trainable part (what the loss differentiates)."""
    if not isinstance(params, LoraParams):
        return adapters
    return dataclasses.replace(params, adapters=adapters)


def updated(old: Any, trained: Any) -> Any:
    """``old`` with its trainable part replaced by ``trained`` (and the dropout key advanced)."""
    if not isinstance(old, LoraParams):
        return trained
    key = None if old.key is None else jax.random.split(old.key)[0]
    return dataclasses.replace(old, adapters=trained, key=key)


def reference(params: Any) -> Any:
    """The frozen reference policy: the starting adapters without dropout (the base, B = 0)."""
    if not isinstance(params, LoraParams):
        return params
    return dataclasses.replace(params, adapters=jax.tree.map(jnp.copy, params.adapters), key=None)


class LoraLinear(nnx.Module):
    """A linear layer plus its low-rank update (the equation of the module docstring)."""

    def __init__(
        self,
        base: nnx.Linear,
        a: jax.Array,
        b: jax.Array,
        *,
        scale: float,
        dropout: float,
        key: jax.Array | None,
        token_ids: jax.Array | None = None,
    ):
        self.base = base
        self.a, self.b = nnx.Param(a), nnx.Param(b)
        self.scale, self.dropout = scale, dropout
        self.key = None if key is None else nnx.Variable(key)
        self.token_ids = None if token_ids is None else nnx.Variable(token_ids)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = x
        if self.key is not None and self.dropout > 0:
            keep = dropout_keep(self.key[...], self._ids(x), x.shape[-1], 1.0 - self.dropout)
            h = jnp.where(keep.reshape(x.shape), x / (1.0 - self.dropout), jnp.zeros_like(x))
        return self.base(x) + (h @ self.a[...]) @ self.b[...] * self.scale

    def _ids(self, x: jax.Array) -> jax.Array:
        """The token identity of each of ``x``'s rows of features (its leading dims flattened)."""
        if self.token_ids is None:
            raise ValueError(
                "LoRA dropout: the model was built without token_ids (each input token's "
                "identity in the padded layout), so its masks would follow the layout's shape"
            )
        ids = self.token_ids[...].reshape(-1)
        rows = x.size // x.shape[-1]
        if ids.shape[0] != rows:
            raise ValueError(
                f"LoRA dropout: a target layer saw {rows} token rows but the batch has "
                f"{ids.shape[0]} tokens (rlax.lora.targets matching the output head?)"
            )
        return ids


def dropout_keep(key: jax.Array, ids: jax.Array, features: int, keep: float) -> jax.Array:
    """[N, features] keep mask of N tokens: token n's row drawn from ``key`` folded with
    ``ids[n]`` only, so a token keeps the same mask whatever layout (padded, packed) or
    position in it the token has (:mod:`rlax.core.trainer.packing`'s ``token_ids``)."""
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(ids)
    return jax.vmap(lambda k: jax.random.bernoulli(k, keep, (features,)))(keys)


def _module(root: Any, keys: tuple) -> Any:
    """The submodule of ``root`` at a module path (``("blocks", "0", "attn")``)."""
    for key in keys:
        root = root[int(key)] if str(key).isdigit() else getattr(root, str(key))
    return root


def model_of(graphdef: Any, params: Any, token_ids: jax.Array | None = None) -> Any:
    """The model of ``params``: plain, or with :class:`LoraLinear` on each target (unmerged).

    ``token_ids`` [B, T]: each input token's identity in the padded layout, which dropout
    draws each token's mask from (:func:`dropout_keep`); needed when dropout is on.
    """
    if not isinstance(params, LoraParams):
        return nnx.merge(graphdef, params)
    model = nnx.merge(graphdef, params.base)
    for i, (name, (a, b)) in enumerate(adapter_pairs(params.adapters).items()):
        *parent, attr = name.split("/")
        owner = _module(model, tuple(parent))
        key = None if params.key is None else jax.random.fold_in(params.key, i)
        layer = LoraLinear(
            getattr(owner, attr),
            a,
            b,
            scale=params.config.scale,
            dropout=params.config.dropout,
            key=key,
            token_ids=token_ids,
        )
        setattr(owner, attr, layer)
    return model


@jax.jit
def _merge(base: Any, adapters: dict, scale: float) -> Any:
    pairs = adapter_pairs(adapters)

    def add(path, x):
        name = _name(path)
        x = x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x
        if name.endswith("/kernel") and name.removesuffix("/kernel") in pairs:
            a, b = pairs[name.removesuffix("/kernel")]
            return x + (a.astype(jnp.float32) @ b.astype(jnp.float32)) * scale
        return x

    return jax.tree_util.tree_map_with_path(add, base)


def merged_state(params: Any, adapters: dict | None = None, scale: float | None = None) -> Any:
    """The plain model's float32 state with ``W + scale · a b`` on every target kernel.

    ``params`` is a :class:`LoraParams` (its own adapters and scale), or a
    base state with ``adapters`` and ``scale`` given (a worker's copy).
    """
    if isinstance(params, LoraParams):
        return _merge(params.base, params.adapters, params.config.scale)
    if adapters is None or scale is None:
        return params
    return _merge(params, adapters, scale)


def base_fingerprint(base: Any) -> bytes:
    """32 bytes naming a base: SHA-256 over its leaves' names, shapes and float32 bytes."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(base)[0]:
        value = np.asarray(jax.device_get(leaf), dtype=np.float32)
        digest.update(f"{_name(path)}:{value.shape};".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return digest.digest()
