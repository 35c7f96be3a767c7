"""The model's passes over a batch, padded or packed, and the loss's gradient through them.

The step (:mod:`rlax.core.trainer.step`) asks two things of a batch, whatever
its layout: the per-token outputs of a forward pass (logprobs, entropies,
values) in the padded layout [B, L] (:func:`forward_all`: the reference's and
the anchors' passes), and the loss with its gradient (:func:`loss_and_grads`).
A padded batch runs in ``microbatches`` row slices (one value-and-grad, or the
two-pass chain rule of :mod:`rlax.core.trainer.microbatch`); a packed batch
(:mod:`rlax.core.trainer.packing`, chosen on the host by :func:`arrange`)
runs its packed rows one token-budget microbatch at a time and gathers the
outputs into the padded layout, where the algorithm's loss runs unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rlax.core.parallel import mesh as meshlib
from rlax.core.parallel import multihost
from rlax.core.trainer import packing, prefix
from rlax.core.trainer.microbatch import (
    accumulate_grads,
    packed_accumulate_grads,
    packed_forward,
    scan_forward,
    unpack,
)
from rlax.core.trainer.settings import TrainerSettings

#: outputs(trainable, model inputs) -> ((logprobs, values or None) float32, entropy)
Outputs = Callable[[Any, dict[str, jax.Array]], tuple[tuple[jax.Array, Any], jax.Array]]


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """What the model reads of a batch: ``tokens`` and ``attention_mask`` [rows, width],
    the packed rows and their segment ids for a packed batch, and the sampler's kept
    sets ``kept_floor`` [rows, width - 1] when the batch brings them."""
    if packing.PACKED_TOKENS in batch:
        inputs = {
            "tokens": batch[packing.PACKED_TOKENS],
            "attention_mask": batch[packing.PACKED_SEGMENTS],
        }
        if packing.PACKED_FLOOR in batch:
            inputs["kept_floor"] = batch[packing.PACKED_FLOOR]
        if packing.PACKED_ROUTES in batch:  # routing replay: each token's recorded experts
            inputs["routes"] = batch[packing.PACKED_ROUTES]
        return inputs
    inputs = {"tokens": batch["tokens"], "attention_mask": batch["attention_mask"]}
    if "kept_floor" in batch:  # the sampler's kept sets: the head truncates as it did
        inputs["kept_floor"] = batch["kept_floor"]
    if "routes" in batch:  # routing replay: each token's recorded experts
        inputs["routes"] = batch["routes"]
    return inputs


def rows_per_microbatch(settings: TrainerSettings, mesh: Mesh, width: int, rows: int) -> int:
    """Packed rows of ``width`` tokens per microbatch of a ``rows``-row batch on ``mesh``."""
    budget, multiple = settings.microbatch_tokens, meshlib.batch_size_multiple(mesh)
    return packing.rows_per_microbatch(budget, width, rows, multiple)


def prefix_layout(
    arrays: dict[str, Any], settings: TrainerSettings, mesh: Mesh, embed_dim: int
) -> tuple[float, Callable[[], dict[str, Any]]]:
    """(estimated cost, the layout) of ``arrays`` prefix-shared (:mod:`.prefix`), its rows
    as wide as the longest tree needs (:func:`~rlax.core.trainer.prefix.width_for`)."""
    tokens, mask, loss = (np.asarray(arrays[k]) for k in ("tokens", "attention_mask", "loss_mask"))
    rows, padded_width = mask.shape
    longest = max((i.length for i in prefix.plan(tokens, mask, loss, 1 << 30).items), default=1)
    width = prefix.width_for(
        settings.row_tokens or padded_width, longest, settings.microbatch_tokens
    )
    width = -(-width // meshlib.context_size(mesh)) * meshlib.context_size(mesh)
    tree = prefix.plan(tokens, mask, loss, width)
    budget_rows = rows_per_microbatch(settings, mesh, width, rows)
    k, per = packing.layout(tree.used, rows, budget_rows, meshlib.batch_size_multiple(mesh))
    microbatches = max(1, -(-tree.used // per))
    cost = packing.step_cost(microbatches * per, width, 3 if k == 1 else 4, embed_dim)
    as_arrays = {key: np.asarray(v) for key, v in arrays.items()}
    return cost, lambda: prefix.pack(as_arrays, width, per, tree, k)


def shareable(arrays: dict[str, Any], token_ids: bool) -> str:
    """Why ``arrays`` cannot be prefix-shared ('' if they can)."""
    if token_ids:
        return "LoRA dropout draws a mask per row's token (rlax.lora.dropout > 0)"
    if jax.process_count() > 1:
        return "several processes each lay out their own rows"
    per_row = [key for key in prefix.PER_ROW_INPUTS if key in arrays]
    return f"the batch brings per-row token inputs {per_row}" if per_row else ""


def arrange(
    arrays: dict[str, Any],
    settings: TrainerSettings,
    mesh: Mesh,
    embed_dim: int,
    token_ids: bool = False,
) -> dict[str, Any]:
    """``arrays`` as the step will run them: padded, packed or prefix-shared
    (``TrainerSettings.packing``).

    A padded batch (``tokens``/``attention_mask``) is packed when packing is on, or under
    ``"auto"`` when :func:`~rlax.core.trainer.packing.packed_is_cheaper` (with several
    processes: when it is for every process's rows, so all choose alike); a batch that is
    already packed stays. With several processes each packs its own rows into its own
    packed rows of the global layout (:func:`~rlax.core.trainer.packing.pack`).
    ``"prefix"`` shares each group's prefix (:mod:`rlax.core.trainer.prefix`); ``"auto"``
    picks it when its estimated cost is the lowest of the three and the batch is
    :func:`shareable` (``token_ids``: the model reads token identities, LoRA dropout).
    """
    mode = settings.packing
    if "tokens" not in arrays:
        return arrays
    packing.check_targets(arrays)
    if mode == "padded":
        return arrays
    refused = shareable(arrays, token_ids) if mode in ("auto", "prefix") else "not asked"
    if mode == "prefix":
        if refused:
            raise ValueError(f"rlax.trainer_settings.packing='prefix': {refused}; use 'packed'")
        return prefix_layout(arrays, settings, mesh, embed_dim)[1]()
    tree = None if refused else prefix_layout(arrays, settings, mesh, embed_dim)
    mask = np.asarray(arrays["attention_mask"])
    local_rows, padded_width = mask.shape
    processes = jax.process_count()
    rows = local_rows * processes  # the global batch's
    width = settings.row_tokens or padded_width
    width = -(-width // meshlib.context_size(mesh)) * meshlib.context_size(mesh)  # even splits
    plan = packing.plan(mask, width)
    used = plan.used
    if processes > 1:  # each packs its own rows: the layout fits the fullest
        from jax.experimental import multihost_utils

        used = int(np.max(multihost_utils.process_allgather(np.asarray(used)))) * processes
    budget_rows = rows_per_microbatch(settings, mesh, width, rows)
    k, per = packing.layout(used, rows, budget_rows, meshlib.batch_size_multiple(mesh))
    if mode == "auto":
        passes = 3 if settings.microbatches == 1 else 4
        one_microbatch = k == 1  # one pass, as padded in one slice
        cheaper = packing.packed_is_cheaper(
            local_rows,
            padded_width,
            passes,
            plan,
            width,
            per // processes,
            embed_dim,
            packed_passes=3 if one_microbatch else 4,
        )
        if processes > 1:
            from jax.experimental import multihost_utils

            cheaper = bool(np.all(multihost_utils.process_allgather(np.asarray(cheaper))))
        packed_cost = packing.step_cost(
            max(1, -(-plan.used // per)) * per, width, 3 if one_microbatch else 4, embed_dim
        )
        padded_cost = packing.step_cost(local_rows, padded_width, passes, embed_dim)
        if tree is not None and tree[0] < min(packed_cost, padded_cost):
            return tree[1]()
        if not cheaper:
            return arrays
    owned = multihost.process_rows(mesh, k * per) if processes > 1 else None
    row_ids = multihost.process_rows(mesh, rows) if processes > 1 else None
    arrays = {key: np.asarray(v) for key, v in arrays.items()}
    return packing.pack(arrays, width, per, plan, owned=owned, k=k, row_ids=row_ids)


@dataclasses.dataclass(frozen=True)
class Passes:
    """How a batch's passes run: ``microbatches`` row slices of a padded batch, or the
    packed microbatch slots of a packed one; on ``mesh``. ``token_ids``: the model reads
    each token's padded-layout identity too (LoRA dropout, :func:`model_inputs`)."""

    settings: TrainerSettings
    mesh: Mesh
    token_ids: bool = False

    def inputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        """:func:`model_inputs`, plus ``token_ids`` [rows, width] when asked: each token's
        identity in the padded layout (row x T + column; a packed batch brings its own)."""
        out = model_inputs(batch)
        if self.token_ids:
            if packing.PACKED_IDS in batch:
                out["token_ids"] = batch[packing.PACKED_IDS]
            else:  # padded: the step's rows are the global batch's
                rows, width = out["tokens"].shape
                out["token_ids"] = jnp.arange(rows * width, dtype=jnp.int32).reshape(rows, width)
        return out

    def _slots(self, batch: dict[str, Any]) -> int:
        """k, the microbatch slots of a packed batch (from its shapes)."""
        rows, width = batch[packing.PACKED_TOKENS].shape
        budget_rows = rows_per_microbatch(self.settings, self.mesh, width, len(batch["loss_mask"]))
        return packing.microbatch_slots(rows, budget_rows)

    def forward_all(self, forward: Callable[[dict[str, jax.Array]], Any], batch) -> Any:
        """``forward`` of the whole batch (no gradient), one microbatch at a time: the
        outputs' leaves [B, L] (a packed batch's gathered into the padded layout)."""
        inputs = self.inputs(batch)
        if packing.PACKED_TOKENS not in batch:
            return scan_forward(forward, inputs, self.settings.microbatches, self.mesh)
        out = packed_forward(forward, inputs, self._slots(batch), self.mesh)
        return unpack(out, batch[packing.UNPACK_INDEX])

    def loss_and_grads(
        self,
        outputs: Outputs,
        loss: Callable[[jax.Array, Any], tuple[jax.Array, dict]],
        trainable: Any,
        batch: dict[str, jax.Array],
    ):
        """(loss, metrics, logp, entropy, grads) of ``loss(logp, values)`` over the batch.

        One slice (a padded batch without microbatches, or a packed batch whose rows make
        one microbatch): one value-and-grad. Otherwise the two-pass chain rule:
        the outputs of the whole batch without gradient, the loss's gradient with respect
        to them, then each microbatch's slice of it back-propagated and summed. For a
        packed batch the loss reads the outputs gathered into the padded layout, so its
        cotangent comes back packed.
        """
        inputs = self.inputs(batch)
        packed = packing.PACKED_TOKENS in batch
        k = self._slots(batch) if packed else self.settings.microbatches
        index = batch[packing.UNPACK_INDEX] if packed else None

        def laid_out(x):
            return x if index is None else unpack(x, index)

        if k == 1:  # one slice (packed: one microbatch of rows): one pass through the gather

            def loss_fn(trainable):
                (logp, values), entropy = outputs(trainable, inputs)
                logp, entropy = laid_out(logp), laid_out(entropy)
                value, metrics = loss(logp, laid_out(values))
                return value, (metrics, logp, entropy)

            (value, (metrics, logp, entropy)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                trainable
            )
            return value, metrics, logp, entropy, grads
        # Pass 1: the outputs (packed ones stay packed: the loss gathers them).
        run = packed_forward if packed else scan_forward
        out, entropy = jax.lax.stop_gradient(
            run(lambda mb: outputs(trainable, mb), inputs, k, self.mesh)
        )

        # out = (logp, values), indexed: mypy miscounts ``*out`` followed by an argument.
        (value, metrics), cotangent = jax.value_and_grad(
            lambda o: loss(laid_out(o[0]), laid_out(o[1])), has_aux=True
        )(out)
        # Pass 2: each microbatch's slice of that cotangent, back-propagated and summed.
        accumulate = packed_accumulate_grads if packed else accumulate_grads
        grads = accumulate(
            lambda t, mb: outputs(t, mb)[0], trainable, inputs, cotangent, k, self.mesh
        )
        return value, metrics, laid_out(out[0]), laid_out(entropy), grads


def as_float32(logp: jax.Array, values: jax.Array | None) -> tuple[jax.Array, jax.Array | None]:
    """The outputs the loss reads, in float32."""
    return logp.astype(jnp.float32), None if values is None else values.astype(jnp.float32)
