"""Prefix-shared training: a group's shared prefix once, each completion a branch of it.

The tree's mask and positions are checked by hand; a branch's logprobs are the ones
its sequence has alone; and for every shipped algorithm (built from its experiment
file) one update on a ragged batch of single-turn groups and multi-turn episodes
gives the flat packed update's loss and parameters (fp32, 1e-5). ``"auto"`` picks the
layout on a prompt-heavy batch and not where nothing is shared; what cannot be shared
exactly is refused.
"""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlax.core.models import lora
from rlax.core.models.transformer import (
    Transformer,
    causal_mask,
    positions_from_mask,
    sequence_logprobs,
    tree_ids,
)
from rlax.core.trainer import prefix
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.trainer.step import Trainer
from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.algorithms.grpo import grpo

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
from layout_cases import CFG, EPISODE_MASK, arrays_of, ragged_groups
from test_packing import EXPERIMENTS, pm, shipped  # noqa: F401  (pm: the fixture)

sys.path.remove(str(HERE))


def test_a_tree_mask_and_positions_by_hand():
    # Row: shared piece (segment 1) of 3 tokens, branch 2 of 2 tokens, branch 3 of 3, pad.
    seg = jnp.array([[1, 1, 1, 2, 2, 3, 3, 3, 0]])
    parent = jnp.array([[0, 0, 0, 1, 1, 1, 1, 1, 0]])
    mask = tree_ids(seg, parent)
    # Positions continue from the shared piece's 3 tokens.
    assert positions_from_mask(mask)[0].tolist() == [0, 1, 2, 3, 4, 3, 4, 5, 0]
    m = np.asarray(causal_mask(mask)[0])
    assert m[4].tolist() == [1, 1, 1, 1, 1, 0, 0, 0, 0]  # branch 2: the prefix and itself
    assert m[6].tolist() == [1, 1, 1, 0, 0, 1, 1, 0, 0]  # branch 3 never sees branch 2
    assert m[2].tolist() == [1, 1, 1, 0, 0, 0, 0, 0, 0]  # the prefix sees itself only
    # Without parents the mask is packing's (segment ids).
    flat = np.asarray(causal_mask(seg)[0])
    assert flat[6].tolist() == [0, 0, 0, 0, 0, 1, 1, 0, 0]


def test_a_branch_has_the_logprobs_of_its_sequence_alone():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    fn = jax.jit(lambda t, s: sequence_logprobs(model, t, s)[0])
    prompt, a, b = [5, 6, 7, 8], [9, 10], [11, 12, 13]
    # Tree: prompt[:-1] once, then each branch starts with the prompt's last token.
    tokens = np.array([[5, 6, 7, 8, 9, 10, 8, 11, 12, 13]], np.int32)
    seg = np.array([[1, 1, 1, 2, 2, 2, 3, 3, 3, 3]], np.int32)
    parent = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1]], np.int32)
    tree = np.asarray(fn(tokens, np.asarray(tree_ids(seg, parent))))[0]
    for branch, start in ((a, 3), (b, 6)):
        alone = np.array([prompt + branch], np.int32)
        want = np.asarray(fn(alone, alone > 0))[0]
        # The branch's own positions predict its tokens after the prompt's last one.
        np.testing.assert_allclose(tree[start : start + len(branch)], want[3:], atol=1e-6)
    # The shared piece's positions predict the prompt's tokens 1..3 (the same in each row).
    alone = np.array([prompt + a], np.int32)
    np.testing.assert_allclose(tree[:3], np.asarray(fn(alone, alone > 0))[0, :3], atol=1e-6)


def test_the_plan_shares_the_prompt_and_the_way_back_reads_it():
    algorithm = grpo()
    arrays = arrays_of(algorithm, ragged_groups(0, prompts=(3, 6), lengths=(2, 4, 5)))
    tokens, mask, loss = arrays["tokens"], arrays["attention_mask"], arrays["loss_mask"]
    p = prefix.plan(tokens, mask, loss, width=64)
    trees = [i for i in p.items if i.shared]
    assert sorted(len(i.rows) for i in trees) == [3, 3]
    # Shared pieces are the prompts less their last token (completions differ at once,
    # unless two share a first token: then more).
    assert sorted(i.shared for i in trees) >= [2, 5]
    assert prefix.packed_tokens(p) < int(mask.sum())
    out = prefix.pack(arrays, 64, 2, p, k=1)
    flat = out["packed_tokens"].reshape(-1)
    index = out["unpack_index"]
    # Every target read back through the index is its padded row's next token.
    cols = out["packed_tokens"].shape[1]
    for r, t in zip(*np.nonzero(index >= 0), strict=True):
        g, c = divmod(int(index[r, t]), cols - 1)
        assert flat[g * cols + c + 1] == tokens[r, t + 1], (r, t)
    assert (index >= 0).sum() == int((mask.sum(1) - 1).clip(0).sum())


def episodes(seed: int = 0) -> list[Group]:
    """Two groups of multi-turn episodes whose first turn and observation are the same in
    three of four episodes (history shared beyond the prompt) and a single-turn group."""
    rng = np.random.default_rng(seed)
    groups = []
    for g, prompt_len in enumerate((4, 7)):
        prompt = Prompt(str(g), "", rng.integers(1, 32, prompt_len).astype(np.int32), "")
        history = rng.integers(1, 32, 6).astype(np.int32)  # turn 1 (3) + observation (3)
        completions = []
        for e in range(4):
            own = rng.integers(1, 32, 3).astype(np.int32)
            other = rng.integers(1, 32, 6).astype(np.int32)  # the fourth's own history
            tokens = np.concatenate([history if e < 3 else other, own])
            logprobs = (-rng.random(9).astype(np.float32) - 0.2) * EPISODE_MASK
            completions.append(Completion(tokens, logprobs, "", "stop", 0, None, EPISODE_MASK))
        groups.append(Group(prompt, tuple(completions), rng.random(4).astype(np.float32)))
    return groups + ragged_groups(seed + 1, prompts=(5,), lengths=(2, 7, 12, 3))


def updated(algorithm, arrays, mode: str, lr: float = 1.0):
    settings = TrainerSettings(packing=mode, microbatch_tokens=64)
    trainer = Trainer(
        Transformer(CFG, rngs=nnx.Rngs(0)), algorithm, optax.sgd(lr), settings=settings
    )
    laid = trainer.layout(dict(arrays))
    trees = mode == "prefix"
    assert trees == bool((laid.get("packed_segments", np.zeros(1)) >= 1 << 16).any())
    metrics = trainer.step(arrays)
    return metrics, (trainer.state.params, trainer.state.critic)


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_a_prefix_shared_update_is_the_flat_packed_update(pm, name):  # noqa: F811
    algorithm = shipped(pm, name)
    for groups in (ragged_groups(0), episodes(0)):  # single-turn groups; multi-turn episodes
        arrays = arrays_of(algorithm, groups)
        want, flat = updated(algorithm, arrays, "packed")
        got, tree = updated(algorithm, arrays, "prefix")
        for key in ("loss", "entropy", "mismatch_kl"):
            assert got[key] == pytest.approx(want[key], abs=1e-5), key
        leaves = jax.tree.leaves(flat)
        assert leaves
        for a, b in zip(jax.tree.leaves(tree), leaves, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_episodes_share_their_common_history():
    arrays = arrays_of(grpo(), episodes(0))
    p = prefix.plan(arrays["tokens"], arrays["attention_mask"], arrays["loss_mask"], 256)
    shared = sorted(i.shared for i in p.items if i.shared)
    # Groups of prompt 4 and 7: three of four episodes share 6 history tokens, the fourth
    # only the prompt: the group's common prefix is the prompt (s - 1 = 3 and 6 shared),
    # and the single-turn group of prompt 5 shares 4 (or more).
    assert shared[:2] == [3, 4] and 6 in shared


def test_auto_picks_prefix_sharing_on_long_prompts_and_not_without_sharing():
    rng = np.random.default_rng(0)
    prompt = Prompt("p", "", rng.integers(1, 32, 40).astype(np.int32), "")
    completions = tuple(
        Completion(rng.integers(1, 32, n).astype(np.int32), -np.ones(n, np.float32), "", "stop", 0)
        for n in (3, 5, 8, 4, 6, 7, 2, 8)
    )
    heavy = arrays_of(grpo(), [Group(prompt, completions, rng.random(8).astype(np.float32))], 8)
    settings = TrainerSettings(packing="auto", microbatch_tokens=512)
    trainer = Trainer(Transformer(CFG, rngs=nnx.Rngs(0)), grpo(), optax.sgd(0.1), settings=settings)
    laid = trainer.layout(dict(heavy))
    assert (laid["packed_segments"] >= 1 << 16).any()  # trees
    # One completion per prompt: nothing to share, so no trees.
    singles = arrays_of(grpo(), ragged_groups(0, prompts=(3, 6, 4), lengths=(9,)))
    laid = trainer.layout(dict(singles))
    assert not (laid.get("packed_segments", np.zeros(1)) >= 1 << 16).any()


def test_what_cannot_be_shared_exactly_is_refused():
    arrays = arrays_of(grpo(), ragged_groups(0))
    settings = TrainerSettings(packing="prefix", microbatch_tokens=64)
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    config = lora.LoraConfig(rank=2, dropout=0.1)
    trainer = Trainer(model, grpo(), optax.sgd(0.1), settings=settings, lora=config)
    with pytest.raises(ValueError, match=r"packing='prefix': LoRA dropout .*; use 'packed'"):
        trainer.step(arrays)
    auto = TrainerSettings(packing="auto", microbatch_tokens=64)
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    trainer = Trainer(model, grpo(), optax.sgd(0.1), settings=auto, lora=config)
    laid = trainer.layout(dict(arrays))
    assert not (laid.get("packed_segments", np.zeros(1)) >= 1 << 16).any()


@pytest.mark.parametrize("mode", ["padded", "packed", "prefix"])
def test_attention_in_blocks_gives_the_dense_update_in_every_layout(mode):
    """``attention_block``: the same loss and parameters as dense attention (fp32, 1e-5),
    on single-turn groups and multi-turn episodes, with blocks smaller than the rows."""
    algorithm = grpo()
    for groups in (ragged_groups(0), episodes(0)):
        arrays = arrays_of(algorithm, groups)
        runs = []
        for block in (0, 8):
            settings = TrainerSettings(packing=mode, microbatch_tokens=64, attention_block=block)
            model = Transformer(CFG, rngs=nnx.Rngs(0))
            trainer = Trainer(model, algorithm, optax.sgd(1.0), settings=settings)
            runs.append((trainer.step(arrays), trainer.state.params))
        (want, dense), (got, blocks) = runs
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
        for a, b in zip(jax.tree.leaves(blocks), jax.tree.leaves(dense), strict=True):
            # The step at lr 1 moves some leaves to ~1e7: within 1e-5 of each leaf's scale.
            scale = max(1.0, float(np.abs(np.asarray(b)).max()))
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5 * scale)
