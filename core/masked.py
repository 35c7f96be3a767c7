"""Reductions over the tokens a mask selects, shared by the trainer's metrics and the
algorithms' losses (one definition, so a metric and a loss never disagree on an empty mask)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jax

__all__ = ["masked_mean"]


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``x`` over the positions where ``mask`` is 1 (0 when the mask is empty)."""
    import jax.numpy as jnp

    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
