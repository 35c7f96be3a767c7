"""The optimiser for gin: optax's optimisers and learning-rate schedules with their
constraints, and the composition gin cannot write (``optax.chain``'s varargs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import optax

from rlax.core.constraints import AtLeast, NonNegative, Positive, Range, constrained
from rlax.core.errors import BadSetting

# A learning rate a schedule passes through: 0 at a warm-up's start, never negative.
_RATE = Range(ge=0, means="a learning rate; below 0 the loss would go up")
_BETA = Range(ge=0, lt=1)
_NO_WARMUP = "for no warm-up set init_value to end_value"


def _not_zero_throughout(
    *, init_value: float | None = None, end_value: float | None = None, **_: Any
) -> None:
    """A linear schedule that is 0 from start to end trains nothing (both must be given)."""
    if init_value == 0 and end_value == 0:
        raise BadSetting(
            "end_value", "the learning rate would be 0 throughout (init_value and end_value 0)"
        )


def optax_configurables() -> dict[str, Callable[..., Any]]:
    """``optax.*`` as gin configurables: optax's own functions, their parameters constrained."""
    return {
        "adam": constrained(
            optax.adam,
            learning_rate=Positive,
            b1=_BETA,
            b2=_BETA,
            eps=Positive,
            eps_root=NonNegative,
        ),
        "adamw": constrained(
            optax.adamw,
            learning_rate=Positive,
            b1=_BETA,
            b2=_BETA,
            eps=Positive,
            eps_root=NonNegative,
            weight_decay=NonNegative,
        ),
        "sgd": constrained(optax.sgd, learning_rate=Positive, momentum=_BETA),
        "constant_schedule": constrained(optax.constant_schedule, value=Positive),
        "linear_schedule": constrained(
            optax.linear_schedule,
            _not_zero_throughout,
            init_value=_RATE,
            end_value=_RATE,
            transition_steps=AtLeast(1, means=_NO_WARMUP),
            transition_begin=NonNegative,
        ),
        "warmup_cosine_decay_schedule": constrained(
            optax.warmup_cosine_decay_schedule,
            init_value=_RATE,
            peak_value=Positive,
            warmup_steps=NonNegative,
            decay_steps=AtLeast(1),
            end_value=_RATE,
            exponent=Positive,
        ),
    }


def clipped_optimizer(
    *, inner: optax.GradientTransformation, max_grad_norm: Annotated[float, Positive] = 1.0
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
