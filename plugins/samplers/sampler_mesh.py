"""A sampler over a mesh: the trainer's sharding rules on the sampler's devices.

``samplers.jax.mesh`` / ``samplers.engine.mesh`` (a :class:`~rlax.core.parallel.mesh.MeshConfig`)
puts a sampler on a mesh of its devices, so a model larger than one device samples and
every device of the sampler works::

    samplers.jax.mesh = @sampler/rlax.mesh()
    sampler/rlax.mesh.data = 1
    sampler/rlax.mesh.fsdp = 1
    sampler/rlax.mesh.tensor = -1

The weights are laid out by the trainer's rules
(:data:`~rlax.core.parallel.mesh.DEFAULT_RULES`: heads, MLP units and vocabulary over
``tensor``, the other large dimension over ``fsdp``); the KV caches ``[B, K, ...]`` split
their key/value heads over ``tensor`` and their rows over ``data x fsdp`` where those
divide, and everything else is replicated. XLA (GSPMD) partitions the programs between
those layouts; the programs are the same ``jax.jit`` ones as on one device.

A jitted function is compiled once per input layout, and XLA chooses the layout of what
a program returns: so every array the sampler keeps between calls (the KV cache, the
engine's slots) is put back on its canonical layout after each call
(:meth:`SamplerMesh.place`; free when XLA already chose it), which keeps steady-state
sampling at one program per shape, as on one device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rlax.core.parallel.mesh import BATCH_AXES, MeshConfig, make_mesh, tree_shardings

__all__ = ["SamplerMesh"]


class SamplerMesh:
    """Where a sampler's arrays live on its devices.

    Args:
      config: the mesh's axis sizes.
      devices: the sampler's devices (default: every device this process sees).
    """

    def __init__(self, config: MeshConfig, devices: Sequence[Any] | None = None):
        self.mesh = make_mesh(config, jax.local_devices() if devices is None else devices)
        self._rows = int(np.prod([self.mesh.shape[a] for a in BATCH_AXES]))
        self._heads = self.mesh.shape["tensor"]

    @classmethod
    def of(cls, config: MeshConfig | None, devices: Sequence[Any] | None) -> SamplerMesh | None:
        """A sampler's mesh: ``config`` over ``devices``; devices alone: tensor parallel over
        them (a sub-mesh given by one-process placement); neither: None (one device)."""
        if config is None and devices is None:
            return None
        return cls(config or MeshConfig(data=1, fsdp=1, tensor=-1), devices)

    def weights(self, state: Any) -> Any:
        """``state`` laid out by the trainer's rules on this mesh."""
        return jax.device_put(state, tree_shardings(state, self.mesh))

    def spec(self, shape: Sequence[int]) -> PartitionSpec:
        """The canonical layout of a kept array: a rank-4 cache ``[B, K, ...]`` splits its
        rows over ``(data, fsdp)`` and its heads over ``tensor`` where they divide;
        anything else is replicated."""
        if len(shape) != 4:
            return PartitionSpec()
        rows = BATCH_AXES if shape[0] % self._rows == 0 else None
        heads = "tensor" if shape[1] % self._heads == 0 else None
        return PartitionSpec(rows, heads, None, None)

    def place(self, tree: Any) -> Any:
        """Every array of ``tree`` on its canonical layout (no copy when it is already)."""

        def put(x: Any) -> Any:
            sharding = NamedSharding(self.mesh, self.spec(np.shape(x)))
            # Equal, not just equivalent: jit keys its programs on the sharding itself.
            if isinstance(x, jax.Array) and x.sharding == sharding:
                return x
            return jax.device_put(x, sharding)

        return jax.tree.map(put, tree)
