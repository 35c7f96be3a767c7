"""Expert-parallel checks that need 8 devices; ``test_expert_devices.py`` runs this file in a
subprocess (the main pytest process has JAX started with one device).

Run directly with ``XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest
tests/core/parallel/expert_checks.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlax.core.models.config import MoeConfig, TransformerConfig
from rlax.core.models.transformer import Transformer, causal_mask, positions_from_mask
from rlax.core.parallel.mesh import MeshConfig, batch_spec, make_mesh, param_name, tree_shardings
from rlax.core.trainer.step import Trainer, TrainerSettings
from rlax.plugins.algorithms.grpo import grpo

MOE = MoeConfig(
    num_experts=8, experts_per_token=2, expert_mlp_dim=16, normalize_topk=True, shared_mlp_dim=8
)
CFG = TransformerConfig(
    vocab_size=64,
    num_layers=2,
    embed_dim=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=48,
    tie_embeddings=False,
    qk_norm=True,
    moe=dataclasses.replace(MOE, dense_layers=(1,)),
)
MESHES = {
    "expert4_fsdp2": MeshConfig(data=1, fsdp=2, tensor=1, expert=4),
    "expert2_fsdp2_tensor2": MeshConfig(data=1, fsdp=2, tensor=2, expert=2),
}
DISPATCHES = ("sorted", "dense")


def config(dispatch: str) -> TransformerConfig:
    assert CFG.moe is not None
    return dataclasses.replace(CFG, moe=dataclasses.replace(CFG.moe, dispatch=dispatch))


def test_eight_devices():
    assert jax.device_count() == 8


def random_batch(rows: int = 16, length: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, CFG.vocab_size, size=(rows, length)).astype(np.int32)
    end = length - rng.integers(0, 4, size=rows)
    attention = np.arange(length) < end[:, None]
    loss_mask = (attention[:, 1:] & (np.arange(1, length) >= 5)).astype(np.float32)
    adv = np.repeat(rng.normal(size=(rows, 1)), length - 1, axis=1).astype(np.float32)
    return {
        "tokens": np.where(attention, tokens, 0),
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "old_logprobs": (-rng.random((rows, length - 1)) * loss_mask).astype(np.float32),
        "advantages": adv * loss_mask,
    }


def forward(mesh_name: str | None, dispatch: str) -> tuple[np.ndarray, np.ndarray]:
    """(logits, routes) of a random batch, the model laid out on the named mesh."""
    model = Transformer(config(dispatch), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    batch = random_batch()
    tokens, mask = jnp.asarray(batch["tokens"]), jnp.asarray(batch["attention_mask"])
    if mesh_name is not None:
        mesh = make_mesh(MESHES[mesh_name])
        state = jax.device_put(state, tree_shardings(state, mesh))
        tokens = jax.device_put(tokens, NamedSharding(mesh, batch_spec(2)))
        mask = jax.device_put(mask, NamedSharding(mesh, batch_spec(2)))

    @jax.jit
    def run(state, tokens, mask):
        x, _, routes = nnx.merge(graphdef, state).routed_hidden_states(
            tokens, positions_from_mask(mask), causal_mask(mask)
        )
        return nnx.merge(graphdef, state).logits(x), routes.ids

    logits, ids = run(state, tokens, mask)
    return np.asarray(logits), np.asarray(ids)


@pytest.mark.parametrize("dispatch", DISPATCHES)
@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_sharded_forward_equals_one_device(mesh, dispatch):
    logits, ids = forward(mesh, dispatch)
    want_logits, want_ids = forward(None, dispatch)
    np.testing.assert_allclose(logits, want_logits, atol=1e-5, rtol=0)
    assert np.array_equal(ids, want_ids)


def count_compiles():
    """A list that grows by one for every XLA compilation from now on."""
    seen: list[float] = []

    def listen(event: str, duration: float, **_) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            seen.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    return seen


@functools.cache
def trained(mesh_name: str | None, dispatch: str, steps: int = 3):
    trainer = Trainer(
        Transformer(config(dispatch), rngs=nnx.Rngs(0)),
        grpo(),
        optax.sgd(0.5, momentum=0.9),  # as mesh_device_checks: adam turns rounding into steps
        mesh=None if mesh_name is None else make_mesh(MESHES[mesh_name]),
    )
    compiles = count_compiles()
    metrics = [trainer.step(random_batch(seed=0))]
    warm = len(compiles)
    metrics += [trainer.step(random_batch(seed=s)) for s in range(1, steps)]
    state = jax.tree.map(np.asarray, (trainer.state.params, trainer.state.opt_state))
    return state, metrics, len(compiles) - warm, trainer


@pytest.mark.parametrize("dispatch", DISPATCHES)
@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_sharded_train_steps_equal_one_device_and_never_recompile(mesh, dispatch):
    state, metrics, recompiles, _ = trained(mesh, dispatch)
    state0, metrics0, _, _ = trained(None, dispatch)
    assert recompiles == 0
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(state0), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    for m, m0 in zip(metrics, metrics0, strict=True):
        for k in m0:
            assert m[k] == pytest.approx(m0[k], abs=1e-5), k
    assert metrics[-1]["loss"] != metrics[0]["loss"]  # the steps did change the model


@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_each_device_holds_its_share_of_whole_experts(mesh):
    *_, trainer = trained(mesh, "sorted")
    n = MESHES[mesh].expert
    params = {
        param_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(trainer.state.params)[0]
    }
    gate = params["blocks/0/mlp/experts/gate"]  # [E, D, F]
    assert gate.sharding.spec[0] == "expert"
    assert {s.data.shape[0] for s in gate.addressable_shards} == {8 // n}
    # The experts held across one expert group are all 8, each once.
    held = sorted({s.index[0].start for s in gate.addressable_shards})
    assert held == list(range(0, 8, 8 // n))
    assert params["blocks/0/mlp/experts/down"].sharding.spec[0] == "expert"
    tokens = trainer.device_batch(random_batch())["tokens"]
    assert tokens.sharding.spec == P(("data", "fsdp", "expert"), None)


@functools.cache
def replayed(mesh_name: str | None, steps: int = 2):
    """Train steps with routing replay: each batch brings routes [B, T, 1, 2] split by rows."""
    trainer = Trainer(
        Transformer(config("sorted"), rngs=nnx.Rngs(0)),
        grpo(),
        optax.sgd(0.5, momentum=0.9),
        mesh=None if mesh_name is None else make_mesh(MESHES[mesh_name]),
        settings=TrainerSettings(routing_replay="rollout"),
    )
    metrics = []
    for seed in range(steps):
        batch = random_batch(seed=seed)
        rng = np.random.default_rng(seed)
        # Two distinct experts per token, drawn at random: not what the router would pick.
        routes = np.argsort(rng.random((16, 12, 1, 8)), -1)[..., :2].astype(np.int16)
        metrics.append(trainer.step({**batch, "routes": routes}))
    return jax.tree.map(np.asarray, trainer.state.params), metrics


@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_replayed_sharded_train_steps_equal_one_device(mesh):
    state, metrics = replayed(mesh)
    state0, metrics0 = replayed(None)
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(state0), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    for m, m0 in zip(metrics, metrics0, strict=True):
        assert m["loss"] == pytest.approx(m0["loss"], abs=1e-5)
        assert m["mismatch_abs_logp"] == pytest.approx(m0["mismatch_abs_logp"], abs=1e-5)
    # Replay changed the forward: the first step's logprobs are not the own-routing ones.
    own = trained(mesh, "sorted")[1][0]["mismatch_abs_logp"]
    assert abs(metrics[0]["mismatch_abs_logp"] - own) > 1e-4
