"""Checks that need 8 devices; ``test_mesh_devices.py`` runs this file in a subprocess.

Not collected by the main suite (its name does not start with ``test_``): the
main pytest process has already started JAX with one device. Run it directly
with ``XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest
tests/core/mesh_device_checks.py``.
"""

from __future__ import annotations

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
from jax.sharding import PartitionSpec as P

from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer
from rlax.core.parallel.mesh import MeshConfig, make_mesh, param_name, spec_for
from rlax.core.trainer.step import Trainer, TrainerSettings
from rlax.plugins.algorithms.grpo import grpo
from rlax.plugins.algorithms.ppo import ppo
from rlax.plugins.critics.head import HeadCritic

CFG = TransformerConfig(
    vocab_size=64,
    num_layers=1,
    embed_dim=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    tie_embeddings=False,
)
MESHES = {"fsdp4_tensor2": MeshConfig(1, 4, 2), "data2_fsdp4": MeshConfig(2, 4, 1)}
ALGORITHMS = {
    "grpo+reference": lambda: grpo(kl_beta=0.1),
    "ppo-head": lambda: ppo(value_model=HeadCritic()),
}


def test_eight_devices():
    assert jax.device_count() == 8


def random_batch(rows: int = 16, length: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, CFG.vocab_size, size=(rows, length)).astype(np.int32)
    pad = rng.integers(0, 4, size=rows)
    end = length - rng.integers(0, 4, size=rows)
    pos = np.arange(length)
    attention = (pos >= pad[:, None]) & (pos < end[:, None])
    loss_mask = (attention[:, 1:] & (pos[1:] >= 5)).astype(np.float32)
    adv = np.repeat(rng.normal(size=(rows, 1)), length - 1, axis=1).astype(np.float32)
    return {
        "tokens": np.where(attention, tokens, 0),
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "old_logprobs": (-rng.random((rows, length - 1)) * loss_mask).astype(np.float32),
        "advantages": adv * loss_mask,
    }


def make_trainer(mesh, algorithm, settings=None, optimizer=None):
    return Trainer(
        Transformer(CFG, rngs=nnx.Rngs(0)),
        ALGORITHMS[algorithm](),
        optimizer or optax.sgd(0.5, momentum=0.9),
        mesh=None if mesh is None else make_mesh(MESHES[mesh]),
        settings=settings,
    )


@functools.cache
def trained(mesh, algorithm, microbatches=1, placement="sharded", steps=2):
    settings = TrainerSettings(
        microbatches=microbatches, reference_placement=placement, critic_placement=placement
    )
    trainer = make_trainer(mesh, algorithm, settings)
    if placement == "replicated":  # a whole copy of the reference on every device
        assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(trainer.ref_params))
    metrics = [trainer.step(random_batch(seed=s)) for s in range(steps)]
    state = jax.tree.map(
        np.asarray, (trainer.state.params, trainer.state.critic, trainer.state.opt_state)
    )
    return state, metrics


def assert_same_run(got, want, atol=1e-5):
    (state, metrics), (state0, metrics0) = got, want
    for g, w in zip(jax.tree.leaves(state), jax.tree.leaves(state0), strict=True):
        np.testing.assert_allclose(g, w, atol=atol, rtol=0)
    for m, m0 in zip(metrics, metrics0, strict=True):
        assert m.keys() == m0.keys()
        for k in m:
            assert m[k] == pytest.approx(m0[k], abs=atol), k


@pytest.mark.parametrize(
    ("mesh", "algorithm"),
    [("fsdp4_tensor2", "grpo+reference"), ("data2_fsdp4", "ppo-head")],
)
def test_sharded_step_equals_single_device(mesh, algorithm):
    assert_same_run(trained(mesh, algorithm), trained(None, algorithm))


def test_sharded_microbatches_with_a_replicated_reference_equal_one_batch():
    # 16 rows over data 2 x fsdp 4 in 2 microbatches: one row per device per microbatch.
    run = trained("data2_fsdp4", "grpo+reference", microbatches=2, placement="replicated")
    assert_same_run(run, trained(None, "grpo+reference"))


def _shard_shape(shape, spec, mesh):
    out = []
    for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = () if axis is None else (axis,) if isinstance(axis, str) else axis
        out.append(dim // int(np.prod([mesh.shape[a] for a in names])))
    return tuple(out)


def test_parameters_and_optimizer_state_are_laid_out_by_the_rules():
    trainer = make_trainer("fsdp4_tensor2", "grpo+reference", optimizer=optax.adam(1e-3))
    trainer.step(random_batch())  # the layout survives the step (explicit out_shardings)
    mesh = trainer.mesh
    d, n, k, h, f, v = 32, 4, 2, 8, 64, 64
    expected = {
        "embed/embedding": ((v, d), P("tensor", "fsdp")),
        "blocks/0/attn/q/kernel": ((d, n * h), P("fsdp", "tensor")),
        "blocks/0/attn/k/kernel": ((d, k * h), P("fsdp", "tensor")),
        "blocks/0/attn/o/kernel": ((n * h, d), P("tensor", "fsdp")),
        "blocks/0/mlp/gate/kernel": ((d, f), P("fsdp", "tensor")),
        "blocks/0/mlp/down/kernel": ((f, d), P("tensor", "fsdp")),
        "blocks/0/attn_norm/scale": ((d,), P(None)),
        "final_norm/scale": ((d,), P(None)),
        "head/kernel": ((d, v), P("fsdp", "tensor")),
    }
    params = {
        param_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(trainer.state.params)[0]
    }
    for name, (shape, spec) in expected.items():
        x = params[name]
        assert x.shape == shape and x.sharding.spec == spec, (name, x.sharding.spec)
        for shard in x.addressable_shards:
            assert shard.data.shape == _shard_shape(shape, spec, mesh), name
    # Every parameter, and both adam moments of it, follow the rule for its name.
    opt = jax.tree_util.tree_flatten_with_path(trainer.state.opt_state)[0]
    moments = {}
    for path, x in opt:
        name = param_name(path)
        assert x.sharding.spec == spec_for(name, x.shape, mesh), name
        for slot in ("mu", "nu"):
            if f"/{slot}/" in name:
                moments[(slot, name.split(f"/{slot}/", 1)[1])] = x
        if name.endswith("count"):
            assert x.sharding.is_fully_replicated
    for name, x in params.items():
        assert x.sharding.spec == spec_for(name, x.shape, mesh), name
        for slot in ("mu", "nu"):
            assert moments[(slot, name)].sharding == x.sharding, (slot, name)
            assert (
                moments[(slot, name)].addressable_shards[0].data.shape
                == x.addressable_shards[0].data.shape
            )
    # The reference is laid out like the policy; the batch is split by rows over data x fsdp.
    for ref, x in zip(jax.tree.leaves(trainer.ref_params), jax.tree.leaves(trainer.state.params)):
        assert ref.sharding == x.sharding
    tokens = trainer.device_batch(random_batch())["tokens"]
    assert tokens.sharding.spec == P(("data", "fsdp", "expert"), None)
    assert {s.data.shape for s in tokens.addressable_shards} == {(4, 12)}
    with pytest.raises(ValueError, match="6 rows does not split over data x fsdp = 4 devices"):
        trainer.device_batch(random_batch(rows=6))


def test_bf16_sharded_step_trains_with_fp32_masters():
    trainer = make_trainer(
        "data2_fsdp4",
        "grpo+reference",
        TrainerSettings(compute_dtype="bfloat16"),
        optimizer=optax.adam(3e-2),
    )
    batch = random_batch(seed=3)
    losses = [trainer.step(batch)["loss"] for _ in range(6)]
    assert losses[-1] < losses[0] - 0.05, losses
    state = (trainer.state.params, trainer.state.opt_state)
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        assert x.dtype in (jnp.float32, jnp.int32), param_name(path)
        assert x.sharding.spec == spec_for(param_name(path), x.shape, trainer.mesh)
