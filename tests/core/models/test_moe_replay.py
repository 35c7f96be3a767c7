"""Routing replay through the trainer: recorded routes go into the batch, follow packing,
and the step's forward routes by them (R3) even where the router now prefers others."""

from __future__ import annotations

import pathlib
import sys

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlax.core.models.config import MoeConfig, TransformerConfig
from rlax.core.models.routing_replay import batch_routes
from rlax.core.models.transformer import Transformer, causal_mask, positions_from_mask
from rlax.core.trainer import packing
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.step import Trainer, TrainerSettings
from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.algorithms.grpo import grpo

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from moe_reference import forward  # next to this file

CFG = TransformerConfig(
    vocab_size=40,
    num_layers=2,
    embed_dim=16,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    mlp_dim=20,
    tie_embeddings=False,
    moe=MoeConfig(num_experts=4, experts_per_token=2, expert_mlp_dim=12),
)
R, K = 2, 2  # sparse layers, experts per token


def test_batch_routes_sit_under_their_tokens():
    a = np.arange(5 * R * K, dtype=np.int16).reshape(5, R, K)  # 2 prompt + 3 completion tokens
    b = np.full((4, R, K), 3, np.int16)  # 3 prompt + 1 completion token
    out = batch_routes([(2, a), (3, b), (1, None)], (3, 8), prompt_width=4)
    assert out.shape == (3, 8, R, K) and out.dtype == np.int16
    np.testing.assert_array_equal(out[0, 2:7], a)  # prompt left-padded to 4: starts at 2
    np.testing.assert_array_equal(out[1, 1:5], b)
    assert (out[0, :2] == -1).all() and (out[0, 7:] == -1).all() and (out[2] == -1).all()
    assert batch_routes([(2, None)], (1, 4), 2) is None


def test_make_batch_carries_each_completions_routes():
    prompt = Prompt("p", "", np.array([5, 6, 7], np.int32), None)
    routes = np.random.default_rng(0).integers(0, 4, (3 + 2, R, K)).astype(np.int16)
    comps = [
        Completion(
            np.array([8, 9], np.int32), np.zeros(2, np.float32), "", "stop", 0, routes=routes
        ),
        Completion(np.array([10], np.int32), np.zeros(1, np.float32), "", "stop", 0),
    ]
    batch = make_batch([Group(prompt, comps, [1.0, 0.0])], np.zeros((1, 2)), length_bucket=4)
    p = 4  # the prompt's 3 tokens bucketed to 4
    np.testing.assert_array_equal(batch.routes[0, p - 3 : p + 2], routes)
    np.testing.assert_array_equal(batch.tokens[0, p - 3 : p + 2], [5, 6, 7, 8, 9])
    assert (batch.routes[1] == -1).all()  # not recorded: routed by the trainer


def test_packing_moves_routes_with_their_tokens():
    rng = np.random.default_rng(1)
    mask = np.array([[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]], bool)
    tokens = np.where(mask, rng.integers(1, 40, mask.shape), 0).astype(np.int32)
    routes = rng.integers(0, 4, (*mask.shape, R, K)).astype(np.int16)
    arrays = {"tokens": tokens, "attention_mask": mask, "routes": routes}
    out = packing.pack(arrays, width=6, per_microbatch=2)
    assert "routes" not in out and "routes" in arrays  # the caller's dict untouched
    packed, ids = out[packing.PACKED_ROUTES], out[packing.PACKED_IDS]
    flat = routes.reshape(-1, R, K)
    for row, col in zip(*np.nonzero(ids >= 0)):
        np.testing.assert_array_equal(packed[row, col], flat[ids[row, col]])
        assert out[packing.PACKED_TOKENS][row, col] == tokens.reshape(-1)[ids[row, col]]
    assert (packed[ids < 0] == -1).all()


def rows(seed: int = 0, n: int = 4, t: int = 10):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 40, (n, t)).astype(np.int32)
    mask = np.ones((n, t), bool)
    mask[1, 7:] = False  # a shorter row: padding after it
    return np.where(mask, tokens, 0), mask


def flipped() -> Transformer:
    """The sampler's model with every router negated: it now prefers other experts."""
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    for i in CFG.moe_layers:
        kernel = model.blocks[i].mlp.router.kernel
        kernel[...] = -kernel[...]
    return model


def model_routes(model: Transformer, tokens, mask) -> np.ndarray:
    m = jnp.asarray(mask)
    _, _, routes = model.routed_hidden_states(
        jnp.asarray(tokens), positions_from_mask(m), causal_mask(m)
    )
    return np.asarray(routes.ids).astype(np.int16)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_the_step_routes_by_the_recorded_experts(layout):
    sampler = Transformer(CFG, rngs=nnx.Rngs(0))
    tokens, mask = rows()
    recorded = model_routes(sampler, tokens, mask)  # what the sampler chose
    recorded[~mask] = -1
    trained = flipped()
    own = model_routes(trained, tokens, mask)
    assert (np.sort(own, -1) != np.sort(recorded, -1)).any(-1)[mask].mean() > 0.9
    # The logprobs of the replayed forward, by the NumPy reference on each row's tokens.
    params = nnx.to_pure_dict(nnx.state(trained))
    want = np.zeros((len(tokens), tokens.shape[1] - 1), np.float32)
    for r in range(len(tokens)):
        n = int(mask[r].sum())
        logits, _ = forward(params, CFG, tokens[r, :n], replay=recorded[r, :n])
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        want[r, : n - 1] = logp[np.arange(n - 1), tokens[r, 1:n]]
    loss_mask = (mask[:, 1:] & mask[:, :-1]).astype(np.float32)
    batch = {
        "tokens": tokens,
        "attention_mask": mask,
        "loss_mask": loss_mask,
        "old_logprobs": want * loss_mask,
        "advantages": np.zeros_like(loss_mask),
        "routes": recorded,
    }
    mismatch = {}
    for mode in ("rollout", "off"):
        settings = TrainerSettings(routing_replay=mode, packing=layout, row_tokens=12)
        trainer = Trainer(flipped(), grpo(), optax.sgd(0.0), settings=settings)
        mismatch[mode] = trainer.step(batch)["mismatch_abs_logp"]
    assert mismatch["rollout"] < 1e-5  # the sampler's experts, exactly
    assert mismatch["off"] > 1e-2  # its own (flipped) routing: another network


def test_replay_without_recorded_routes_is_refused_not_silently_off():
    tokens, mask = rows()
    loss_mask = (mask[:, 1:] & mask[:, :-1]).astype(np.float32)
    batch = {
        "tokens": tokens,
        "attention_mask": mask,
        "loss_mask": loss_mask,
        "old_logprobs": np.zeros_like(loss_mask),
        "advantages": np.zeros_like(loss_mask),
    }
    settings = TrainerSettings(routing_replay="rollout")
    trainer = Trainer(flipped(), grpo(), optax.sgd(0.0), settings=settings)
    with pytest.raises(ValueError, match="routing_replay = 'rollout' but the batch has no routes"):
        trainer.step(batch)


def test_remat_and_microbatches_train_a_moe_model_as_one_plain_pass():
    import jax

    tokens, mask = rows()
    loss_mask = (mask[:, 1:] & mask[:, :-1]).astype(np.float32)
    batch = {
        "tokens": tokens,
        "attention_mask": mask,
        "loss_mask": loss_mask,
        "old_logprobs": np.zeros_like(loss_mask),
        "advantages": np.ones_like(loss_mask),
    }

    def trained(**settings):
        trainer = Trainer(
            Transformer(CFG, rngs=nnx.Rngs(0)),
            grpo(),
            optax.sgd(0.1),
            settings=TrainerSettings(packing="padded", **settings),
        )
        losses = [trainer.step(batch)["loss"] for _ in range(2)]
        return losses, jax.tree.leaves(trainer.state.params)

    want_losses, want = trained()
    for settings in ({"remat": "block"}, {"remat": "block_dots"}, {"microbatches": 2}):
        losses, got = trained(**settings)
        assert losses == pytest.approx(want_losses, abs=1e-6), settings
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)
    assert want_losses[0] != want_losses[1]


def test_routes_are_dropped_when_replay_is_off():
    tokens, mask = rows()
    loss_mask = (mask[:, 1:] & mask[:, :-1]).astype(np.float32)
    arrays = {
        "tokens": tokens,
        "attention_mask": mask,
        "loss_mask": loss_mask,
        "old_logprobs": np.zeros_like(loss_mask),
        "advantages": np.zeros_like(loss_mask),
        "routes": np.zeros((*tokens.shape, R, K), np.int16),
    }
    for mode, carried in (("off", False), ("rollout", True)):
        settings = TrainerSettings(routing_replay=mode, packing="packed", row_tokens=12)
        trainer = Trainer(flipped(), grpo(), optax.sgd(0.0), settings=settings)
        laid_out = trainer.layout(dict(arrays))
        assert (packing.PACKED_ROUTES in laid_out) == carried, mode
        assert "routes" not in laid_out
