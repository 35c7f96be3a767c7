"""Optimiser composition for gin: gin cannot pass ``optax.chain``'s varargs."""

from __future__ import annotations

import optax


def clipped_optimizer(
    *, inner: optax.GradientTransformation, max_grad_norm: float = 1.0
) -> optax.GradientTransformation:
    """``inner`` applied to gradients first clipped to global norm ``max_grad_norm``.

    In gin::

        rlax.train.optimizer = @rlax.clipped_optimizer()
        rlax.clipped_optimizer.inner = @optax.adam()
        optax.adam.learning_rate = @optax.linear_schedule()
    """
    if max_grad_norm <= 0:
        raise ValueError(f"clipped_optimizer: max_grad_norm must be > 0, got {max_grad_norm}")
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), inner)
