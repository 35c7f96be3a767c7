"""benchmarks/train_step.py's batch: old logprobs near the policy, so the loss check reaches the forward pass.

The script compares rlax's first loss with a torch step's. Old logprobs far from
the policy's clip nearly every token, and the loss is then the advantages' alone:
two steps with different forward passes would agree. The batch it builds must
leave both clipped and unclipped tokens."""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys

import numpy as np
from flax import nnx

from rlax.core.models.transformer import Transformer
from rlax.core.trainer.teacher import Teacher

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLIP = (0.8, 1.2)  # grpo()'s clip range


def load():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(
            "train_step", ROOT / "benchmarks" / "train_step.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def tiny(m):
    a = argparse.Namespace(
        vocab=64,
        hidden=32,
        layers=1,
        heads=2,
        kv_heads=1,
        head_dim=16,
        mlp=64,
        batch=8,
        seq=24,
        prompt=8,
    )
    return a, Transformer(m.model_config(a), rngs=nnx.Rngs(0))


def test_old_logprobs_lie_within_the_spread_of_the_policys_own_and_nowhere_else():
    m = load()
    a, model = tiny(m)
    batch = m.make_batch(a)
    near = m.near_policy(batch, model, spread=0.4)
    mask = batch["loss_mask"] > 0
    gap = near["old_logprobs"] - Teacher(model).logprobs(batch)
    assert np.abs(gap[mask]).max() <= 0.4 + 1e-6
    assert np.all(near["old_logprobs"][~mask] == 0.0)
    for key in ("tokens", "attention_mask", "loss_mask", "advantages"):
        assert near[key] is batch[key]


def test_the_ratios_fall_on_both_sides_of_the_clip_range_unlike_random_old_logprobs():
    m = load()
    a, model = tiny(m)
    batch = m.make_batch(a)
    mask = batch["loss_mask"] > 0
    logp = Teacher(model).logprobs(batch)

    def clipped_share(old):
        ratio = np.exp(logp - old)[mask]
        return np.mean((ratio < CLIP[0]) | (ratio > CLIP[1]))

    # e^-0.4..e^0.4 uniform in log space: about half of the tokens outside [0.8, 1.2]
    assert 0.3 < clipped_share(m.near_policy(batch, model)["old_logprobs"]) < 0.7
    assert clipped_share(batch["old_logprobs"]) > 0.95  # random: the loss ignores the policy
