"""LoRA on the trainer: the adapted forward by hand, B = 0, what a step changes, resume."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from toy_groups import toy_batch

from rlax.core.errors import ConfigError
from rlax.core.models import lora
from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer, causal_mask, positions_from_mask
from rlax.core.trainer.step import Trainer, TrainState
from rlax.plugins.algorithms.grpo import grpo

CFG = TransformerConfig(
    vocab_size=9, num_layers=2, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)
TOKENS = jnp.asarray([[3, 4, 5, 6, 7, 8], [0, 3, 3, 8, 4, 5]])
MASK = jnp.asarray([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]], bool)


def logits(model):
    out, _ = model(TOKENS, positions_from_mask(MASK), causal_mask(MASK))
    return np.asarray(out)


def batch():
    return toy_batch()


def random_b(params: lora.LoraParams, seed: int = 1) -> lora.LoraParams:
    """``params`` with nonzero ``b`` (a trained adapter), so the update is visible."""
    key = jax.random.key(seed)
    leaves, treedef = jax.tree.flatten(params.adapters)
    leaves = [
        0.3 * jax.random.normal(jax.random.fold_in(key, i), x.shape) for i, x in enumerate(leaves)
    ]
    return lora.joined(params, jax.tree.unflatten(treedef, leaves))


def test_adapted_forward_equals_base_plus_scaled_ba_by_hand():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    base_logits = logits(model)
    graphdef, state = nnx.split(model)
    cfg = lora.LoraConfig(targets=(r"attn/q$", r"mlp/down$"), rank=3, alpha=6.0)
    params = random_b(lora.attach(state, cfg))
    # By hand: W' = W + (alpha/r) a b on exactly the targeted kernels, the rest untouched.
    pure = jax.tree.map(np.asarray, nnx.to_pure_dict(state))
    pairs = lora.adapter_pairs(jax.tree.map(np.asarray, params.adapters))
    assert sorted(pairs) == [
        "blocks/0/attn/q",
        "blocks/0/mlp/down",
        "blocks/1/attn/q",
        "blocks/1/mlp/down",
    ]
    for name, (a, b) in pairs.items():
        layer, kind, proj = name.split("/")[1:]
        pure["blocks"][int(layer)][kind][proj]["kernel"] = (
            pure["blocks"][int(layer)][kind][proj]["kernel"] + 2.0 * a @ b
        )
    by_hand, hand_state = nnx.merge(graphdef, state), nnx.state(Transformer(CFG, rngs=nnx.Rngs(0)))
    nnx.replace_by_pure_dict(hand_state, pure)
    nnx.update(by_hand, hand_state)
    want = logits(by_hand)
    unmerged = logits(lora.model_of(graphdef, params))  # x W + s (x a) b, as the trainer runs it
    merged = logits(nnx.merge(graphdef, lora.merged_state(params)))
    np.testing.assert_allclose(unmerged, want, atol=1e-5)
    np.testing.assert_allclose(merged, want, atol=1e-5)
    assert np.abs(want - base_logits).max() > 1e-2  # the adapters act


def test_zero_b_gives_the_base_logits_exactly():
    model = Transformer(CFG, rngs=nnx.Rngs(1))
    base = logits(model)
    trainer = Trainer(model, grpo(), optax.sgd(0.1), lora=lora.LoraConfig(rank=4))
    params = trainer.state.params
    assert all(
        float(jnp.abs(b).max()) == 0 for _, b in lora.adapter_pairs(params.adapters).values()
    )
    assert all(float(jnp.abs(a).max()) > 0 for a, _ in lora.adapter_pairs(params.adapters).values())
    np.testing.assert_array_equal(logits(lora.model_of(trainer.graphdef, params)), base)
    np.testing.assert_array_equal(logits(trainer.model()), base)


def test_a_step_changes_only_the_adapters_and_adam_holds_only_adapters():
    model = Transformer(CFG, rngs=nnx.Rngs(2))
    base = jax.tree.map(np.asarray, nnx.state(model))
    trainer = Trainer(model, grpo(), optax.adam(0.05), lora=lora.LoraConfig(rank=2, dropout=0.1))
    before = jax.tree.map(np.asarray, trainer.state.params)
    n_adapter = sum(x.size for x in jax.tree.leaves(before.adapters))
    n_base = sum(x.size for x in jax.tree.leaves(base))
    state_sizes = sum(x.size for x in jax.tree.leaves(trainer.state.opt_state))
    assert state_sizes == 2 * n_adapter + 1  # mu, nu over the adapters and adam's count
    assert n_adapter < n_base / 4
    trainer.step(batch())
    after = trainer.state.params
    for got, want in zip(jax.tree.leaves(after.base), jax.tree.leaves(base), strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)  # the base is frozen
    b_moved = [
        float(np.abs(np.asarray(b)).max()) for _, b in lora.adapter_pairs(after.adapters).values()
    ]
    assert min(b_moved) > 0  # every B left zero
    assert not np.array_equal(np.asarray(after.key), np.asarray(before.key))  # new dropout masks


def test_bfloat16_base_is_stored_in_bfloat16_and_merges_from_it():
    model = Transformer(CFG, rngs=nnx.Rngs(3))
    trainer = Trainer(model, grpo(), optax.sgd(0.1), lora=lora.LoraConfig(base_dtype="bfloat16"))
    kernels = [x for x in jax.tree.leaves(trainer.state.params.base) if x.ndim == 2]
    assert {x.dtype for x in kernels} == {jnp.dtype(jnp.bfloat16)}
    rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), nnx.state(model))
    for got, want in zip(
        jax.tree.leaves(lora.merged_state(trainer.state.params)),
        jax.tree.leaves(rounded),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # B = 0: the bf16 base


def test_reference_policy_is_the_base():
    model = Transformer(CFG, rngs=nnx.Rngs(4))
    trainer = Trainer(model, grpo(kl_beta=0.1), optax.sgd(0.1), lora=lora.LoraConfig(dropout=0.2))
    ref = trainer.ref_params
    assert ref.key is None  # the reference runs without dropout
    assert all(
        x is y
        for x, y in zip(jax.tree.leaves(ref.base), jax.tree.leaves(trainer.state.params.base))
    )
    trainer.step(batch())
    np.testing.assert_array_equal(
        logits(lora.model_of(trainer.graphdef, trainer.ref_params)), logits(model)
    )


@pytest.mark.e2e
def test_resumed_run_equals_the_uninterrupted_one(tmp_path):
    from rlax.core.trainer.checkpoint import Checkpointer
    from rlax.core.trainer.loop import apply_restored, state_tree

    cfg = lora.LoraConfig(rank=2, dropout=0.1)

    def fresh():
        return Trainer(Transformer(CFG, rngs=nnx.Rngs(5)), grpo(), optax.adam(0.05), lora=cfg)

    straight = fresh()
    for _ in range(3):
        straight.step(batch())
    first = fresh()
    first.step(batch())
    ckpt = Checkpointer(tmp_path, every=1, keep=2)
    ckpt.save(1, state_tree(first.state), {"train_step": 1, "version": 1})
    ckpt.wait()
    resumed = fresh()
    restored = Checkpointer(tmp_path, every=1, keep=2).restore_latest(state_tree(resumed.state))
    assert restored is not None
    apply_restored(resumed, restored)
    assert isinstance(resumed.state, TrainState) and resumed.state.step == 1
    for _ in range(2):
        resumed.step(batch())
    assert resumed.state.step == straight.state.step == 3
    pairs = zip(
        jax.tree.leaves(state_tree(resumed.state)),
        jax.tree.leaves(state_tree(straight.state)),
        strict=True,
    )
    for got, want in pairs:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 0}, "rlax.lora.rank must be >= 1"),
        ({"dropout": 1.0}, "rlax.lora.dropout must be in [0, 1)"),
        ({"base_dtype": "float16"}, "use one of ['bfloat16', 'float32']"),
        ({"targets": ("attn/(q",)}, "rlax.lora.targets: bad pattern"),
    ],
)
def test_bad_settings_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        lora.LoraConfig(**kwargs)


def test_targets_matching_nothing_name_the_layers():
    state = nnx.state(Transformer(CFG, rngs=nnx.Rngs(0)))
    with pytest.raises(
        ConfigError, match=r"match no linear layer; the model has .*blocks/L/attn/q"
    ):
        lora.attach(state, lora.LoraConfig(targets=("attention/query",)))
