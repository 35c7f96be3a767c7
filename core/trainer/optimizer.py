"""The optimiser for gin: optax's optimisers and learning-rate schedules with their
constraints, and the composition gin cannot write (``optax.chain``'s varargs).

A run's optimiser stays a setting until the trainer builds it. ``@optax.adam()`` in gin
makes an :class:`OptaxCall` -- which of optax's functions, with which arguments -- and
the trainer calls :func:`build_optimizer` on what ``rlax.train.optimizer`` holds. So the
processes that only read and check settings (the supervisor of ``--role all``, the
parameter server) import neither optax nor the JAX beneath it. Each function's
parameters are declared here with optax's own defaults, so gin refuses a misspelt
parameter and the constraints refuse a bad value before anything starts;
tests/core/test_optimizer.py holds the declarations to optax's signatures.

A configurable of one's own may hand ``rlax.train.optimizer`` a built optax
``GradientTransformation`` instead: :func:`build_optimizer` takes it as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from rlax.core.constraints import AtLeast, NonNegative, Positive, Range, checked_by
from rlax.core.errors import BadSetting

__all__ = ["OptaxCall", "build_optimizer", "clipped_optimizer", "optax_configurables"]

# A learning rate a schedule passes through: 0 at a warm-up's start, never negative.
_RATE = Range(ge=0, means="a learning rate; below 0 the loss would go up")
_BETA = Range(ge=0, lt=1)
_NO_WARMUP = "for no warm-up set init_value to end_value"


@dataclasses.dataclass(frozen=True)
class OptaxCall:
    """``optax.<function>(*args, **kwargs)``, made by :meth:`build` where the trainer runs.

    An argument that is itself an OptaxCall (a schedule, an inner optimiser) is built
    first; anything else is passed as it is.
    """

    function: str
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    args: tuple[Any, ...] = ()

    def build(self) -> Any:
        """What optax's function returns (a ``GradientTransformation`` or a schedule)."""
        import optax

        args = [_built(a) for a in self.args]
        return getattr(optax, self.function)(
            *args, **{k: _built(v) for k, v in self.kwargs.items()}
        )


#: A number as optax's functions take one (the scalars of ``jax.typing.ArrayLike``).
Numeric = bool | int | float | complex
#: A learning rate: a number or a schedule (one of those below, or a function of the step).
Rate = float | OptaxCall | Callable[..., Any]


def _built(value: Any) -> Any:
    return value.build() if isinstance(value, OptaxCall) else value


def build_optimizer(optimizer: Any) -> Any:
    """The optax ``GradientTransformation`` of ``rlax.train.optimizer``: an
    :class:`OptaxCall` built, a transformation built elsewhere as it is."""
    return _built(optimizer)


def _not_zero_throughout(
    *, init_value: float | None = None, end_value: float | None = None, **_: Any
) -> None:
    """A linear schedule that is 0 from start to end trains nothing (both must be given)."""
    if init_value == 0 and end_value == 0:
        raise BadSetting(
            "end_value", "the learning rate would be 0 throughout (init_value and end_value 0)"
        )


# -- optax's functions, as gin sees them (each parameter and default is optax's) ---------


def adam(
    learning_rate: Annotated[Rate, Positive],
    b1: Annotated[Numeric, _BETA] = 0.9,
    b2: Annotated[Numeric, _BETA] = 0.999,
    eps: Annotated[Numeric, Positive] = 1e-8,
    eps_root: Annotated[Numeric, NonNegative] = 0.0,
    mu_dtype: Any = None,
    *,
    nesterov: bool = False,
) -> OptaxCall:
    """``optax.adam``."""
    return OptaxCall("adam", dict(locals()))


def adamw(
    learning_rate: Annotated[Rate, Positive],
    b1: Annotated[Numeric, _BETA] = 0.9,
    b2: Annotated[Numeric, _BETA] = 0.999,
    eps: Annotated[Numeric, Positive] = 1e-8,
    eps_root: Annotated[Numeric, NonNegative] = 0.0,
    mu_dtype: Any = None,
    weight_decay: Annotated[Rate, NonNegative] = 1e-4,
    mask: Any = None,
    *,
    nesterov: bool = False,
) -> OptaxCall:
    """``optax.adamw``."""
    return OptaxCall("adamw", dict(locals()))


def sgd(
    learning_rate: Annotated[Rate, Positive],
    momentum: Annotated[Numeric, _BETA] | None = None,
    nesterov: bool = False,
    accumulator_dtype: Any = None,
) -> OptaxCall:
    """``optax.sgd``."""
    return OptaxCall("sgd", dict(locals()))


def constant_schedule(value: Annotated[Numeric, Positive]) -> OptaxCall:
    """``optax.constant_schedule``."""
    return OptaxCall("constant_schedule", dict(locals()))


@checked_by(_not_zero_throughout)
def linear_schedule(
    init_value: Annotated[Numeric, _RATE],
    end_value: Annotated[Numeric, _RATE],
    transition_steps: Annotated[int, AtLeast(1, means=_NO_WARMUP)],
    transition_begin: Annotated[int, NonNegative] = 0,
) -> OptaxCall:
    """``optax.linear_schedule``."""
    return OptaxCall("linear_schedule", dict(locals()))


def warmup_cosine_decay_schedule(
    init_value: Annotated[Numeric, _RATE],
    peak_value: Annotated[Numeric, Positive],
    warmup_steps: Annotated[int, NonNegative],
    decay_steps: Annotated[int, AtLeast(1)],
    end_value: Annotated[Numeric, _RATE] = 0.0,
    exponent: Annotated[Numeric, Positive] = 1.0,
) -> OptaxCall:
    """``optax.warmup_cosine_decay_schedule``."""
    return OptaxCall("warmup_cosine_decay_schedule", dict(locals()))


def optax_configurables() -> dict[str, Callable[..., OptaxCall]]:
    """``optax.*`` as gin configurables: optax's functions as settings, their parameters
    constrained."""
    return {
        "adam": adam,
        "adamw": adamw,
        "sgd": sgd,
        "constant_schedule": constant_schedule,
        "linear_schedule": linear_schedule,
        "warmup_cosine_decay_schedule": warmup_cosine_decay_schedule,
    }


def clipped_optimizer(*, inner: Any, max_grad_norm: Annotated[float, Positive] = 1.0) -> OptaxCall:
    """``inner`` applied to gradients first clipped to global norm ``max_grad_norm``
    (``optax.chain(optax.clip_by_global_norm(max_grad_norm), inner)`` once built).

    In gin::

        rlax.train.optimizer = @rlax.clipped_optimizer()
        rlax.clipped_optimizer.inner = @optax.adam()
        optax.adam.learning_rate = @optax.linear_schedule()
    """
    if max_grad_norm <= 0:
        raise ValueError(f"clipped_optimizer: max_grad_norm must be > 0, got {max_grad_norm}")
    clip = OptaxCall("clip_by_global_norm", {"max_norm": max_grad_norm})
    return OptaxCall("chain", args=(clip, inner))
