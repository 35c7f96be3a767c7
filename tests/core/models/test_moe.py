"""Mixture-of-experts layers against a hand-written NumPy forward, and the router's laws."""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlax.core.models.config import MoeConfig, TransformerConfig
from rlax.core.models.moe import balance_bias, load_balancing_loss, route
from rlax.core.models.transformer import Transformer, causal_mask, positions_from_mask

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from moe_reference import forward  # next to this file

BASE = MoeConfig(num_experts=6, experts_per_token=2, expert_mlp_dim=12)
# Every router option, each on both dispatches.
OPTIONS = {
    "softmax": BASE,
    "softmax-normalised": dataclasses.replace(BASE, normalize_topk=True),
    "sigmoid-normalised-scaled": dataclasses.replace(
        BASE, scoring="sigmoid", normalize_topk=True, routed_scale=2.5
    ),
    "sigmoid-bias": dataclasses.replace(BASE, scoring="sigmoid", router_bias=True),
    "softmax-bias-top3": dataclasses.replace(BASE, router_bias=True, experts_per_token=3),
    "shared": dataclasses.replace(BASE, shared_mlp_dim=10),
    "shared-gated-dense-layer": dataclasses.replace(
        BASE, shared_mlp_dim=10, shared_gate=True, dense_layers=(1,)
    ),
    "aux-loss": dataclasses.replace(BASE, aux_loss_coef=0.01),
}


def tiny(moe: MoeConfig, **kw) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=50,
        num_layers=3,
        embed_dim=16,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        mlp_dim=20,
        tie_embeddings=False,
        qk_norm=True,
        moe=moe,
        **kw,
    )


def model_with_random_biases(cfg: TransformerConfig, seed: int = 0) -> Transformer:
    """A model whose router biases (zero at init) are random, so that they matter."""
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for i in cfg.moe_layers:
        mlp = model.blocks[i].mlp
        if cfg.moe is not None and cfg.moe.router_bias:
            mlp.router_bias[...] = jnp.asarray(rng.normal(0, 0.3, cfg.moe.num_experts))
    return model


def logits_and_routes(model: Transformer, tokens: np.ndarray, replay=None):
    mask = jnp.ones(tokens.shape, bool)
    x, _, routes = model.routed_hidden_states(
        jnp.asarray(tokens), positions_from_mask(mask), causal_mask(mask), replay=replay
    )
    return np.asarray(model.logits(x)), routes


TOKENS = np.random.default_rng(1).integers(0, 50, size=(2, 9)).astype(np.int32)


@pytest.mark.parametrize("dispatch", ["sorted", "dense"])
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_logits_equal_the_numpy_moe_forward(option, dispatch):
    cfg = tiny(dataclasses.replace(OPTIONS[option], dispatch=dispatch))
    model = model_with_random_biases(cfg)
    params = nnx.to_pure_dict(nnx.state(model))
    logits, routes = logits_and_routes(model, TOKENS)
    for row in range(len(TOKENS)):
        want, chosen = forward(params, cfg, TOKENS[row])
        np.testing.assert_allclose(logits[row], want, atol=1e-5, rtol=0)
        assert np.array_equal(np.sort(np.asarray(routes.ids[row]), -1), np.sort(chosen, -1))
    assert routes.ids.shape == (2, 9, len(cfg.moe_layers), cfg.moe.experts_per_token)


def test_the_bias_changes_the_choice_not_the_weights():
    cfg = MoeConfig(4, 2, 8, router_bias=True)
    logits = jnp.log(jnp.array([[0.4, 0.3, 0.2, 0.1]]))
    plain = route(logits, cfg)
    biased = route(logits, cfg, bias=jnp.array([0.0, 0.0, 0.0, 1.0]))
    assert sorted(plain.ids[0].tolist()) == [0, 1]
    assert sorted(biased.ids[0].tolist()) == [0, 3]
    # Weights are the scores at the chosen ids: 0.4 and 0.1, the bias nowhere.
    got = dict(zip(biased.ids[0].tolist(), biased.weights[0].tolist()))
    assert got == pytest.approx({0: 0.4, 3: 0.1})


def test_normalised_topk_weights_sum_to_one_times_the_scale():
    cfg = MoeConfig(5, 3, 8, scoring="sigmoid", normalize_topk=True, routed_scale=2.5)
    logits = jax.random.normal(jax.random.key(0), (7, 5))
    np.testing.assert_allclose(route(logits, cfg).weights.sum(-1), 2.5, rtol=1e-6)


def test_load_balancing_loss_by_hand():
    # 2 tokens, 2 experts, top-1: both choose expert 0 (f = [1, 0]); mean probs [0.7, 0.3].
    probs = jnp.array([[0.6, 0.4], [0.8, 0.2]])
    cfg = MoeConfig(2, 1, 4)
    routing = route(jnp.log(probs), cfg)
    assert float(load_balancing_loss(routing, 2)) == pytest.approx(2 * (1 * 0.7 + 0 * 0.3))
    # Uniform load and uniform probabilities: exactly 1.
    even = route(jnp.log(jnp.array([[0.5 + 1e-3, 0.5 - 1e-3], [0.5 - 1e-3, 0.5 + 1e-3]])), cfg)
    assert float(load_balancing_loss(even, 2)) == pytest.approx(1.0, abs=1e-6)


def test_balance_bias_moves_toward_the_mean_load():
    bias = jnp.zeros(3)
    new = balance_bias(bias, jnp.array([10.0, 4.0, 1.0]), rate=0.01)  # mean 5
    np.testing.assert_allclose(new, [-0.01, 0.01, 0.01])


def test_replay_routes_by_the_recorded_ids_and_the_router_still_gets_gradients():
    cfg = tiny(dataclasses.replace(BASE, normalize_topk=False))
    model = model_with_random_biases(cfg)
    _, routes = logits_and_routes(model, TOKENS)
    recorded = np.asarray(routes.ids)
    # Perturb every router so each token's own top-k flips: its negated logits.
    for i in cfg.moe_layers:
        kernel = model.blocks[i].mlp.router.kernel
        kernel[...] = -kernel[...]
    _, own = logits_and_routes(model, TOKENS)
    assert (np.sort(np.asarray(own.ids), -1) != np.sort(recorded, -1)).any(-1).mean() > 0.9
    logits, replayed = logits_and_routes(model, TOKENS, replay=jnp.asarray(recorded))
    assert np.array_equal(np.asarray(replayed.ids), recorded)
    params = nnx.to_pure_dict(nnx.state(model))
    for row in range(len(TOKENS)):
        want, _ = forward(params, cfg, TOKENS[row], replay=recorded[row])
        np.testing.assert_allclose(logits[row], want, atol=1e-5, rtol=0)
    # Tokens marked -1 are routed by the model itself (the first sparse layer's input does
    # not depend on routing; later layers' does, through the replayed tokens before them).
    partial = recorded.copy()
    partial[:, 4:] = -1
    _, mixed = logits_and_routes(model, TOKENS, replay=jnp.asarray(partial))
    assert np.array_equal(np.asarray(mixed.ids)[:, :4], recorded[:, :4])
    assert np.array_equal(np.asarray(mixed.ids)[:, 4:, 0], np.asarray(own.ids)[:, 4:, 0])

    graphdef, state = nnx.split(model)

    def loss(state):
        logits, _ = logits_and_routes_traced(nnx.merge(graphdef, state), recorded)
        return jnp.sum(logits**2)

    grads = nnx.to_pure_dict(jax.grad(loss)(state))
    for i in cfg.moe_layers:
        assert float(jnp.abs(grads["blocks"][i]["mlp"]["router"]["kernel"]).sum()) > 1e-4


def logits_and_routes_traced(model, replay):
    mask = jnp.ones(TOKENS.shape, bool)
    x, _, routes = model.routed_hidden_states(
        jnp.asarray(TOKENS), positions_from_mask(mask), causal_mask(mask), replay=replay
    )
    return model.logits(x), routes


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="experts_per_token must be in 1..num_experts"):
        MoeConfig(4, 5, 8)
    with pytest.raises(ValueError, match="scoring must be one of"):
        MoeConfig(4, 2, 8, scoring="relu")
    with pytest.raises(ValueError, match="shared_gate needs a shared expert"):
        MoeConfig(4, 2, 8, shared_gate=True)
    with pytest.raises(ValueError, match=r"dense_layers \(5,\) must be layers of 0..2"):
        tiny(MoeConfig(4, 2, 8, dense_layers=(5,)))


def test_parameter_count_matches_the_model():
    configs = [tiny(option) for option in OPTIONS.values()]
    for scope in ("head", "projection"):  # Qwen3's q/k norm and OLMoE's
        configs.append(dataclasses.replace(configs[0], qk_norm=True, qk_norm_scope=scope))
    for cfg in configs:
        model = Transformer(cfg, rngs=nnx.Rngs(0))
        count = sum(x.size for x in jax.tree.leaves(nnx.state(model)))
        assert cfg.num_params() == count


def test_qk_norm_scope_is_head_or_projection():
    with pytest.raises(ValueError, match="qk_norm_scope must be 'head' or 'projection', got 'x'"):
        dataclasses.replace(tiny(BASE), qk_norm_scope="x")
