"""The trainer's activation memory estimate against XLA's compiled memory analysis.

Without remat the estimate is within 15% of the temporary memory XLA:CPU assigns to
one microbatch's forward and backward pass (the activations: parameters and their
gradients are arguments and outputs, not temporaries), over model widths, depths and
row lengths; its laws hold (remat keeps less, context parallelism divides the scores);
and the trainer prints it when it compiles a step. The context-split figures are
checked per device on 8 fake devices (``context_checks.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.parallel.mesh import single_device_mesh
from rlax.core.trainer.memory import activation_bytes
from rlax.core.trainer.microbatch import wrap_blocks
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.trainer.step import Trainer
from rlax.plugins.algorithms.grpo import grpo


def config(layers: int, dim: int, mlp: int, heads: int = 4, kv: int = 2) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=256,
        num_layers=layers,
        embed_dim=dim,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=dim // heads,
        mlp_dim=mlp,
    )


def measured(
    cfg: TransformerConfig, rows: int, width: int, remat: str = "none", block: int = 0
) -> int:
    """XLA's temporary bytes of one microbatch's forward and backward pass."""
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    mesh = single_device_mesh()

    def loss(p, tokens, segments):
        model = wrap_blocks(nnx.merge(graphdef, p), remat, mesh, block)
        return sequence_logprobs(model, tokens, segments)[0].sum()

    tokens = jnp.ones((rows, width), jnp.int32)
    compiled = jax.jit(jax.grad(loss)).lower(params, tokens, tokens).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize(
    ("layers", "dim", "mlp", "rows", "width"),
    [(1, 64, 128, 1, 1024), (4, 64, 128, 2, 512), (2, 128, 512, 4, 128), (4, 256, 1024, 1, 1024)],
)
def test_the_estimate_is_within_15_percent_of_the_compiled_peak(layers, dim, mlp, rows, width):
    cfg = config(layers, dim, mlp)
    estimate = activation_bytes(cfg, rows, width).total
    assert abs(estimate / measured(cfg, rows, width) - 1) <= 0.15


@pytest.mark.parametrize(
    ("layers", "dim", "mlp", "rows", "width"),
    [(1, 64, 128, 1, 1024), (4, 64, 128, 2, 512), (2, 128, 512, 1, 2048)],
)
def test_with_attention_in_blocks_too(layers, dim, mlp, rows, width):
    """``attention_block``: no score matrix is kept, and the estimate follows."""
    cfg = config(layers, dim, mlp)
    estimate = activation_bytes(cfg, rows, width, 1, "none", "float32", 128).total
    peak = measured(cfg, rows, width, block=128)
    assert abs(estimate / peak - 1) <= 0.15
    assert peak < measured(cfg, rows, width) / 2  # the scores were most of it


def test_the_estimate_laws():
    cfg = config(4, 128, 512)
    none, block, dots = (activation_bytes(cfg, 2, 2048, 1, r).total for r in REMATS)
    assert block < dots < none  # remat keeps less between the passes
    # Long rows: the scores dominate, so context degree c divides the estimate by about c.
    ratio = activation_bytes(cfg, 1, 8192, 4).total / activation_bytes(cfg, 1, 8192, 1).total
    assert 0.15 < ratio <= 0.35
    # Twice the rows, twice the memory.
    assert activation_bytes(cfg, 4, 512).total == 2 * activation_bytes(cfg, 2, 512).total


REMATS = ("none", "block", "block_dots")


def test_the_trainer_prints_its_estimate_when_it_compiles(capsys):
    cfg = config(1, 64, 128)
    settings = TrainerSettings(packing="padded")
    trainer = Trainer(Transformer(cfg, rngs=nnx.Rngs(0)), grpo(), optax.sgd(0.1), settings=settings)
    rows, width = 4, 16
    arrays = {
        "tokens": jnp.ones((rows, width), jnp.int32),
        "attention_mask": jnp.ones((rows, width), bool),
        "loss_mask": jnp.ones((rows, width - 1)),
        "old_logprobs": -jnp.ones((rows, width - 1)),
        "advantages": jnp.ones((rows, width - 1)),
    }
    trainer.step(arrays)
    want = activation_bytes(cfg, rows, width).describe()
    assert want in capsys.readouterr().out
    trainer.step(arrays)  # compiled: printed once
    assert want not in capsys.readouterr().out
