"""The device mesh and the sharding rules: where every parameter and batch row lives.

The mesh has five named axes:

- ``data``: pure data parallelism; parameters are replicated across it.
- ``fsdp``: data parallelism whose parameters (and optimiser state) are split
  across it on their large dimension and gathered just before use (ZeRO-3).
- ``context``: context (sequence) parallelism: the trainer's activations are
  split along the sequence, so one long row's activations spread over its
  devices; attention gathers each layer's keys and values over it
  (:mod:`rlax.core.models.layers`). Parameters are replicated across it.
- ``tensor``: tensor (model) parallelism across attention heads, the MLP's
  hidden units and the vocabulary.
- ``expert``: expert parallelism: a mixture-of-experts layer's experts are
  split across it (E/n whole experts per device) and the batch's rows too, so
  outside the experts it is one more data-parallel axis; XLA moves each
  token to its experts' devices and back (:mod:`rlax.core.models.moe`).

A batch is split over ``(data, fsdp)`` on its leading dimension (and, inside
the step, over ``context`` on its sequence dimension). Everything else
follows from the rules: an ordered list of ``(pattern, spec)`` pairs where the
first pattern that ``re.search``-matches a parameter's name (``"blocks/0/attn/q/kernel"``)
gives one mesh axis (or None) per dimension. Optimiser state is laid out by the
same rules: its leaves are named after the parameters they mirror
(``"1/0/mu/blocks/0/attn/q/kernel"``), and a rule whose rank does not fit a
leaf (adam's scalar ``count``) leaves it replicated. A dimension not divisible
by its axis size is replicated instead, so one rule set serves every model size.

Shapes: the legend of :mod:`rlax.core.types` (V vocabulary, D embed dim, N query
heads, K key/value heads, H head dim, F MLP hidden dim).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np

from rlax.core.constraints import AtLeast, checked_by
from rlax.core.errors import BadSetting
from rlax.core.wire import leaf_name

if TYPE_CHECKING:  # the mesh's settings are read where no device is (the supervisor)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES = ("data", "fsdp", "context", "tensor", "expert")
BATCH_AXES = ("data", "fsdp", "expert")
CONTEXT_AXIS = "context"

Spec = tuple[str | tuple[str, ...] | None, ...]
Rule = tuple[str, Spec]

# Llama, Qwen2 (q/k/v bias) and Qwen3 (q/k norm) decoders and the critics of
# rlax.core.models.critic. FSDP splits the dimension that is not split by heads.
DEFAULT_RULES: tuple[Rule, ...] = (
    (r"(^|/)embed/embedding$", ("tensor", "fsdp")),  # [V, D]
    (r"(^|/)attn/(q|k|v)/kernel$", ("fsdp", "tensor")),  # [D, N*H] / [D, K*H]
    (r"(^|/)attn/(q|k|v)/bias$", ("tensor",)),  # [N*H] / [K*H]
    (r"(^|/)attn/o/kernel$", ("tensor", "fsdp")),  # [N*H, D]
    (r"(^|/)attn/o/bias$", (None,)),  # [D] (Llama's attention_bias)
    (r"(^|/)mlp/(gate|up)/kernel$", ("fsdp", "tensor")),  # [D, F]
    (r"(^|/)mlp/down/kernel$", ("tensor", "fsdp")),  # [F, D]
    (r"(^|/)head/kernel$", ("fsdp", "tensor")),  # [D, V]
    (r"(^|/)proj/kernel$", ("fsdp", None)),  # value head [D, 1]
    (r"(^|/)proj/bias$", (None,)),  # [1]
    (r"norm[^/]*/scale$", (None,)),  # RMSNorm scales [D] / q-k norm [H] or [N*H] (OLMoE)
    # Mixture-of-experts layers (rlax.core.models.moe): whole experts per device.
    (r"(^|/)mlp/router/kernel$", ("fsdp", None)),  # [D, E]
    (r"(^|/)mlp/router_bias$", (None,)),  # [E]
    (r"(^|/)experts/(gate|up)$", ("expert", "fsdp", "tensor")),  # [E, D, F]
    (r"(^|/)experts/down$", ("expert", "tensor", "fsdp")),  # [E, F, D]
    (r"(^|/)shared/(gate|up)/kernel$", ("fsdp", "tensor")),  # [D, F]
    (r"(^|/)shared/down/kernel$", ("tensor", "fsdp")),  # [F, D]
    (r"(^|/)shared/out_gate/kernel$", ("fsdp", None)),  # [D, 1]
)


# An axis's size: >= 1, or -1 for every device the other axes leave.
MeshAxis = Annotated[int, AtLeast(-1, means="-1: the devices left; 0 is no size")]


def _one_axis_left(
    *, data: int = 1, fsdp: int = -1, tensor: int = 1, expert: int = 1, context: int = 1, **_: Any
) -> None:
    """BadSetting for a size of 0 or for more than one axis of -1."""
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor, "expert": expert, "context": context}
    if zero := next((name for name, size in sizes.items() if size == 0), None):
        raise BadSetting(zero, "must be >= 1, or -1 (the devices left), got 0")
    if sum(size == -1 for size in sizes.values()) > 1:
        second = [name for name, size in sizes.items() if size == -1][1]
        raise BadSetting(second, "at most one axis may be -1 (the devices left), got two")


@checked_by(_one_axis_left)
@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the mesh axes; at most one may be -1 (all the devices left).

    In gin (``rlax.mesh``)::

        rlax.mesh.data = 2
        rlax.mesh.fsdp = -1
        rlax.mesh.tensor = 2
        rlax.mesh.expert = 4  # a MoE's experts over 4 devices (docs/models.md)
        rlax.mesh.context = 4  # long rows: each split over 4 devices (docs/mesh.md)
    """

    data: MeshAxis = 1
    fsdp: MeshAxis = -1
    tensor: MeshAxis = 1
    context: MeshAxis = 1
    expert: MeshAxis = 1

    def __post_init__(self) -> None:
        sizes = dataclasses.astuple(self)
        if sum(s == -1 for s in sizes) > 1:
            raise ValueError(f"mesh: at most one axis may be -1, got {self}")
        if any(s == 0 or s < -1 for s in sizes):
            raise ValueError(f"mesh: axis sizes must be positive or -1, got {self}")

    def shape(self, num_devices: int) -> tuple[int, ...]:
        """The axes' sizes in :data:`AXES` order for ``num_devices`` devices, -1 resolved."""
        sizes = tuple(getattr(self, axis) for axis in AXES)
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if num_devices % known:
                raise ValueError(
                    f"mesh {self}: {num_devices} devices are not a multiple of {known}"
                )
            sizes = tuple(num_devices // known if s == -1 else s for s in sizes)
        if math.prod(sizes) != num_devices:
            raise ValueError(f"mesh {self} needs {math.prod(sizes)} devices, have {num_devices}")
        return sizes


def make_mesh(config: MeshConfig | None = None, devices: Sequence[Any] | None = None) -> Mesh:
    """A (data, fsdp, context, tensor) mesh over ``devices`` (default: all, every process's).

    Axes are ``Auto``: the step states its in/out shardings and XLA (GSPMD)
    partitions everything between them.
    """
    import jax
    from jax.sharding import AxisType

    config = config or MeshConfig()
    devices = list(jax.devices() if devices is None else devices)
    shape = config.shape(len(devices))
    return jax.make_mesh(shape, AXES, (AxisType.Auto,) * len(AXES), devices=devices)


def single_device_mesh() -> Mesh:
    """The one-device mesh: the unsharded special case of every rule."""
    import jax

    return make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])


def param_name(path: tuple) -> str:
    """``"blocks/0/attn/q/kernel"`` for a pytree key path (an nnx ``.value`` suffix dropped)."""
    name = leaf_name(path)
    return name.removesuffix("/value") if name != "value" else ""


def _axis_size(mesh: Mesh, axis: str | tuple[str, ...] | None) -> int:
    if axis is None:
        return 1
    names = (axis,) if isinstance(axis, str) else axis
    return math.prod(mesh.shape[a] for a in names)


def spec_for(
    name: str, shape: Sequence[int], mesh: Mesh, rules: Sequence[Rule] = DEFAULT_RULES
) -> PartitionSpec:
    """The PartitionSpec of one array by the first matching rule.

    No match, or a rule of another rank, gives full replication; a dimension
    not divisible by its axes' size is replicated on that dimension.
    """
    from jax.sharding import PartitionSpec

    for pattern, spec in rules:
        if re.search(pattern, name):
            if len(spec) != len(shape):
                return PartitionSpec()
            return PartitionSpec(
                *(a if dim % _axis_size(mesh, a) == 0 else None for a, dim in zip(spec, shape))
            )
    return PartitionSpec()


def tree_specs(tree: Any, mesh: Mesh, rules: Sequence[Rule] = DEFAULT_RULES) -> Any:
    """A tree of PartitionSpecs, one per array leaf of ``tree`` (arrays or shape structs)."""
    import jax

    return jax.tree_util.tree_map_with_path(
        lambda path, x: spec_for(param_name(path), np.shape(x), mesh, rules), tree
    )


def tree_shardings(tree: Any, mesh: Mesh, rules: Sequence[Rule] = DEFAULT_RULES) -> Any:
    """A tree of NamedShardings laying ``tree`` out on ``mesh`` by ``rules``."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    return jax.tree.map(
        lambda spec: NamedSharding(mesh, spec),
        tree_specs(tree, mesh, rules),
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def replicated(mesh: Mesh) -> NamedSharding:
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec())


def batch_spec(rank: int) -> PartitionSpec:
    """Leading (batch) dimension over (data, fsdp); the rest whole."""
    from jax.sharding import PartitionSpec

    return PartitionSpec(BATCH_AXES, *([None] * (rank - 1)))


def batch_shardings(batch: Any, mesh: Mesh) -> Any:
    """NamedShardings splitting every array of ``batch`` over (data, fsdp) by rows."""
    import jax
    from jax.sharding import NamedSharding

    return jax.tree.map(lambda x: NamedSharding(mesh, batch_spec(np.ndim(x))), batch)


def context_size(mesh: Mesh) -> int:
    """How many devices split a row's sequence (the ``context`` axis's size; 1: none)."""
    return int(dict(mesh.shape).get(CONTEXT_AXIS, 1))


def batch_size_multiple(mesh: Mesh) -> int:
    """Rows of a global batch must be a multiple of this (the data x fsdp x expert size)."""
    return _axis_size(mesh, BATCH_AXES)


def describe(tree: Any, mesh: Mesh, rules: Sequence[Rule] = DEFAULT_RULES) -> dict[str, str]:
    """name -> ``"shape spec"`` for each leaf: the layout a rule set gives a model, for docs and logs."""
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    out = {}
    for path, x in leaves:
        name = param_name(path)
        out[name] = f"{tuple(np.shape(x))} {spec_for(name, np.shape(x), mesh, rules)}"
    return out
