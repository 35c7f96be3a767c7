"""How the trainer's step runs (``rlax.trainer_settings`` in gin): microbatches, remat, dtype,
placements, and how many updates each rollout batch gives (epochs x minibatches)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from rlax.core.constraints import AtLeast, OneOf
from rlax.core.models.logprobs import DEFAULT_CHUNK_TOKENS
from rlax.core.models.routing_replay import REPLAY_MODES
from rlax.core.types import FLOAT_DTYPES

COMPUTE_DTYPES = FLOAT_DTYPES
#: ``remat``'s choices, each the name of its policy in ``jax.checkpoint_policies`` (None:
#: every activation saved), looked up where the step is built
#: (:func:`rlax.core.trainer.microbatch.remat_policy`): the settings import no JAX.
REMAT_POLICIES: dict[str, str | None] = {
    "none": None,
    "block": "nothing_saveable",
    "block_dots": "dots_with_no_batch_dims_saveable",
}
PLACEMENTS = ("sharded", "replicated")
#: How the step lays out the batch's sequences (:mod:`rlax.core.trainer.packing`).
PACKINGS = ("auto", "packed", "padded", "prefix")


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
        policy) with one more forward pass after the update. Off by default:
        no objective uses it and it costs a forward pass (a fifth of the
        step); the metric is then absent.
      packing: ``"padded"``: the model runs on the padded rows (every
        completion padded to the sampler's budget), one forward and backward
        pass, in ``microbatches`` row slices. ``"packed"``: the rows'
        sequences are packed end to end into rows of ``row_tokens``
        (:mod:`rlax.core.trainer.packing`) and the model runs on microbatches
        of at most ``microbatch_tokens`` tokens, only those that hold
        tokens (a forward pass more: the two-pass chain rule). ``"auto"``
        (default): per batch, whichever of the two is estimated cheaper
        (:func:`~rlax.core.trainer.packing.packed_is_cheaper`: tokens computed
        times passes, with attention's quadratic term): packed on ragged
        lengths, padded when rows are nearly full, prefix-shared when that is
        cheapest. ``"prefix"``: packed rows where each group's shared prefix
        is computed once and its completions attend to it
        (:mod:`rlax.core.trainer.prefix`). Every way the loss and its
        gradient are the same up to float rounding.
      microbatch_tokens: packed rows per microbatch x ``row_tokens`` stays
        within this budget (at least one row): memory follows it, not
        rows x the longest row.
      row_tokens: the packed rows' length; None: the padded row's width
        P + C, so every sequence fits. A sequence longer than it is refused
        (never split across rows).
      epochs / minibatches: optimiser updates per rollout batch
        (:mod:`rlax.core.trainer.epochs`): ``epochs`` passes over the batch,
        each split into ``minibatches`` minibatches of whole groups, shuffled
        by the run's seed and step; 1 x 1 is one update on the whole batch.
      logprob_chunk_tokens: the output head, softmax and their gradient run
        on at most this many tokens at a time
        (:mod:`rlax.core.models.logprobs`), so the batch's [B, T, V] logits
        never exist; smaller saves memory, larger saves loop steps.
      routing_replay: a mixture-of-experts policy's routing in the step:
        ``off`` (its own), ``rollout`` (R3: each rollout token goes to the
        experts the sampler recorded; :mod:`rlax.core.models.routing_replay`)
        or ``trainer`` (R2-style: with several updates per batch, each routes
        the batch as the trainer's first pass over it did; one update per
        batch routes itself).
      balance_bias_rate: a mixture-of-experts policy with a balancing bias
        (``MoeConfig.router_bias``, DeepSeek-V3): after each update the bias
        moves by this much per expert toward balance,
        b_e += rate * sign(mean load - load_e), the load counted over the
        update's tokens (:func:`rlax.core.models.moe.balance_bias`; the bias
        is never a gradient parameter). 0: the bias stays as loaded.
        DeepSeek-V3's gamma is 0.001.
      lagged_mismatch: measure the train/rollout mismatch of tokens sampled one
        version back under that version's weights (:mod:`rlax.core.trainer.mismatch`):
        the trainer keeps the previous version's parameters (one more copy of
        the policy) and runs one forward pass without gradient over a batch
        that holds such tokens. False: only tokens sampled by the version being
        updated are measured (free); with rollouts one version stale that is
        none, and the metrics are absent. With several trainer processes only
        those are measured either way.
      attention_block: 0 (default): training attention is dense, every query of a row
        scored against every key and masked after. N > 0: rows are cut into N x N
        blocks and only the blocks the mask reaches are computed
        (:mod:`rlax.core.models.block_attention`): a causal row skips half its
        scores, a packed row those across its sequences, a prefix-shared row those
        between branches; no [T, T] score matrix is kept for the backward pass.
        Not with a ``context`` mesh axis (its attention gathers keys and values).
    """

    microbatches: Annotated[int, AtLeast(1)] = 1
    remat: Annotated[str, OneOf(*REMAT_POLICIES)] = "none"
    compute_dtype: Annotated[str, OneOf(*COMPUTE_DTYPES)] = "float32"
    reference_placement: Annotated[str, OneOf(*PLACEMENTS)] = "sharded"
    critic_placement: Annotated[str, OneOf(*PLACEMENTS)] = "sharded"
    post_update_kl: bool = False
    epochs: Annotated[int, AtLeast(1)] = 1
    minibatches: Annotated[int, AtLeast(1)] = 1
    logprob_chunk_tokens: Annotated[int, AtLeast(1)] = DEFAULT_CHUNK_TOKENS
    packing: Annotated[str, OneOf(*PACKINGS)] = "auto"
    microbatch_tokens: Annotated[int, AtLeast(1)] = 8192
    row_tokens: Annotated[int, AtLeast(2, means="None: the padded row's width")] | None = None
    routing_replay: Annotated[str, OneOf(*REPLAY_MODES)] = "off"
    balance_bias_rate: Annotated[float, AtLeast(0, means="0: the bias stays")] = 0.001
    lagged_mismatch: bool = True
    attention_block: Annotated[int, AtLeast(0, means="0: dense attention")] = 0

    def __post_init__(self) -> None:
        positive = ("microbatches", "epochs", "minibatches", "logprob_chunk_tokens")
        for field in (*positive, "microbatch_tokens"):
            if getattr(self, field) < 1:
                raise ValueError(
                    f"TrainerSettings.{field} must be >= 1, got {getattr(self, field)}"
                )
        for field, valid in (
            ("remat", REMAT_POLICIES),
            ("compute_dtype", COMPUTE_DTYPES),
            ("reference_placement", PLACEMENTS),
            ("critic_placement", PLACEMENTS),
            ("packing", PACKINGS),
        ):
            if getattr(self, field) not in valid:
                raise ValueError(
                    f"TrainerSettings.{field}={getattr(self, field)!r}; valid: {', '.join(valid)}"
                )
        if self.attention_block < 0:
            raise ValueError(
                f"TrainerSettings.attention_block must be >= 0, got {self.attention_block}"
            )
        if self.balance_bias_rate < 0:
            raise ValueError(
                f"TrainerSettings.balance_bias_rate must be >= 0, got {self.balance_bias_rate}"
            )
        if self.row_tokens is not None and self.row_tokens < 2:
            raise ValueError(f"TrainerSettings.row_tokens must be >= 2, got {self.row_tokens}")
