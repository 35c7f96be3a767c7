"""Every layout exact or refused: the batches where the padded and packed layouts used to differ.

Two classes (issue 56, item 3): a target with no position in one of the layouts (a
prompt of 0 tokens: its first completion token is predicted from padding) is refused
in every layout with the same error; randomness drawn in a layout's shape (LoRA
dropout) is drawn per token instead, so the padded and packed updates are equal for a
fixed key.
"""

from __future__ import annotations

import pathlib
import sys

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from rlax.core.models import lora
from rlax.core.models.transformer import Transformer
from rlax.core.trainer import packing
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.trainer.step import Trainer, batch_arrays
from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.algorithms.grpo import grpo

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
from layout_cases import CFG, ragged_arrays

sys.path.remove(str(HERE))

LAYOUTS = ("padded", "packed", "prefix", "auto")


def trainer(mode: str, lora_config: lora.LoraConfig | None = None, lr: float = 1.0) -> Trainer:
    settings = TrainerSettings(packing=mode, microbatch_tokens=40)
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    algorithm = grpo(alignment="mask", is_bounds=(0.01, 100.0))  # drops the planted token
    return Trainer(model, algorithm, optax.sgd(lr), settings=settings, lora=lora_config)


def empty_prompt_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    groups = []
    for prompt_len in (0, 3):  # group 0's prompt has no tokens
        prompt = Prompt(str(prompt_len), "", rng.integers(1, 32, prompt_len).astype(np.int32), "")
        completions = tuple(
            Completion(
                rng.integers(1, 32, n).astype(np.int32), -np.ones(n, np.float32), "", "stop", 0
            )
            for n in (2, 5)
        )
        groups.append(Group(prompt, completions, np.array([0.0, 1.0], np.float32)))
    advantages = np.array([[-1.0, 1.0], [-1.0, 1.0]], np.float32)
    return batch_arrays(make_batch(groups, advantages, completion_len=8))


@pytest.mark.parametrize("mode", LAYOUTS)
def test_a_prompt_of_zero_tokens_is_refused_in_every_layout(mode):
    arrays = empty_prompt_arrays()
    # Row 0: P = 8 prompt columns all padding, its first completion token at column 8 is the
    # target of position 7, whose input token is padding.
    assert not arrays["attention_mask"][0, 7] and arrays["loss_mask"][0, 7] == 1
    with pytest.raises(ValueError, match=r"batch row 0: loss_mask position 7 predicts token 8"):
        trainer(mode).step(arrays)


@pytest.mark.parametrize("mode", LAYOUTS)
def test_a_target_past_the_sequence_end_is_refused_in_every_layout(mode):
    arrays = ragged_arrays(grpo())
    # Row 0 (prompt 3, completion 1): a loss-mask 1 one position past its last target.
    last = int(np.flatnonzero(arrays["loss_mask"][0])[-1])
    arrays["loss_mask"][0, last + 1] = 1.0
    match = rf"batch row 0: loss_mask position {last + 1} .* token t \+ 1 is padding"
    with pytest.raises(ValueError, match=match):
        trainer(mode).step(arrays)


def test_check_targets_passes_every_real_target():
    packing.check_targets(ragged_arrays(grpo()))  # the ragged batch packs exactly: no refusal


def test_lora_dropout_gives_one_update_padded_and_packed():
    config = lora.LoraConfig(rank=2, dropout=0.5, seed=3)
    arrays = ragged_arrays(grpo())
    results = {}
    for mode in ("padded", "packed"):
        t = trainer(mode, config)
        assert ("packed_tokens" in t.layout(dict(arrays))) == (mode == "packed")
        t.step(arrays)  # b = 0: the loss cannot see dropout yet, b's gradient does
        first = jax.tree.leaves(lora.adapters_of(t.state.params))
        second = t.step(arrays)  # the same dropout key advanced: new masks, in both layouts
        results[mode] = (first, second, jax.tree.leaves(lora.adapters_of(t.state.params)))
    (f1, s1, padded), (f2, s2, packed) = results["padded"], results["packed"]
    assert s2["loss"] == pytest.approx(s1["loss"], abs=1e-5)
    for got, want in zip([*f2, *packed], [*f1, *padded], strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    # The dropout acts: without it the second update's loss differs.
    plain = trainer("padded", lora.LoraConfig(rank=2, dropout=0.0, seed=3))
    plain.step(arrays)
    assert plain.step(arrays)["loss"] != pytest.approx(s1["loss"], abs=1e-4)


def test_dropout_masks_follow_token_identity_not_position():
    key = jax.random.PRNGKey(0)
    ids = np.array([5, 9, 2, 5], np.int32)
    keep = np.asarray(lora.dropout_keep(key, ids, 64, 0.5))
    np.testing.assert_array_equal(keep[0], keep[3])  # token 5 twice: one mask
    assert not np.array_equal(keep[0], keep[1])
    again = np.asarray(lora.dropout_keep(key, ids[::-1].copy(), 64, 0.5))
    np.testing.assert_array_equal(again[::-1], keep)  # reordered rows: the same masks
    assert 0.3 < keep.mean() < 0.7
