"""Trainer settings on one device: microbatches, remat and bf16 change nothing they shouldn't.

The sharded versions of the same properties run on 8 fake devices in
``test_mesh_devices.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer
from rlax.core.trainer.step import Trainer, TrainerSettings
from rlax.plugins.algorithms.dapo import dapo
from rlax.plugins.algorithms.grpo import grpo
from rlax.plugins.algorithms.ppo import ppo
from rlax.plugins.critics.head import HeadCritic

CFG = TransformerConfig(
    vocab_size=32, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)


def random_batch(rows: int = 8, length: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of unequal prompt (left-padded) and completion (right-padded) lengths."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, CFG.vocab_size, size=(rows, length)).astype(np.int32)
    pad = rng.integers(0, 3, size=rows)
    end = length - rng.integers(0, 4, size=rows)
    pos = np.arange(length)
    attention = (pos >= pad[:, None]) & (pos < end[:, None])
    tokens = np.where(attention, tokens, 0)
    loss_mask = (attention[:, 1:] & (pos[1:] >= 4)).astype(np.float32)  # completions from 4
    adv = np.repeat(rng.normal(size=(rows, 1)), length - 1, axis=1).astype(np.float32)
    old = (-rng.random((rows, length - 1)) * loss_mask).astype(np.float32)
    return {
        "tokens": tokens,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "old_logprobs": old,
        "advantages": adv * loss_mask,
    }


def trained(algorithm, settings=None, steps=2, seed=0):
    # SGD with momentum: its update is linear in the gradient, so a 1e-5 comparison
    # compares gradients (adam would amplify float noise of near-zero gradients).
    trainer = Trainer(
        Transformer(CFG, rngs=nnx.Rngs(seed)),
        algorithm,
        optax.sgd(0.5, momentum=0.9),
        settings=settings,
    )
    metrics = [trainer.step(random_batch(seed=s)) for s in range(steps)]
    return trainer, metrics


def assert_trees_close(got, want, atol):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=atol, rtol=0)


# GRPO with a reference policy is checked the same way on 8 devices (test_mesh_devices.py).
@pytest.mark.parametrize(
    "algorithm", [dapo(), ppo(value_model=HeadCritic())], ids=["dapo-token-mean", "ppo-critic"]
)
def test_k_microbatches_equal_one_batch(algorithm):
    # The loss normalises over the whole batch (token means, a critic's value loss):
    # 4 microbatches of 2 rows give the one-batch update, not an average of 4 updates.
    one, m1 = trained(algorithm)
    four, m4 = trained(algorithm, TrainerSettings(microbatches=4))
    assert_trees_close(four.state.params, one.state.params, atol=1e-5)
    assert_trees_close(four.state.opt_state, one.state.opt_state, atol=1e-5)
    assert_trees_close(four.state.critic, one.state.critic, atol=1e-5)
    for a, b in zip(m4, m1):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], abs=1e-5), k


def test_microbatches_must_divide_the_batch():
    trainer = Trainer(
        Transformer(CFG, rngs=nnx.Rngs(0)),
        grpo(),
        optax.sgd(0.1),
        settings=TrainerSettings(microbatches=3),
    )
    with pytest.raises(ValueError, match="8 rows does not split into 3 microbatches"):
        trainer.step(random_batch())


def step_jaxpr(trainer: Trainer) -> str:
    s = trainer.state
    batch = jax.tree.map(jnp.asarray, random_batch())
    return str(jax.make_jaxpr(trainer._train_step)(s.params, None, s.opt_state, None, batch))


def test_remat_recomputes_blocks_and_changes_nothing():
    plain, _ = trained(grpo(), steps=1)
    rematted, _ = trained(grpo(), TrainerSettings(remat="block", microbatches=2), steps=1)
    assert_trees_close(rematted.state.params, plain.state.params, atol=1e-6)
    # One checkpoint per block, on top of the logprob head's own (core/models/logprobs.py).
    plain_remats = step_jaxpr(plain).count("remat")
    assert step_jaxpr(rematted).count("remat") >= plain_remats + CFG.num_layers
    assert "nothing_saveable" not in step_jaxpr(plain)
    dots = Trainer(
        Transformer(CFG, rngs=nnx.Rngs(0)),
        grpo(),
        optax.sgd(0.1),
        settings=TrainerSettings(remat="block_dots"),
    )
    assert "DotsSaveable(only_if_no_batch_dims=True)" in step_jaxpr(dots)  # saves matmuls


def test_bf16_compute_trains_and_keeps_fp32_master_weights():
    settings = TrainerSettings(compute_dtype="bfloat16")
    algorithm = grpo(aggregation="token-mean")
    trainer = Trainer(
        Transformer(CFG, rngs=nnx.Rngs(0)), algorithm, optax.adam(3e-2), settings=settings
    )
    fp32 = Trainer(Transformer(CFG, rngs=nnx.Rngs(0)), algorithm, optax.adam(3e-2))
    batch = random_batch(seed=1)
    # The compiled step multiplies in bf16.
    hlo = trainer.lower(batch).as_text()
    assert "bf16" in hlo and "dot_general" in hlo
    losses = [trainer.step(batch)["loss"] for _ in range(5)]
    reference = [fp32.step(batch)["loss"] for _ in range(5)]
    # It trains (the surrogate falls on a fixed batch), starting along the fp32 trajectory
    # (adam on a clipped surrogate drifts apart later), and its numbers are bf16's.
    assert losses[-1] < losses[0] - 0.1
    np.testing.assert_allclose(losses[:3], reference[:3], atol=0.01)
    assert losses[0] != reference[0]
    # The master weights and the optimiser's moments stay float32.
    for leaf in jax.tree.leaves((trainer.state.params, trainer.state.opt_state)):
        assert leaf.dtype in (jnp.float32, jnp.int32), leaf.dtype


def test_bf16_updates_below_bf16_resolution_accumulate_in_the_masters():
    # SGD at 1e-3 moves weights by ~1e-6, far below bf16's spacing near them (~1e-3):
    # bf16 weights would hardly move; the fp32 masters do.
    trainer = Trainer(
        Transformer(CFG, rngs=nnx.Rngs(0)),
        grpo(),
        optax.sgd(1e-3),
        settings=TrainerSettings(compute_dtype="bfloat16"),
    )
    before = jax.tree.map(np.asarray, trainer.state.params)
    trainer.step(random_batch())
    after = jax.tree.map(np.asarray, trainer.state.params)
    moved = sum(
        int((a != b).sum()) for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before))
    )
    as_bf16 = [
        (a.astype(jnp.bfloat16) != b.astype(jnp.bfloat16)).sum()
        for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before))
    ]
    assert moved > 1000
    assert sum(int(x) for x in as_bf16) < moved / 100


def test_settings_are_validated():
    with pytest.raises(ValueError, match="compute_dtype='fp8'; valid: float32, bfloat16"):
        TrainerSettings(compute_dtype="fp8")
    with pytest.raises(ValueError, match="remat='all'"):
        TrainerSettings(remat="all")
    with pytest.raises(ValueError, match="microbatches must be >= 1"):
        TrainerSettings(microbatches=0)


def test_logprob_chunks_change_nothing_and_keep_the_batchs_logits_out_of_the_step():
    whole, _ = trained(grpo(), TrainerSettings(logprob_chunk_tokens=10_000), steps=2)
    chunked, _ = trained(grpo(), TrainerSettings(logprob_chunk_tokens=8), steps=2)
    assert_trees_close(chunked.state.params, whole.state.params, atol=1e-6)
    # 8 rows x 9 predicted positions: whole, the step builds [8, 9, V] logits; chunked,
    # at most 8 tokens' ([8, 1, V]) at a time.
    v = CFG.vocab_size
    assert f"tensor<8x9x{v}xf32>" in whole.lower(random_batch()).as_text()
    assert f"tensor<8x9x{v}xf32>" not in chunked.lower(random_batch()).as_text()
    assert f"tensor<8x1x{v}xf32>" in chunked.lower(random_batch()).as_text()
    with pytest.raises(ValueError, match="logprob_chunk_tokens"):
        TrainerSettings(logprob_chunk_tokens=0)
