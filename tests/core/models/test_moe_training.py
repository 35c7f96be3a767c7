"""A mixture-of-experts policy in the train step: R2-style replay (every update of a batch
routes as the trainer's first pass did), the load-balancing loss and the balancing bias."""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlax.core.models.config import MoeConfig
from rlax.core.models.routing_replay import replayed_logprobs
from rlax.core.models.transformer import Transformer
from rlax.core.trainer.epochs import several_updates, update_on_batch
from rlax.core.trainer.step import Trainer, TrainerSettings
from rlax.plugins.algorithms.grpo import grpo

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_moe_replay import CFG, flipped, model_routes, rows  # next to this file


def _negate_routers(trainer: Trainer) -> None:
    model = nnx.merge(trainer.graphdef, trainer.state.params)
    for i in CFG.moe_layers:
        kernel = model.blocks[i].mlp.router.kernel
        kernel[...] = -kernel[...]
    trainer.state = dataclasses.replace(trainer.state, params=nnx.split(model)[1])


def _batch(old_logprobs: np.ndarray | None = None) -> dict[str, np.ndarray]:
    tokens, mask = rows()
    loss_mask = (mask[:, 1:] & mask[:, :-1]).astype(np.float32)
    old = np.zeros_like(loss_mask) if old_logprobs is None else old_logprobs * loss_mask
    return {
        "tokens": tokens,
        "attention_mask": mask,
        "loss_mask": loss_mask,
        "old_logprobs": old,
        "advantages": np.zeros_like(loss_mask),
    }


def test_later_epochs_route_by_the_first_passs_experts():
    tokens, mask = rows()
    first = model_routes(Transformer(CFG, rngs=nnx.Rngs(0)), tokens, mask)  # the first pass's
    own = model_routes(flipped(), tokens, mask)  # after the routers are negated
    assert (np.sort(own, -1) != np.sort(first, -1)).any(-1)[mask].mean() > 0.9
    # What the second update computes if it routes by the first pass: the negated model's
    # forward routed by ``first``; the batch's sampler logprobs are set to it.
    want, _ = replayed_logprobs(flipped(), tokens, mask, jnp.asarray(first), 1.0, 1024)
    batch = _batch(np.asarray(want))
    mismatch = {}
    for mode in ("trainer", "off"):
        settings = TrainerSettings(routing_replay=mode, epochs=2, packing="padded")
        trainer = Trainer(
            Transformer(CFG, rngs=nnx.Rngs(0)), grpo(), optax.sgd(0.0), settings=settings
        )
        step, calls = trainer.step, []

        def step_after_the_router_moved(arrays, step=step, trainer=trainer, calls=calls):
            calls.append(arrays.get("routes"))
            if len(calls) == 2:  # between the epochs, the router now prefers other experts
                _negate_routers(trainer)
            return step(arrays)

        trainer.step = step_after_the_router_moved  # type: ignore[method-assign]
        metrics = several_updates(trainer, dict(batch), np.arange(4), seed=0, step=0)
        assert len(metrics) == 2 and trainer.state.step == 1
        if mode == "trainer":  # both updates were handed the first pass's routes
            for routes in calls:
                assert routes is not None
                # the minibatch's rows are the batch's, shuffled; -1 on padding
                want_rows = np.where(mask[..., None, None], first, -1)
                assert sorted(r.tobytes() for r in routes[:4]) == sorted(
                    r.tobytes() for r in want_rows
                )
        # The second update's own ratio to the sampler's logprobs (the mismatch metrics
        # compare with the weights before the first update, the anchors, in every update).
        mismatch[mode] = abs(metrics[1]["ratio_mean"] - 1.0)
    assert mismatch["trainer"] < 1e-5  # the first pass's experts, exactly
    assert mismatch["off"] > 1e-2  # its own (moved) routing: another network


def test_one_update_per_batch_routes_itself_and_ignores_a_rollout_record():
    batch = _batch()
    recorded = np.zeros((*batch["tokens"].shape, 2, 2), np.int16)  # not the model's routing
    metrics = {}
    for mode in ("trainer", "off", "rollout"):
        trainer = Trainer(
            flipped(), grpo(), optax.sgd(0.0), settings=TrainerSettings(routing_replay=mode)
        )
        arrays = dict(batch, routes=recorded)
        metrics[mode] = update_on_batch(trainer, arrays, arrays, seed=0, step=0)
    assert metrics["trainer"]["mismatch_abs_logp"] == metrics["off"]["mismatch_abs_logp"]
    assert metrics["rollout"]["mismatch_abs_logp"] != metrics["off"]["mismatch_abs_logp"]


# -- load balancing: one sparse layer (0) whose input is the embedding, so its routing is
# computed by hand below.
E, TOP = 4, 2


def _balanced_model(**moe) -> Transformer:
    cfg = dataclasses.replace(
        CFG, moe=MoeConfig(E, TOP, 12, dense_layers=(1,), **moe)
    )  # layer 1 dense: one sparse layer
    model = Transformer(cfg, rngs=nnx.Rngs(3))
    o = model.blocks[0].attn.o.kernel
    o[...] = jnp.zeros_like(o[...])  # attention adds nothing: the router reads the embedding
    return model


def _hand_routing(model: Transformer, bias: np.ndarray | None = None):
    """(probs [n, E], chosen ids [n, k]) of the batch's real tokens, in NumPy."""
    tokens, mask = rows()
    emb = np.asarray(model.embed.embedding[...], np.float64)[tokens[mask]]
    scale = np.asarray(model.blocks[0].mlp_norm.scale[...], np.float64)
    h = emb / np.sqrt(np.mean(emb * emb, -1, keepdims=True) + model.cfg.norm_eps) * scale
    logits = h @ np.asarray(model.blocks[0].mlp.router.kernel[...], np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    choice = probs if bias is None else probs + bias
    return probs, np.argsort(-choice, -1)[:, :TOP]


def test_the_load_balancing_loss_is_added_to_the_step_by_hand():
    probs, ids = _hand_routing(_balanced_model())
    n = len(ids)
    f = np.bincount(ids.reshape(-1), minlength=E) / (n * TOP)
    want = E * np.sum(f * probs.mean(0))  # Switch: E * sum_e f_e * P_e over real tokens
    assert want > 1.0  # not balanced: the loss has something to say
    batch = _batch()
    batch["advantages"] = np.ones_like(batch["loss_mask"])
    out = {}
    for coef in (0.0, 0.5):
        trainer = Trainer(
            _balanced_model(aux_loss_coef=coef), grpo(), optax.sgd(0.0), settings=TrainerSettings()
        )
        out[coef] = trainer.step(dict(batch))
    assert out[0.5]["moe_aux_loss"] == pytest.approx(want, abs=1e-5)
    assert "moe_aux_loss" not in out[0.0]  # off: not computed
    assert out[0.5]["loss"] - out[0.0]["loss"] == pytest.approx(0.5 * want, abs=1e-5)


def test_gradient_steps_on_the_balancing_loss_lower_it():
    batch = _batch()  # zero advantages: the policy loss has no gradient, only the aux loss
    trainer = Trainer(
        _balanced_model(aux_loss_coef=1.0), grpo(), optax.sgd(0.1), settings=TrainerSettings()
    )
    losses = [trainer.step(dict(batch))["moe_aux_loss"] for _ in range(3)]
    assert losses[2] < losses[1] < losses[0]


def test_the_balancing_bias_moves_toward_under_loaded_experts_by_the_rate():
    model = _balanced_model(router_bias=True)
    bias = np.array([0.05, -0.02, 0.0, 0.01], np.float32)
    model.blocks[0].mlp.router_bias[...] = jnp.asarray(bias)
    _, ids = _hand_routing(model, bias)
    load = np.bincount(ids.reshape(-1), minlength=E).astype(np.float64)
    assert len(set(load)) > 1  # some expert over-, some under-loaded
    rate = 0.1
    want = bias + rate * np.sign(load.mean() - load)
    # AdamW's decay would move the bias if it were a gradient parameter; it is not.
    settings = TrainerSettings(balance_bias_rate=rate)
    trainer = Trainer(model, grpo(), optax.adamw(0.1, weight_decay=0.5), settings=settings)
    trainer.step(_batch())
    got = np.asarray(trainer.model().blocks[0].mlp.router_bias[...])
    np.testing.assert_allclose(got, want, atol=1e-7)
    assert (got[load < load.mean()] > bias[load < load.mean()]).all()  # under-loaded: up
    # Without the rate the bias stays as loaded.
    trainer = Trainer(
        _balanced_model(router_bias=True),
        grpo(),
        optax.sgd(0.1),
        settings=TrainerSettings(balance_bias_rate=0.0),
    )
    trainer.step(_batch())
    assert (np.asarray(trainer.model().blocks[0].mlp.router_bias[...]) == 0).all()
