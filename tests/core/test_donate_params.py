"""A trainer that donates its parameters: the same update, one copy of the weights less."""

from __future__ import annotations

import jax
import numpy as np
import optax
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.lora_config import LoraConfig
from rlax.core.models.transformer import Transformer
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.step import Trainer
from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.algorithms.grpo import grpo

CFG = TransformerConfig(
    vocab_size=9, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)


def batch(algo):
    rng = np.random.default_rng(0)
    groups = []
    for i in range(2):
        prompt = Prompt(str(i), "", rng.integers(3, 9, size=3).astype(np.int32), "")
        comps = tuple(
            Completion(
                rng.integers(3, 9, size=3).astype(np.int32),
                -rng.random(3).astype(np.float32),
                "",
                "stop",
                0,
            )
            for _ in range(2)
        )
        groups.append(Group(prompt, comps, np.array([1.0, 0.0], np.float32)))
    return make_batch(groups, algo.advantages(np.stack([g.rewards for g in groups])))


def trainer(algo, **kwargs):
    return Trainer(Transformer(CFG, rngs=nnx.Rngs(0)), algo, optax.adam(1e-2), **kwargs)


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_donated_steps_give_the_same_weights_and_free_the_old_ones():
    algo = grpo(kl_beta=0.1)  # a reference policy: it must survive the donation
    kept, donated = trainer(algo), trainer(algo, donate_params=True)
    ref_before = leaves(donated.ref_params)
    b = batch(algo)
    for _ in range(3):
        old = jax.tree.leaves(donated.state.params)
        assert kept.step(b) == donated.step(b)
        assert all(x.is_deleted() for x in old)  # its memory became the new weights
    for x, y in zip(leaves(kept.state.params), leaves(donated.state.params), strict=True):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(ref_before, leaves(donated.ref_params), strict=True):
        np.testing.assert_array_equal(x, y)  # the reference is a copy, intact


def test_without_donation_and_under_lora_the_old_weights_stay_readable():
    algo = grpo()
    for t in (trainer(algo), trainer(algo, donate_params=True, lora=LoraConfig(rank=2))):
        old = jax.tree.leaves(t.state.params)
        t.step(batch(algo))
        assert not any(x.is_deleted() for x in old)


def test_the_trainer_role_leaves_the_bundle_no_arrays_that_a_step_deletes():
    """Pushing to a server, the role's trainer donates its weights; the bundle they came from
    keeps the architecture only, so nothing else can read arrays a step has deleted."""
    from rlax.core.models.bundle import ModelBundle
    from rlax.core.spec import RunSpec
    from rlax.core.trainer.role import _make_trainer
    from rlax.core.trainer.spec import TrainerSpec
    from rlax.plugins.samplers.jax_sampler import JaxSampler

    for inline in (False, True):
        bundle = ModelBundle(
            Transformer(CFG, rngs=nnx.Rngs(0)), tokenizer=type("T", (), {"eos_id": 0})()
        )
        spec = RunSpec(
            task=None,
            reward=None,
            sampler=JaxSampler(),
            init_checkpoint="unused",  # the bundle is the policy
            train=TrainerSpec(algorithm=grpo(), optimizer=optax.adam(1e-2)),
        )
        t = _make_trainer(bundle, spec, inline)
        t.step(batch(grpo()))
        state = jax.tree.leaves(nnx.state(bundle.model))
        if inline:  # nothing donated: the bundle still holds the (readable) starting weights
            assert all(isinstance(x, jax.Array) and not x.is_deleted() for x in state)
        else:
            assert all(isinstance(x, jax.ShapeDtypeStruct) for x in state)
            assert bundle.config == CFG
