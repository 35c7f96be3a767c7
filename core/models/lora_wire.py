"""Adapter-only weight versions: what a LoRA trainer pushes and how a worker applies it.

Under LoRA the trainer pushes only the adapters, on the same wire and
protocol as whole models (:mod:`rlax.core.wire`). An adapter
version is told apart by its tensor names: every one starts with ``lora/``
(``lora/blocks/0/attn/q/a``), and three small float32 tensors describe it:

- ``lora/meta/base`` [32]: the bytes of the base's fingerprint
  (:func:`rlax.core.models.lora.base_fingerprint`), one per element;
- ``lora/meta/scale`` [1]: alpha / r;
- ``lora/meta/base_dtype`` [1]: 0 for a float32 base, 1 for a bfloat16 one.

A worker keeps its own copy of the base (the ``init_checkpoint`` it loaded)
and applies a version by merging the adapters into it (``W + scale · a b``);
it refuses a version whose base is not its own, since the merged model would
then be neither the trainer's nor any other.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlax.core.models import lora
from rlax.core.wire import WIRE_DTYPES, WirePlan

__all__ = ["PREFIX", "AdapterApplier", "is_adapter_version", "unpacked", "wire_tree"]

PREFIX = "lora/"
_DTYPE_CODES = {"float32": 0.0, "bfloat16": 1.0}


def wire_tree(params: Any) -> Any:
    """What a publish pushes: the adapters and their metadata under LoRA, else ``params``."""
    if not isinstance(params, lora.LoraParams):
        return params
    meta = {
        "base": jnp.asarray(np.frombuffer(params.base_id, np.uint8), jnp.float32),
        "scale": jnp.full((1,), params.config.scale, jnp.float32),
        "base_dtype": jnp.full((1,), _DTYPE_CODES[params.config.base_dtype], jnp.float32),
    }
    return {"lora": {**params.adapters["lora"], "meta": meta}}


def is_adapter_version(tensors: list[dict]) -> bool:
    """True if a pulled version's tensors (name, shape, ...) are an adapter version."""
    return bool(tensors) and all(t["name"].startswith(PREFIX) for t in tensors)


def _tree_of(tensors: list[dict]) -> dict:
    """Zeros shaped like ``tensors``, nested by their names (the pusher's tree layout)."""
    tree: dict = {}
    for t in tensors:
        *parents, leaf = t["name"].split("/")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = np.zeros(tuple(t["shape"]), np.float32)
    return tree


class AdapterApplier:
    """A worker's base and the merge of pushed adapters into it.

    Args:
      base: the worker's base parameters (an nnx state of the plain model), or a
        function that loads them, called at the first adapter version: a worker
        that only ever pulls whole weights then never keeps a second copy.
    """

    def __init__(self, base: Any):
        self._base_or_loader = base
        self._ids: dict[float, tuple[Any, bytes]] = {}  # base dtype code -> (cast base, id)
        self._plans: dict[tuple, WirePlan] = {}

    @property
    def base(self) -> Any:
        """The base parameters (loaded now if they were given as a loader)."""
        if callable(self._base_or_loader):
            self._base_or_loader = self._base_or_loader()
        return self._base_or_loader

    def _base(self, code: float) -> tuple[Any, bytes]:
        if code not in self._ids:
            dtype = jnp.bfloat16 if code == 1.0 else jnp.float32
            cast = jax.tree.map(
                lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                self.base,
            )
            self._ids[code] = (cast, lora.base_fingerprint(cast))
        return self._ids[code]

    def plan(self, tensors: list[dict]) -> WirePlan:
        """The wire plan of an adapter version's layout (built once per layout)."""
        key = tuple((t["name"], tuple(t["shape"]), t["dtype"]) for t in tensors)
        if key not in self._plans:
            dtypes = {t["dtype"] for t in tensors}
            if len(dtypes) != 1 or next(iter(dtypes)) not in WIRE_DTYPES:
                raise ValueError(f"weight sync: adapter version with wire dtypes {sorted(dtypes)}")
            self._plans[key] = WirePlan.for_tree(_tree_of(tensors), next(iter(dtypes)))
        return self._plans[key]

    def apply(self, tensors: list[dict], buffer: Any) -> Any:
        """The merged parameters of an adapter version (float32, the plain model's state).

        Raises:
          ValueError: the layout is inconsistent, or the version names another base.
        """
        plan = self.plan(tensors)
        plan.check_layout(tensors)
        tree = plan.unpack(buffer)["lora"]
        meta = {k: np.asarray(v) for k, v in tree.pop("meta").items()}
        base, base_id = self._base(float(meta["base_dtype"][0]))
        named = bytes(np.round(meta["base"]).astype(np.uint8))
        if named != base_id:
            raise ValueError(
                f"weight sync: adapter version is for base {named.hex()[:12]}, this worker's "
                f"base is {base_id.hex()[:12]} (start workers from the trainer's init_checkpoint)"
            )
        return lora.merged_state(base, {"lora": tree}, float(meta["scale"][0]))


def unpacked(
    plan: WirePlan, tensors: list[dict], buffer: Any, adapters: AdapterApplier | None
) -> Any:
    """A pulled version's parameters: whole weights by ``plan``, or adapters merged by ``adapters``.

    Whole weights share ``buffer``'s memory where they can (:meth:`WirePlan.alias`).
    """
    if is_adapter_version(tensors):
        if adapters is None:
            raise ValueError("weight sync: an adapter version, but this worker keeps no base")
        return adapters.apply(tensors, buffer)
    plan.check_layout(tensors)
    return plan.alias(buffer)
