"""How one step's passes are laid out: row microbatches, remat, activation sharding.

Microbatches (``TrainerSettings.microbatches``): the loss of many algorithms
is not a sum over rows (a token-mean over the whole batch, a group's
statistics), so averaging microbatch losses would change the update. The step
(:mod:`rlax.core.trainer.step`) instead runs the chain rule in two passes: a
forward scan over microbatches gives the whole batch's logprobs (and values)
without keeping activations; the algorithm's loss and its gradient with
respect to those per-token outputs are computed on the whole batch; a second
scan (:func:`accumulate_grads`) back-propagates each microbatch's slice of
that gradient through its forward pass and sums the parameter gradients. The
result is the one-batch gradient for any loss, at the cost of one extra
forward pass; activation memory is one microbatch's.

Around each decoder block (:func:`wrap_blocks`): rematerialisation
(``TrainerSettings.remat``) and, on a multi-device mesh, a sharding
constraint that keeps activations split by rows. Shapes: B batch rows, k
microbatches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rlax.core.models.layers import attend_in_blocks, split_sequence
from rlax.core.models.transformer import Transformer
from rlax.core.parallel import mesh as meshlib
from rlax.core.trainer.settings import REMAT_POLICIES

ModuleT = TypeVar("ModuleT", bound=nnx.Module)


def remat_policy(name: str) -> Any:
    """The JAX checkpoint policy of the ``remat`` setting ``name`` (None: save everything)."""
    policy = REMAT_POLICIES[name]
    return None if policy is None else getattr(jax.checkpoint_policies, policy)


class RematBlock(nnx.Module):
    """A decoder block whose activations are recomputed in the backward pass."""

    def __init__(self, block: nnx.Module, policy_name: str):
        self.block = block
        self.policy_name = policy_name

    def __call__(self, *args):
        graphdef, state = nnx.split(self.block)

        def run(state, *args):
            return nnx.merge(graphdef, state)(*args)

        return jax.checkpoint(run, policy=remat_policy(self.policy_name))(state, *args)


class BatchShardedBlock(nnx.Module):
    """A decoder block whose input and output activations [B, T, D] are split by rows
    over (data, fsdp), and by sequence over ``context`` when the mesh has one: FSDP then
    gathers the weights, never the activations."""

    def __init__(self, block: nnx.Module, sharding: NamedSharding):
        self.block = block
        self.sharding = sharding

    def __call__(self, x, *args):
        x, *rest = self.block(jax.lax.with_sharding_constraint(x, self.sharding), *args)
        return (jax.lax.with_sharding_constraint(x, self.sharding), *rest)


def cast_floats(tree: Any, dtype) -> Any:
    """Floating leaves of ``tree`` in ``dtype`` (the compute copy of fp32 master weights)."""
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )


def split_rows(x: jax.Array, k: int) -> jax.Array:
    """[B, ...] -> [k, B/k, ...]; microbatch i is rows i, i+k, ... so each device's
    rows split evenly between microbatches (no data moves between devices)."""
    return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)


def join_rows(x: jax.Array) -> jax.Array:
    """The inverse of :func:`split_rows`: [k, B/k, ...] -> [B, ...]."""
    return jnp.swapaxes(x, 0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def wrap_blocks(module: ModuleT, remat: str, mesh: Mesh, attention_block: int = 0) -> ModuleT:
    """Remat and activation layout around each decoder block of ``module`` (a live copy).

    ``module`` is a Transformer or anything holding some (a critic with a trunk
    of its own): the blocks of every Transformer in it are wrapped; a module
    without one (a value head) is returned as it is. ``attention_block`` > 0: their
    training attention computes only the blocks the mask reaches
    (:func:`~rlax.core.models.layers.attend_in_blocks`).
    """
    decoders = [m for _, m in nnx.iter_modules(module) if isinstance(m, Transformer)]
    for model in decoders:
        split_sequence(model, mesh, meshlib.BATCH_AXES)  # context > 1: gather K/V
        attend_in_blocks(model, attention_block)
        blocks: list[nnx.Module] = list(model.blocks)
        if remat != "none":
            blocks = [RematBlock(b, remat) for b in blocks]
        if mesh.size > 1:
            rows = NamedSharding(mesh, activation_spec(mesh))
            blocks = [BatchShardedBlock(b, rows) for b in blocks]
        model.blocks = nnx.List(blocks)  # type: ignore[arg-type]  # wrappers called as a Block
    return module


def activation_spec(mesh: Mesh) -> jax.sharding.PartitionSpec:
    """The layout of activations [B, T, D]: rows over (data, fsdp), the sequence over
    ``context`` when the mesh splits it."""
    if meshlib.context_size(mesh) > 1:
        return jax.sharding.PartitionSpec(meshlib.BATCH_AXES, meshlib.CONTEXT_AXIS)
    return jax.sharding.PartitionSpec(meshlib.BATCH_AXES)


def split_microbatches(batch: dict[str, jax.Array], k: int, mesh: Mesh) -> dict[str, jax.Array]:
    """Each array [B, ...] as [k, B/k, ...] (:func:`split_rows`), rows still over (data, fsdp)."""
    spec = jax.sharding.PartitionSpec(None, meshlib.BATCH_AXES)
    return {
        name: jax.lax.with_sharding_constraint(split_rows(x, k), NamedSharding(mesh, spec))
        for name, x in batch.items()
    }


def scan_forward(
    forward: Callable[[dict[str, jax.Array]], Any], batch: dict[str, jax.Array], k: int, mesh: Mesh
) -> Any:
    """``forward`` of the whole batch, one microbatch at a time (``lax.scan``; k = 1: one call).

    Pass 1 of the chain rule: the outputs' leaves come back joined, [B, ...].
    """
    if k == 1:
        return forward(batch)

    def body(_, mb):
        return None, forward(mb)

    _, outs = jax.lax.scan(body, None, split_microbatches(batch, k, mesh))
    return jax.tree.map(join_rows, outs)


def accumulate_grads(
    outputs: Callable[[Any, dict[str, jax.Array]], Any],
    trainable: Any,
    batch: dict[str, jax.Array],
    cotangent: Any,
    k: int,
    mesh: Mesh,
) -> Any:
    """Pass 2 of the chain rule: the sum over microbatches of d outputs / d trainable, transposed.

    Args:
      outputs: ``outputs(trainable, microbatch)``, the per-token outputs the loss reads.
      trainable: the parameters the gradient is taken with respect to.
      batch: the whole batch ([B, ...] arrays), split as :func:`split_microbatches` does.
      cotangent: d loss / d outputs on the whole batch ([B, ...] leaves).
      k: the number of microbatches.
      mesh: the mesh the rows are split over.
    """
    microbatches = split_microbatches(batch, k, mesh)
    cts = jax.tree.map(lambda x: split_rows(x, k), cotangent)

    def body(acc, xs):
        mb, ct = xs
        _, vjp = jax.vjp(lambda t: outputs(t, mb), trainable)
        (g,) = vjp(ct)
        return jax.tree.map(jnp.add, acc, g), None

    zeros = jax.tree.map(jnp.zeros_like, trainable)
    grads, _ = jax.lax.scan(body, zeros, (microbatches, cts))
    return grads


def unpack(packed: Any, index: jax.Array) -> Any:
    """Per-token outputs of packed rows ([R, W-1] leaves) in the padded layout [B, L].

    ``index`` [B, L] is the flat position in [R, W-1] of each padded target
    position (-1: none, which gets 0); :mod:`rlax.core.trainer.packing` makes it.
    The gather's transpose carries a loss's gradient back to the packed outputs.
    """

    def one(x):
        flat = x.reshape(-1)
        return jnp.where(index >= 0, flat[jnp.maximum(index, 0)], jnp.zeros((), x.dtype))

    return jax.tree.map(one, packed)


def used_microbatches(segments: jax.Array) -> jax.Array:
    """One past the last microbatch of [k, rows, W] segment ids that holds a token (0: none)."""
    used = jnp.any(segments > 0, axis=tuple(range(1, segments.ndim)))
    k = used.shape[0]
    return jnp.where(jnp.any(used), k - jnp.argmax(used[::-1]), 0)


def packed_forward(
    forward: Callable[[dict[str, jax.Array]], Any],
    inputs: dict[str, jax.Array],
    k: int,
    mesh: Mesh,
) -> Any:
    """``forward`` over the k microbatches of packed ``inputs`` that hold a sequence.

    ``inputs`` are [R, W] model inputs whose ``attention_mask`` holds segment
    ids; microbatches past the last one holding a token are skipped (a
    ``fori_loop`` with a traced trip count), so the work follows the batch's
    tokens while the shapes stay fixed. Their outputs are 0. Leaves come back
    [R, ...], as :func:`scan_forward`'s.
    """
    microbatches = split_microbatches(inputs, k, mesh)
    first = jax.tree.map(lambda x: x[0], microbatches)
    shapes = jax.eval_shape(forward, first)
    outs = jax.tree.map(lambda s: jnp.zeros((k, *s.shape), s.dtype), shapes)

    def body(i, outs):
        mb = jax.tree.map(
            lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), microbatches
        )
        return jax.tree.map(
            lambda buf, o: jax.lax.dynamic_update_index_in_dim(buf, o, i, 0), outs, forward(mb)
        )

    n = used_microbatches(microbatches["attention_mask"])
    outs = jax.lax.fori_loop(0, n, body, outs)
    return jax.tree.map(join_rows, outs)


def packed_accumulate_grads(
    outputs: Callable[[Any, dict[str, jax.Array]], Any],
    trainable: Any,
    inputs: dict[str, jax.Array],
    cotangent: Any,
    k: int,
    mesh: Mesh,
) -> Any:
    """:func:`accumulate_grads` over the packed microbatches that hold a sequence (the
    others' cotangent is 0: they add nothing)."""
    microbatches = split_microbatches(inputs, k, mesh)
    cts = jax.tree.map(lambda x: split_rows(x, k), cotangent)

    def body(i, acc):
        pick = functools.partial(jax.lax.dynamic_index_in_dim, index=i, keepdims=False)
        mb, ct = jax.tree.map(pick, microbatches), jax.tree.map(pick, cts)
        _, vjp = jax.vjp(lambda t: outputs(t, mb), trainable)
        (g,) = vjp(ct)
        return jax.tree.map(jnp.add, acc, g)

    n = used_microbatches(microbatches["attention_mask"])
    return jax.lax.fori_loop(0, n, body, jax.tree.map(jnp.zeros_like, trainable))
