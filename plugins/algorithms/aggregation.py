"""Loss aggregation: how per-token values become one number.

This is the *aggregation weight* of the RLAX unified objective: every
algorithm computes a per-token value ``x[b, t]`` on the loss mask and one of
these reductions turns it into the scalar whose gradient is followed. The
choice changes which sequences dominate the gradient (long ones under
``token-mean``, every sequence equally under ``seq-mean-token-mean``) and is
the main difference between GRPO, DAPO and Dr.GRPO.

Shapes: the legend of :mod:`rlax.core.types` (B rows, L target positions).

References:
  Shao et al., 2024, DeepSeekMath (GRPO), https://arxiv.org/abs/2402.03300 (seq-mean-token-mean)
  Yu et al., 2025, DAPO, https://arxiv.org/abs/2503.14476 (token-mean)
  Liu et al., 2025, Dr.GRPO, https://arxiv.org/abs/2503.20783 (constant normaliser)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated

from rlax.core.constraints import AtLeast, OneOf
from rlax.core.masked import masked_mean

if TYPE_CHECKING:  # annotations only: the algorithm's settings are read where JAX is not
    import jax

AGGREGATIONS = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "seq-mean-token-sum",
)

# The aggregation's settings as an algorithm declares them (rlax.core.constraints).
AggregationMode = Annotated[str, OneOf(*AGGREGATIONS)]
MaxLen = Annotated[int, AtLeast(1, means="None: the generation budget")] | None


def completion_width(mask: jax.Array) -> jax.Array:
    """The generation budget read off the layout: the width of the completion region.

    In the trainer's layout (:func:`rlax.core.trainer.batches.make_batch`) every
    prompt is left-padded to the bucket P and every completion right-padded to
    the sampler's budget C, so the mask is [B, P + C - 1] and the first target
    position any row covers is P - 1: the width from there to the end is C,
    Dr.GRPO's :math:`L_{max}`, whatever the prompt bucket. For a layout that
    starts completions at position 0 it is the mask's width. An all-empty mask
    gives its width (the loss is 0 then anyway).
    """
    import jax.numpy as jnp

    covered = jnp.any(mask > 0, axis=0)  # [L]
    first = jnp.argmax(covered)  # the first True (0 when none)
    return (mask.shape[-1] - first).astype(jnp.float32)


def aggregate(
    per_token: jax.Array,  # [B, L]
    mask: jax.Array,  # [B, L]
    mode: str,
    max_len: int | None = None,
    layout: jax.Array | None = None,  # [B, L]
) -> jax.Array:
    """Reduces a per-token value over the mask to a scalar.

    With :math:`m_{i,t}` the mask, :math:`|o_i| = \\sum_t m_{i,t}` and :math:`N`
    the number of rows with at least one token:

    - ``token-mean``: :math:`\\sum_{i,t} m x / \\sum_{i,t} m`.
    - ``seq-mean-token-mean``: :math:`\\frac1N \\sum_i \\frac{1}{|o_i|} \\sum_t m x`.
    - ``seq-mean-token-sum-norm``: :math:`\\frac1N \\sum_i \\frac{1}{L} \\sum_t m x`
      with the constant :math:`L` = ``max_len``; by default the generation
      budget as the layout holds it (:func:`completion_width` of ``layout``,
      the batch's loss mask, or of ``mask`` without one), never the mask's
      width, which also counts the prompt bucket. ``layout`` matters when
      ``mask`` has lost tokens the layout holds (an alignment mask dropping
      every row's first completion token must not shrink the constant).
    - ``seq-mean-token-sum``: :math:`\\frac1N \\sum_i \\sum_t m x` (a sequence is one
      action whose log-probability is the sum of its tokens').

    Rows without tokens (batch padding) count in no denominator.
    """
    import jax.numpy as jnp

    if mode == "token-mean":
        return masked_mean(per_token, mask)
    seq_tokens = jnp.sum(mask, axis=-1)
    has_tokens = (seq_tokens > 0).astype(per_token.dtype)
    n_seq = jnp.maximum(jnp.sum(has_tokens), 1.0)
    seq_sum = jnp.sum(per_token * mask, axis=-1)
    if mode == "seq-mean-token-mean":
        per_seq = seq_sum / jnp.maximum(seq_tokens, 1.0)
    elif mode == "seq-mean-token-sum-norm":
        per_seq = seq_sum / (max_len or completion_width(mask if layout is None else layout))
    elif mode == "seq-mean-token-sum":
        per_seq = seq_sum
    else:
        raise ValueError(f"unknown aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")
    return jnp.sum(per_seq * has_tokens) / n_seq


@dataclasses.dataclass(frozen=True)
class Aggregation:
    """A validated aggregation setting: ``mode`` and, for ``seq-mean-token-sum-norm``, L.

    Args:
      mode: one of :data:`AGGREGATIONS`.
      max_len: the constant L of ``seq-mean-token-sum-norm`` (Dr.GRPO's L_max);
        None means the generation budget read off the batch's layout
        (:func:`completion_width`: the completion region's width, which the
        trainer pads to exactly the sampler's ``max_new_tokens``).
    """

    mode: str = "seq-mean-token-mean"
    max_len: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {self.mode!r}; valid: {', '.join(AGGREGATIONS)}")
        if self.max_len is not None and self.max_len < 1:
            raise ValueError(f"aggregation max_len must be >= 1, got {self.max_len}")

    def __call__(
        self, per_token: jax.Array, mask: jax.Array, layout: jax.Array | None = None
    ) -> jax.Array:
        """``per_token`` reduced over ``mask``; ``layout``: the batch's loss mask, whose
        completion region is the default ``max_len`` (see :func:`aggregate`)."""
        return aggregate(per_token, mask, self.mode, self.max_len, layout)
