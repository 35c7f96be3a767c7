"""The optimiser as a setting (rlax.core.trainer.optimizer): optax's functions declared
without importing optax, built by the trainer into what optax itself builds."""

from __future__ import annotations

import inspect

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlax.core.trainer.optimizer import (
    OptaxCall,
    adam,
    build_optimizer,
    clipped_optimizer,
    linear_schedule,
    optax_configurables,
)


@pytest.mark.parametrize("name", sorted(optax_configurables()))
def test_each_function_is_declared_with_optax_s_own_parameters_and_defaults(name):
    ours = inspect.signature(optax_configurables()[name]).parameters.values()
    theirs = inspect.signature(getattr(optax, name)).parameters.values()
    assert [(p.name, p.kind, p.default) for p in ours] == [
        (p.name, p.kind, p.default) for p in theirs
    ]


def _updates(transformation, steps: int = 3) -> list[np.ndarray]:
    params = {"w": jnp.zeros(3)}
    state = transformation.init(params)
    out = []
    for i in range(steps):
        grads = {"w": jnp.asarray([3.0, -4.0, 0.5]) * (i + 1)}  # norm > 1: clipping acts
        updates, state = transformation.update(grads, state, params)
        out.append(np.asarray(updates["w"]))
    return out


def test_the_packaged_optimizer_builds_what_optax_builds_by_hand():
    recipe = clipped_optimizer(
        inner=adam(
            learning_rate=linear_schedule(init_value=0.0, end_value=1e-3, transition_steps=4)
        ),
        max_grad_norm=0.5,
    )
    by_hand = optax.chain(
        optax.clip_by_global_norm(0.5), optax.adam(optax.linear_schedule(0.0, 1e-3, 4))
    )
    for got, want in zip(_updates(recipe.build()), _updates(by_hand), strict=True):
        np.testing.assert_array_equal(got, want)


def test_adam_s_first_step_is_minus_the_rate_times_the_gradient_s_sign():
    # Adam's first update is -lr * m_hat / (sqrt(v_hat) + eps) = -lr * g / (|g| + eps):
    # clipping scales g and leaves its sign, so the step is -lr * sign(g) (to eps / |g|).
    recipe = clipped_optimizer(inner=adam(learning_rate=0.01), max_grad_norm=1.0)
    first = _updates(build_optimizer(recipe), steps=1)[0]
    np.testing.assert_allclose(first, [-0.01, 0.01, -0.01], rtol=1e-5)


def test_a_recipe_is_a_value_and_a_built_transformation_is_taken_as_it_is():
    assert adam(learning_rate=0.1) == OptaxCall(
        "adam",
        {
            "learning_rate": 0.1,
            "b1": 0.9,
            "b2": 0.999,
            "eps": 1e-8,
            "eps_root": 0.0,
            "mu_dtype": None,
            "nesterov": False,
        },
    )
    built = optax.sgd(0.1)
    assert build_optimizer(built) is built
