"""The workload shared by ``test_multihost.py`` and its worker processes."""

from __future__ import annotations

import numpy as np
import optax
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer
from rlax.core.parallel.mesh import MeshConfig, make_mesh
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.trainer.step import Trainer
from rlax.plugins.algorithms.grpo import grpo

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
MESH = MeshConfig(data=2, fsdp=2, tensor=2)  # over both processes' 8 devices
ROWS, LENGTH, STEPS = 16, 12, 3


PER_MICROBATCH = 8  # packed rows of LENGTH in the token budget (global)
SHORT = 3  # tokens of every sequence of the last step's batch


def trainer(mesh: MeshConfig | None) -> Trainer:
    # Packed rows, microbatches of 8 rows: each process packs its own rows.
    return Trainer(
        Transformer(CFG, rngs=nnx.Rngs(0)),
        grpo(kl_beta=0.1),
        optax.sgd(0.5, momentum=0.9),
        mesh=None if mesh is None else make_mesh(mesh),
        settings=TrainerSettings(packing="packed", microbatch_tokens=PER_MICROBATCH * LENGTH),
    )


def batch(step: int) -> dict[str, np.ndarray]:
    """Steps before the last: sequences of 9-12 tokens, a row each (the budget's layout:
    two microbatches of 8 rows). The last: SHORT tokens each, 4 to a row, so the 16 fill
    4 rows, at most half the budget's (packing.layout: one microbatch of 4 rows)."""
    rng = np.random.default_rng(step)
    tokens = rng.integers(1, CFG.vocab_size, size=(ROWS, LENGTH)).astype(np.int32)
    pad = rng.integers(0, 4, size=ROWS)
    end = LENGTH - rng.integers(0, 4, size=ROWS)
    if step == STEPS - 1:
        end = pad + SHORT
    pos = np.arange(LENGTH)
    attention = (pos >= pad[:, None]) & (pos < end[:, None])
    first_target = 5 if step < STEPS - 1 else 0  # the short rows: every next token
    loss_mask = (attention[:, 1:] & attention[:, :-1] & (pos[1:] >= first_target)).astype(
        np.float32
    )
    adv = np.repeat(rng.normal(size=(ROWS, 1)), LENGTH - 1, axis=1).astype(np.float32)
    return {
        "tokens": np.where(attention, tokens, 0),
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "old_logprobs": (-rng.random((ROWS, LENGTH - 1)) * loss_mask).astype(np.float32),
        "advantages": adv * loss_mask,
    }
