"""Critics are a plugin kind: a test module's critic trains in PPO's step through gin, the
built-ins load through their entry points, and a misspelt critic is one line naming the
valid ones."""

from __future__ import annotations

import gin
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from toy_groups import toy_batch

from rlax.core import config, hookimpl
from rlax.core.errors import ConfigError
from rlax.core.masked import masked_mean
from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer
from rlax.core.plugins import build_plugin_manager
from rlax.core.trainer.step import Trainer, batch_arrays
from rlax.plugins.algorithms.ppo import ppo
from rlax.plugins.critics.head import HeadCritic
from rlax.plugins.critics.separate import SeparateCritic

CFG = TransformerConfig(
    vocab_size=9, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)


class Constant(nnx.Module):
    def __init__(self, init: float):
        self.v = nnx.Param(jnp.asarray(init, jnp.float32))


class ConstantCritic:
    """A toy third-party critic: one learned number, V = v for every prefix.

    It reads neither the policy nor its hidden states: the core cannot know it.
    """

    def __init__(self, *, init: float = 0.0):
        self.init = init

    def build(self, policy, rngs):
        return Constant(self.init)

    def values(self, module, policy, hidden, tokens, attention_mask):
        return jnp.broadcast_to(module.v[...], tokens.shape)


class ConstantPlugin:
    @hookimpl
    def rlax_register_critics(self):
        return {"constant": ConstantCritic}


@pytest.fixture
def with_constant():
    pm = build_plugin_manager(autoload=False, extra=[ConstantPlugin()])
    yield pm
    gin.clear_config()


def ppo_from_gin(pm, *bindings: str):
    config.parse([], list(bindings), plugins=pm)
    return config.configured("algorithms", "ppo")()


def batch():
    return toy_batch(ppo())


def test_hook_rlax_register_critics(with_constant):
    assert with_constant.get("critics", "constant").factory is ConstantCritic
    algo = ppo_from_gin(
        with_constant,
        "algorithms.ppo.value_model = @critics.constant()",
        "algorithms.ppo.vf_coef = 1.0",
    )
    assert isinstance(algo.value_model, ConstantCritic)  # gin built it
    lr = 0.1
    trainer = Trainer(Transformer(CFG, rngs=nnx.Rngs(0)), algo, optax.sgd(lr))
    assert jax.tree.leaves(trainer.state.critic) == [0.0]  # what build made, nothing else

    b = batch()
    first = trainer.step(b)
    # V = 0: the value loss is 1/2 mean R^2 over the loss mask, R the GAE returns of V = 0,
    # and one SGD step moves v by -lr * vf_coef * mean(V - R) = lr * mean R.
    arrays = jax.tree.map(jnp.asarray, batch_arrays(b))
    mask = arrays["loss_mask"]
    returns = algo.batch_terms(
        dict(arrays, train_logprobs=arrays["old_logprobs"], old_values=jnp.zeros_like(mask))
    )["batch_returns"]
    assert first["value_loss"] == pytest.approx(0.5 * float(masked_mean(returns**2, mask)))
    assert first["value_loss"] > 0 and first["value_mean"] == 0.0
    moved = lr * float(masked_mean(returns, mask))
    assert float(trainer.state.critic["v"][...]) == pytest.approx(moved, rel=1e-5)
    second = trainer.step(b)
    assert second["value_mean"] == pytest.approx(moved, rel=1e-5)  # the values changed


def test_the_loss_carries_the_critic_s_term(with_constant):
    # Same policy, same critic, same batch: the losses differ by the change in vf_coef
    # times the value loss, so the step's loss includes the critic's term.
    losses = []
    for coef in (0.5, 1.0):
        algo = ppo_from_gin(
            with_constant,
            "algorithms.ppo.value_model = @critics.constant()",
            "critics.constant.init = 0.25",
            f"algorithms.ppo.vf_coef = {coef}",
        )
        trainer = Trainer(Transformer(CFG, rngs=nnx.Rngs(0)), algo, optax.sgd(0.1))
        losses.append(trainer.step(batch()))
    half, whole = losses
    assert half["value_loss"] == pytest.approx(whole["value_loss"]) and half["value_loss"] > 0
    assert whole["loss"] - half["loss"] == pytest.approx(0.5 * whole["value_loss"], rel=1e-5)
    assert half["value_mean"] == pytest.approx(0.25)  # the critic gin configured


def test_the_built_ins_come_through_their_entry_points():
    pm = build_plugin_manager(autoload=False)
    assert {n: (c.plugin, c.distribution) for n, c in pm.registry("critics").items()} == {
        "head": ("head_critic", "rlax-llm"),
        "separate": ("separate_critic", "rlax-llm"),
    }
    assert pm.get("critics", "head").factory is HeadCritic
    assert pm.get("critics", "separate").factory is SeparateCritic
    algo = ppo_from_gin(pm, "algorithms.ppo.value_model = @critics.separate()")
    gin.clear_config()
    assert algo.value_model == SeparateCritic()


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        (
            "algorithms.ppo.value_model = @critics.hed()",
            (
                "--gin.algorithms.ppo.value_model = @critics.hed(): No configurable matching "
                "reference '@critics.hed()'. No critics plugin is named 'hed'; valid "
                "critics: constant, head, separate"
            ),
        ),
        (
            "algorithms.ppo.value_model = 'separate'",
            (
                "--gin.algorithms.ppo.value_model = 'separate': algorithms.ppo.value_model: "
                "expected Critic, got str; build one by reference, e.g. @critics.separate() "
                "(valid critics: constant, head, separate)"
            ),
        ),
    ],
    ids=["misspelt", "a-name"],
)
def test_a_bad_critic_in_gin_is_one_line_naming_the_valid_ones(with_constant, binding, message):
    with pytest.raises(ConfigError) as info:
        config.parse([], [binding], plugins=with_constant)
    assert str(info.value) == message


def test_a_name_for_a_critic_in_python_is_one_line_naming_the_valid_ones():
    build_plugin_manager(autoload=False)  # gin knows the built-ins
    with pytest.raises(ValueError) as info:
        ppo(value_model="hed")  # type: ignore[arg-type]
    assert str(info.value) == (
        "ppo: value model 'hed' is a name, not a critic: give the critic, in gin "
        "@critics.NAME(); valid critics: head, separate"
    )
