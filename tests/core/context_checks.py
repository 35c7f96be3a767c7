"""Context parallelism on 8 fake devices; ``test_context_parallel.py`` runs this file.

Not collected by the main suite (its name does not start with ``test_``): the main
pytest process has started JAX with one device. Run it directly with
``XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest
tests/core/context_checks.py``.

For context degree 2 and 4, alone and with fsdp 2 (and degree 2 with tensor 2): one packed SGD(lr = 1) step on a
ragged batch whose packed rows have segment boundaries on and across the split points
gives the one-device packed step's loss, gradient (the parameters' change) and updated
parameters (fp32, 1e-5); a second ragged batch of the same layout compiles nothing.
Training attention in blocks (``attention_block``) with rows over data/fsdp (and heads
over tensor) gives the one-device dense step, and is refused beside a context axis.
The trainer's activation memory estimate is within 15% of each device's compiled peak
at degree 1, 2 and 4, and degree 4 holds at most 0.35 of degree 1's.
"""

from __future__ import annotations

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
from layout_cases import arrays_of, ragged_groups

from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.parallel.mesh import MeshConfig, make_mesh, tree_shardings
from rlax.core.trainer.memory import activation_bytes
from rlax.core.trainer.microbatch import wrap_blocks
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.trainer.step import Trainer
from rlax.plugins.algorithms.grpo import grpo

CFG = TransformerConfig(
    vocab_size=32,
    num_layers=2,
    embed_dim=16,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=32,
    tie_embeddings=False,
)
MESHES = {  # (data, fsdp, tensor), context
    "context2": MeshConfig(1, 1, 1, context=2),
    "context4": MeshConfig(1, 1, 1, context=4),
    "fsdp2_context2": MeshConfig(1, 2, 1, context=2),
    "fsdp2_context4": MeshConfig(1, 2, 1, context=4),
    "tensor2_context2": MeshConfig(1, 1, 2, context=2),
}
WIDTH = 16  # packed rows of 16 tokens: split points at 8 (degree 2) and 4, 8, 12 (degree 4)
# Prompts of 3 and 5 and completions of 1, 5, 9 and 12 tokens (9: a two-turn episode):
# sequences of 4, 8, 12, 15 and 6, 10, 14, 17 -> 17 > 16 is cut by the budget below.
PROMPTS, LENGTHS = (3, 4), (1, 4, 9, 12)


def algorithm():
    return grpo(kl_beta=0.05, alignment="mask", is_bounds=(0.01, 100.0))


def batch(seed: int) -> dict[str, np.ndarray]:
    return arrays_of(algorithm(), ragged_groups(seed, PROMPTS, LENGTHS), seed=seed + 1)


def trainer(mesh, microbatch_tokens: int, attention_block: int = 0) -> Trainer:
    settings = TrainerSettings(
        packing="packed",
        row_tokens=WIDTH,
        microbatch_tokens=microbatch_tokens,
        attention_block=attention_block,
    )
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    return Trainer(model, algorithm(), optax.sgd(1.0), mesh=mesh, settings=settings)


def one_step(mesh, arrays, microbatch_tokens: int, attention_block: int = 0):
    t = trainer(mesh, microbatch_tokens, attention_block)
    before = jax.tree.map(np.asarray, t.state.params)
    metrics = t.step(arrays)
    after = jax.tree.map(np.asarray, t.state.params)
    return t, metrics, before, after


def boundaries(segments: np.ndarray, degree: int) -> tuple[bool, bool]:
    """(a segment starts exactly at a split point, a segment spans one) in packed rows."""
    split = WIDTH // degree
    on = across = False
    for row in segments:
        for cut in range(split, WIDTH, split):
            if row[cut] > 0 and row[cut] != row[cut - 1]:
                on = True
            if row[cut] > 0 and row[cut] == row[cut - 1]:
                across = True
    return on, across


def count_compiles():
    count = [0]

    def listen(event: str, *_args, **_kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            count[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    return count


COMPILES = count_compiles()


def test_eight_devices():
    assert jax.device_count() == 8


@pytest.mark.parametrize("microbatch_tokens", [2 * WIDTH, 64 * WIDTH])  # two passes; one
@pytest.mark.parametrize("name", sorted(MESHES))
def test_a_context_split_step_is_the_one_device_packed_step(name, microbatch_tokens):
    config = MESHES[name]
    size = config.data * config.fsdp * config.tensor * config.context
    mesh = make_mesh(config, jax.devices()[:size])
    single = make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])
    arrays = batch(0)
    t, metrics, before, after = one_step(mesh, arrays, microbatch_tokens)
    laid = t.layout(dict(arrays))
    on, across = boundaries(laid["packed_segments"], config.context)
    assert on and across, "the batch must put segment boundaries on and across split points"
    _, want, want_before, want_after = one_step(single, arrays, microbatch_tokens)
    for key in ("loss", "entropy", "grad_norm", "mismatch_kl"):
        assert metrics[key] == pytest.approx(want[key], abs=1e-5), key
    leaves = list(zip(jax.tree.leaves(after), jax.tree.leaves(want_after), strict=True))
    assert leaves
    for (got, want_p), b, wb in zip(
        leaves, jax.tree.leaves(before), jax.tree.leaves(want_before), strict=True
    ):
        np.testing.assert_allclose(got - b, want_p - wb, atol=1e-5)  # the gradient (lr = 1)
        np.testing.assert_allclose(got, want_p, atol=1e-5)
    # The activations were split by sequence: the step's program holds the context gathers.
    hlo = t.lower(arrays).compile().as_text()
    assert "all-gather" in hlo
    # Warm: another ragged batch of the same layout compiles nothing.
    t.step(arrays)
    start = COMPILES[0]
    t.step(batch(1))
    t.step(batch(2))
    assert COMPILES[0] == start


@pytest.mark.parametrize("config", [MeshConfig(1, 2, 1), MeshConfig(2, 2, 2)])
def test_attention_in_blocks_on_sharded_rows_is_the_one_device_dense_step(config):
    """``attention_block`` with rows over data/fsdp (and heads over tensor): the one-device
    dense step's loss and parameters; a new batch of the layout compiles nothing."""
    size = config.data * config.fsdp * config.tensor
    mesh = make_mesh(config, jax.devices()[:size])
    single = make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])
    arrays = batch(0)
    t, metrics, _, after = one_step(mesh, arrays, 64 * WIDTH, attention_block=4)
    _, want, _, want_after = one_step(single, arrays, 64 * WIDTH)
    assert metrics["loss"] == pytest.approx(want["loss"], abs=1e-5)
    for got, want_p in zip(jax.tree.leaves(after), jax.tree.leaves(want_after), strict=True):
        np.testing.assert_allclose(got, want_p, atol=1e-5)
    t.step(arrays)
    start = COMPILES[0]
    t.step(batch(1))
    assert COMPILES[0] == start


def test_attention_in_blocks_is_refused_with_a_context_axis():
    mesh = make_mesh(MESHES["context2"], jax.devices()[:2])
    with pytest.raises(ValueError, match=r"attention_block > 0 with a context mesh axis of 2"):
        trainer(mesh, 64 * WIDTH, attention_block=4)


MEMORY_CFG = TransformerConfig(
    vocab_size=256,
    num_layers=4,
    embed_dim=128,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    mlp_dim=512,
)


def measured_per_device(context: int, width: int) -> int:
    """XLA's temporary bytes per device of one row's forward and backward pass, the row's
    sequence split over ``context`` devices."""
    mesh = make_mesh(MeshConfig(1, 1, 1, context=context), jax.devices()[:context])
    graphdef, params = nnx.split(Transformer(MEMORY_CFG, rngs=nnx.Rngs(0)))
    params = jax.device_put(params, tree_shardings(params, mesh))

    def loss(p, tokens, segments):
        model = wrap_blocks(nnx.merge(graphdef, p), "none", mesh)
        return sequence_logprobs(model, tokens, segments)[0].sum()

    spec = P(None, "context") if context > 1 else P()
    tokens = jax.device_put(jnp.ones((1, width), jnp.int32), NamedSharding(mesh, spec))
    compiled = jax.jit(jax.grad(loss)).lower(params, tokens, tokens).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_the_memory_estimate_per_device_under_context_parallelism():
    width = 2048
    got = {c: measured_per_device(c, width) for c in (1, 2, 4)}
    for c, peak in got.items():
        estimate = activation_bytes(MEMORY_CFG, 1, width, c).total
        assert abs(estimate / peak - 1) <= 0.15, (c, estimate, peak)
    assert got[4] / got[1] <= 0.35  # degree 4 holds about a quarter of the activations
