"""How the trainer's step runs (``rlax.trainer_settings`` in gin): microbatches, remat, dtype,
placements, and how many updates each rollout batch gives (epochs x minibatches)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import jax.numpy as jnp

from rlax.core.constraints import AtLeast, OneOf
from rlax.core.models.logprobs import DEFAULT_CHUNK_TOKENS
from rlax.core.trainer.microbatch import REMAT_POLICIES

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
PLACEMENTS = ("sharded", "replicated")


@dataclasses.dataclass(frozen=True)
class TrainerSettings:
    """How the step runs; none of it but ``epochs``/``minibatches`` changes the update
    beyond float rounding.

    In gin (``rlax.trainer_settings``)::

        rlax.trainer_settings.microbatches = 4
        rlax.trainer_settings.compute_dtype = "bfloat16"

    Attributes:
      microbatches: the batch is processed in this many row slices
        (``lax.scan``); rows must be a multiple of it.
      remat: rematerialise each decoder block in the backward pass:
        ``"none"``, ``"block"`` (save nothing) or ``"block_dots"`` (save the
        weight matmuls' outputs, recompute the rest).
      compute_dtype: ``"float32"`` or ``"bfloat16"``. Parameters and
        optimiser state stay float32 (master weights); the forward and
        backward passes run on a cast copy; logits and the loss are float32.
      reference_placement / critic_placement: ``"sharded"`` (by the rules,
        like the policy) or ``"replicated"`` (a whole copy on every device:
        more memory, no gathers).
      post_update_kl: measure ``kl_old`` (how far the update moved the
        policy) with one more forward pass after the update; off, the metric
        is absent and the step costs a forward pass less.
      epochs / minibatches: optimiser updates per rollout batch
        (:mod:`rlax.core.trainer.epochs`): ``epochs`` passes over the batch,
        each split into ``minibatches`` minibatches of whole groups, shuffled
        by the run's seed and step; 1 x 1 is one update on the whole batch.
      logprob_chunk_tokens: the output head, softmax and their gradient run
        on at most this many tokens at a time
        (:mod:`rlax.core.models.logprobs`), so the batch's [B, T, V] logits
        never exist; smaller saves memory, larger saves loop steps.
    """

    microbatches: Annotated[int, AtLeast(1)] = 1
    remat: Annotated[str, OneOf(*REMAT_POLICIES)] = "none"
    compute_dtype: Annotated[str, OneOf(*COMPUTE_DTYPES)] = "float32"
    reference_placement: Annotated[str, OneOf(*PLACEMENTS)] = "sharded"
    critic_placement: Annotated[str, OneOf(*PLACEMENTS)] = "sharded"
    post_update_kl: bool = True
    epochs: Annotated[int, AtLeast(1)] = 1
    minibatches: Annotated[int, AtLeast(1)] = 1
    logprob_chunk_tokens: Annotated[int, AtLeast(1)] = DEFAULT_CHUNK_TOKENS

    def __post_init__(self) -> None:
        for field in ("microbatches", "epochs", "minibatches", "logprob_chunk_tokens"):
            if getattr(self, field) < 1:
                raise ValueError(
                    f"TrainerSettings.{field} must be >= 1, got {getattr(self, field)}"
                )
        for field, valid in (
            ("remat", REMAT_POLICIES),
            ("compute_dtype", COMPUTE_DTYPES),
            ("reference_placement", PLACEMENTS),
            ("critic_placement", PLACEMENTS),
        ):
            if getattr(self, field) not in valid:
                raise ValueError(
                    f"TrainerSettings.{field}={getattr(self, field)!r}; valid: {', '.join(valid)}"
                )
