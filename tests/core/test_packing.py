"""Packed training: the loss and gradients of a packed batch are the padded batch's.

The packing rule and its edges are checked by hand; a segment never sees
another; and for every shipped algorithm (built from its experiment file)
one update on a ragged batch with a two-turn episode and an alignment mask
gives the padded update's loss and parameters (fp32, 1e-5).
"""

from __future__ import annotations

import dataclasses
import pathlib

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from test_algorithm_configs import EXPERIMENTS  # each shipped algorithm's experiment file

from rlax.core import config, plugins
from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.trainer import packing
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.trainer.step import Trainer, batch_arrays
from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.algorithms.aggregation import Aggregation
from rlax.plugins.algorithms.alignment import Alignment
from rlax.plugins.algorithms.drgrpo import drgrpo
from rlax.plugins.algorithms.grpo import grpo

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
CFG = TransformerConfig(
    vocab_size=32, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)
BUDGET = 12  # the sampler's max_new_tokens: completions padded to it


# -- the packing rule ------------------------------------------------------------


def rows_of(lengths, width=None, left=0):
    """An attention mask whose row r holds lengths[r] real tokens starting at ``left``."""
    width = width or left + max(lengths)
    mask = np.zeros((len(lengths), width), bool)
    for r, n in enumerate(lengths):
        mask[r, left : left + n] = True
    return mask


def test_first_fit_decreasing_by_hand():
    # W = 10, lengths 5, 9, 3, 7: 9 opens row 0 (1 left), 7 opens row 1 (3 left),
    # 5 opens row 2, 3 goes to row 1 (the first with room) at column 7.
    p = packing.plan(rows_of([5, 9, 3, 7]), 10)
    assert p.bins.tolist() == [2, 0, 1, 1]
    assert p.offsets.tolist() == [0, 0, 7, 0]
    assert p.used == 3


def test_a_sequence_that_exactly_fills_a_row_and_one_longer_is_refused():
    # Longest first: 10 fills row 0 exactly, 6 opens row 1, 4 follows it at column 6.
    p = packing.plan(rows_of([10, 4, 6]), 10)
    assert p.bins.tolist() == [0, 1, 1] and p.offsets.tolist() == [0, 6, 0]
    with pytest.raises(ValueError, match=r"row 1's sequence has 11 tokens > the packed row's 10"):
        packing.plan(rows_of([10, 11]), 10)


def test_microbatch_slots_fill_microbatch_zero_first():
    # 5 rows, 2 per microbatch: k = 3; split_rows puts row g in microbatch g % 3.
    k, order = packing.slots(5, 2)
    assert k == 3 and order.tolist() == [0, 3, 1, 4, 2, 5]
    assert [g % k for g in order] == [0, 0, 1, 1, 2, 2]


def test_a_batch_filling_little_of_a_microbatch_gets_one_small_microbatch():
    # A budget of 14 packed rows, a batch of 16 rows. 4 rows used: one microbatch of 4
    # rows (a power of two), not 2 slots of 14; 5 used would take 8, more than half of
    # 14: the budget's layout, ceil(16 / 14) = 2 slots.
    assert packing.layout(4, 16, 14) == (1, 4)
    assert packing.layout(3, 16, 14) == (1, 4)
    assert packing.layout(1, 16, 14) == (1, 1) and packing.layout(0, 16, 14) == (1, 1)
    assert packing.layout(5, 16, 14) == (2, 14)
    assert packing.layout(3, 16, 14, multiple=8) == (2, 14)  # 4 rounds up to 8 devices' rows
    assert packing.layout(3, 16, 16, multiple=8) == (1, 8)
    # the step reads k back off the packed rows' count, whichever layout was chosen
    for used in range(17):
        for multiple in (1, 2, 8):
            budget = -(-14 // multiple) * multiple
            k, per = packing.layout(used, 16, budget, multiple)
            assert per * 2 <= budget or per == budget, (used, multiple)
            assert packing.microbatch_slots(k * per, budget) == k, (used, multiple)


def test_pack_lays_tokens_segments_and_the_way_back():
    tokens = np.array([[0, 0, 5, 6, 7], [0, 8, 9, 10, 11], [0, 0, 0, 12, 13]], np.int32)
    mask = tokens > 0
    arrays = {"tokens": tokens, "attention_mask": mask, "loss_mask": np.ones((3, 4), np.float32)}
    out = packing.pack(arrays, width=7, per_microbatch=1)
    # FFD: row 1's 4 tokens open packed row 0, row 0's 3 follow them (4 + 3 = 7 = W),
    # row 2's 2 open packed row 1.
    assert out["packed_tokens"][:2].tolist() == [[8, 9, 10, 11, 5, 6, 7], [12, 13, 0, 0, 0, 0, 0]]
    assert out["packed_segments"][:2].tolist() == [[1, 1, 1, 1, 2, 2, 2], [1, 1, 0, 0, 0, 0, 0]]
    # k = 3 slots of one row: filling positions 0, 1 are packed rows 0 and 1.
    assert out["packed_tokens"].shape == (3, 7) and not out["packed_segments"][2].any()
    # Row 0's targets 2, 3 (predicting 6, 7) are packed row 0's columns 4, 5 (of W - 1 = 6).
    assert out["unpack_index"].tolist() == [
        [-1, -1, 4, 5],
        [-1, 0, 1, 2],
        [-1, -1, -1, 6],  # a one-token target: row 2's 12 -> 13, packed row 1 column 0
    ]
    assert "tokens" not in out and out["loss_mask"] is arrays["loss_mask"]


# -- the model on packed rows -------------------------------------------------------


def test_a_segment_never_sees_another():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 32, (2, 12)).astype(np.int32)
    segments = np.array([[1] * 4 + [2] * 5 + [3] * 3, [1] * 7 + [0] * 5], np.int32)
    fn = jax.jit(lambda t, s: sequence_logprobs(model, t, s)[0])
    before = np.asarray(fn(tokens, segments))
    changed = tokens.copy()
    changed[0, 4:9] = rng.integers(1, 32, 5)  # segment 2 of row 0
    after = np.asarray(fn(changed, segments))
    # Targets t -> t + 1 inside segments 1 (0..2) and 3 (9..10), and all of row 1: bit-identical.
    np.testing.assert_array_equal(after[0, :3], before[0, :3])
    np.testing.assert_array_equal(after[0, 9:], before[0, 9:])
    np.testing.assert_array_equal(after[1], before[1])
    assert not np.array_equal(after[0, 4:8], before[0, 4:8])
    # A packed segment's logprobs are the ones it has alone, left-padded, in a row.
    alone = np.zeros((1, 8), np.int32)
    alone[0, 3:] = tokens[0, 4:9]
    single = np.asarray(fn(alone, alone > 0))[0, 3:7]
    np.testing.assert_allclose(before[0, 4:8], single, atol=1e-6)


# -- the update, packed and padded ---------------------------------------------------


def ragged_groups(seed: int = 0) -> list[Group]:
    """Two groups of four: completions of 1, 4, 9 and 12 tokens (one fills the budget); the
    9-token one is a two-turn episode whose tokens 3..5 are an observation (a hole)."""
    rng = np.random.default_rng(seed)
    groups = []
    for i, prompt_len in enumerate((3, 6)):
        prompt = Prompt(str(i), "", rng.integers(1, 32, prompt_len).astype(np.int32), "")
        completions = []
        for n in (1, 4, 9, 12):
            mask = None
            if n == 9:
                mask = np.array([1, 1, 1, 0, 0, 0, 1, 1, 1], np.int8)
            logprobs = -rng.random(n).astype(np.float32) * 3 - 0.5
            if mask is not None:
                logprobs = logprobs * mask
            completions.append(
                Completion(
                    rng.integers(1, 32, n).astype(np.int32), logprobs, "", "stop", 0, None, mask
                )
            )
        groups.append(Group(prompt, tuple(completions), rng.random(4).astype(np.float32)))
    return groups


def ragged_arrays(algorithm, seed: int = 0) -> dict[str, np.ndarray]:
    groups = ragged_groups(seed)
    advantages = algorithm.advantages(np.stack([g.rewards for g in groups]))
    arrays = batch_arrays(make_batch(groups, advantages, completion_len=BUDGET))
    rng = np.random.default_rng(seed + 1)
    if algorithm.needs_teacher:
        arrays["teacher_logprobs"] = -rng.random(arrays["loss_mask"].shape) * arrays["loss_mask"]
    # A token the trainer gives far more probability than the sampler did: the alignment
    # mask drops it (row 2's first completion token: a segment's first target).
    first = int(np.argmax(arrays["loss_mask"][2] > 0))
    arrays["old_logprobs"][2, first] = -30.0
    return {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in arrays.items()}


def updated(algorithm, arrays, mode: str, microbatch_tokens: int = 40, row_tokens=None):
    """(metrics, new params) of one SGD(lr=1) update on ``arrays``, laid out as ``mode``."""
    settings = TrainerSettings(
        packing=mode, microbatch_tokens=microbatch_tokens, row_tokens=row_tokens
    )
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    trainer = Trainer(model, algorithm, optax.sgd(1.0), settings=settings)
    laid = trainer.layout(dict(arrays))
    assert ("packed_tokens" in laid) == (mode == "packed")
    metrics = trainer.step(arrays)
    return metrics, (trainer.state.params, trainer.state.critic)


def assert_same_update(algorithm, arrays, atol=1e-5):
    padded_metrics, padded = updated(algorithm, arrays, "padded")
    packed_metrics, packed = updated(algorithm, arrays, "packed")
    assert packed_metrics["loss"] == pytest.approx(padded_metrics["loss"], abs=atol)
    for key in ("entropy", "mismatch_kl"):
        assert packed_metrics[key] == pytest.approx(padded_metrics[key], abs=atol)
    leaves = jax.tree.leaves(padded)
    assert leaves, "no parameters compared"
    for got, want in zip(jax.tree.leaves(packed), leaves, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=atol)
    return padded_metrics


@pytest.fixture(scope="module")
def pm():
    manager = plugins.build_plugin_manager()
    config.register_core_configurables()
    return manager


def shipped(pm, name: str):
    """The algorithm configs/experiments/<its file> builds, with the alignment mask on."""
    bindings = ["TEACHER = '/path/to/teacher'"] if name == "distill" else []
    config.parse([CONFIGS / "experiments" / EXPERIMENTS[name]], bindings, plugins=pm)
    ref = gin.query_parameter("rlax.train.algorithm")
    algorithm = ref.scoped_configurable_fn()
    return dataclasses.replace(algorithm, alignment=Alignment(mode="mask", bounds=(0.01, 100.0)))


def test_every_shipped_algorithm_configs_cover_the_list(pm):
    assert set(pm.names("algorithms")) == set(EXPERIMENTS)
    assert {p.stem for p in (CONFIGS / "algorithms").glob("*.gin")} == set(EXPERIMENTS)


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_a_packed_update_is_the_padded_update(pm, name):
    algorithm = shipped(pm, name)
    arrays = ragged_arrays(algorithm)
    metrics = assert_same_update(algorithm, arrays)
    # The alignment mask did drop the planted token (so the case is exercised).
    assert metrics["is_masked_fraction"] > 0


def test_sum_norm_divides_by_the_budget_whatever_the_alignment_mask_drops():
    # Two rows, a completion budget of 2 after a 2-token prompt: L = 3, targets 1..2.
    # The alignment mask drops every row's first completion token (ratio e^30 > 2).
    mask = jnp.array([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    batch = {
        "loss_mask": mask,
        "old_logprobs": jnp.array([[0.0, -30.0, 0.0], [0.0, -30.0, 0.0]]),
        "train_logprobs": jnp.zeros((2, 3)),
        "advantages": jnp.array([[0.0, 1.0, 1.0], [0.0, 2.0, 0.0]]),
    }
    pg = dataclasses.replace(
        drgrpo(max_len=1, alignment="mask", is_bounds=(0.5, 2.0)),
        aggregation=Aggregation("seq-mean-token-sum-norm"),  # L: the budget the layout holds
    )
    # At ratio 1 the surrogate is -A per kept token: row 0 keeps its second token (A = 1),
    # row 1 nothing; N = 1 row with a kept token; L = 2: loss = -1 / 2.
    loss, _ = pg.loss(jnp.zeros((2, 3)), batch)
    assert float(loss) == pytest.approx(-0.5)
    # Measured on the alignment-reduced mask the constant was 1 (the bug: -1).
    kept = jnp.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    assert float(Aggregation("seq-mean-token-sum-norm")(-kept, kept)) == pytest.approx(-1.0)
    assert float(Aggregation("seq-mean-token-sum-norm")(-kept, kept, mask)) == pytest.approx(-0.5)


def test_sum_norm_padded_and_packed_use_the_sampler_budget():
    algorithm = dataclasses.replace(
        grpo(alignment="mask", is_bounds=(0.01, 100.0)),
        aggregation=Aggregation("seq-mean-token-sum-norm"),
    )
    arrays = ragged_arrays(algorithm)
    # The budget by hand: the completion region is the last BUDGET target positions.
    assert arrays["loss_mask"].shape[1] - int(np.argmax(arrays["loss_mask"].any(0))) == BUDGET
    explicit = dataclasses.replace(
        algorithm, aggregation=Aggregation("seq-mean-token-sum-norm", BUDGET)
    )
    want, _ = updated(explicit, arrays, "padded")
    for mode in ("padded", "packed"):
        got, _ = updated(algorithm, arrays, mode)
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)


def test_the_teacher_scores_packed_rows_as_padded_ones():
    from rlax.core.trainer.teacher import Teacher

    arrays = ragged_arrays(grpo())
    model = Transformer(CFG, rngs=nnx.Rngs(3))
    padded = Teacher(model, settings=TrainerSettings(packing="padded")).logprobs(arrays)
    packed = Teacher(model, settings=TrainerSettings(packing="packed", microbatch_tokens=40))
    mask = arrays["loss_mask"] > 0
    np.testing.assert_allclose(packed.logprobs(arrays)[mask], padded[mask], atol=1e-5)


def test_several_updates_per_batch_with_a_critic_packed_as_padded():
    from rlax.core.trainer.epochs import several_updates
    from rlax.plugins.algorithms.ppo import ppo

    algorithm = ppo(kl_beta=0.1)  # a critic (the default head) and the reference's pass
    arrays = ragged_arrays(algorithm)
    group_ids = np.repeat(np.arange(2), 4)
    params = {}
    for mode in ("padded", "packed"):
        settings = TrainerSettings(packing=mode, microbatch_tokens=40, epochs=2, minibatches=2)
        trainer = Trainer(
            Transformer(CFG, rngs=nnx.Rngs(0)), algorithm, optax.sgd(0.5), settings=settings
        )
        several_updates(trainer, dict(arrays), group_ids, seed=0, step=1)
        params[mode] = (trainer.state.params, trainer.state.critic)
    for got, want in zip(
        jax.tree.leaves(params["packed"]), jax.tree.leaves(params["padded"]), strict=True
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_two_processes_pack_their_own_rows_into_one_global_layout():
    # A global batch of 8 rows fed by 2 processes (4 rows each, as process_rows splits it):
    # each packs its rows into the global packed rows it owns; every target found through
    # unpack_index in the assembled global rows is the padded row's own token pair.
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 9, 8)
    mask = rows_of(lengths.tolist(), width=10, left=1)
    tokens = np.where(mask, rng.integers(1, 32, mask.shape), 0).astype(np.int32)
    per = 2  # global packed rows per microbatch: k = 4 slots of 2 -> 8 global rows
    k, _ = packing.slots(8, per)
    assembled = np.zeros((k * per, 10), np.int32)
    seen = 0
    for process in range(2):
        rows = slice(4 * process, 4 * process + 4)
        owned = np.arange(4 * process, 4 * process + 4)  # its devices' rows of the 8
        local = {"tokens": tokens[rows], "attention_mask": mask[rows]}
        out = packing.pack(local, 10, per, owned=owned, global_rows=8)
        assert out["packed_tokens"].shape == (4, 10)
        assembled[owned] = out["packed_tokens"]
        index = out["unpack_index"]
        for r, t in zip(*np.nonzero(index >= 0), strict=True):
            g, col = divmod(int(index[r, t]), 9)
            assert assembled[g, col : col + 2].tolist() == local["tokens"][r, t : t + 2].tolist()
            seen += 1
    assert seen == int((lengths - 1).sum())


def test_lora_adapters_train_packed_as_padded():
    from rlax.core.models import lora

    # The reference (the base under LoRA) is packed too; the planted token is masked.
    algorithm = grpo(kl_beta=0.05, alignment="mask", is_bounds=(0.01, 100.0))
    arrays = ragged_arrays(algorithm)
    adapters = {}
    for mode in ("padded", "packed"):
        settings = TrainerSettings(packing=mode, microbatch_tokens=40)
        model = Transformer(CFG, rngs=nnx.Rngs(0))
        trainer = Trainer(
            model, algorithm, optax.sgd(1.0), settings=settings, lora=lora.LoraConfig(rank=2)
        )
        trainer.step(arrays)
        trainer.step(arrays)  # the second step moves the policy away from the reference
        adapters[mode] = lora.adapters_of(trainer.state.params)
    packed, padded = jax.tree.leaves(adapters["packed"]), jax.tree.leaves(adapters["padded"])
    assert packed and any(np.abs(np.asarray(x)).max() > 0 for x in padded)
    for got, want in zip(packed, padded, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_a_packed_batch_in_one_microbatch_is_one_pass_and_the_padded_update():
    # 8 sequences of at most 20 tokens in 8 rows of one microbatch (a budget of 8 x 20):
    # the step takes one value-and-grad through the gather, no second pass.
    algorithm = grpo(alignment="mask", is_bounds=(0.01, 100.0))
    arrays = ragged_arrays(algorithm)
    want, padded = updated(algorithm, arrays, "padded")
    got, packed = updated(algorithm, arrays, "packed", microbatch_tokens=8 * 20)
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
    for a, b in zip(jax.tree.leaves(packed), jax.tree.leaves(padded), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    settings = TrainerSettings(packing="packed", microbatch_tokens=8 * 20)
    trainer = Trainer(
        Transformer(CFG, rngs=nnx.Rngs(0)), algorithm, optax.sgd(1.0), settings=settings
    )
    laid = trainer.layout(dict(arrays))
    assert trainer.passes._slots(laid) == 1 and laid["packed_tokens"].shape == (8, 20)


def test_a_batch_filling_little_of_its_budget_runs_one_small_microbatch_exactly():
    # Rows of 40 tokens, a budget of 8 of them: the 8 sequences (at most 20 tokens) fill
    # 3 or 4 rows, so one microbatch of 4 rows runs instead of 8, and updates as padded.
    algorithm = grpo(alignment="mask", is_bounds=(0.01, 100.0))
    arrays = ragged_arrays(algorithm)
    want, padded = updated(algorithm, arrays, "padded")
    got, packed = updated(algorithm, arrays, "packed", microbatch_tokens=8 * 40, row_tokens=40)
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
    for a, b in zip(jax.tree.leaves(packed), jax.tree.leaves(padded), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    settings = TrainerSettings(packing="packed", microbatch_tokens=8 * 40, row_tokens=40)
    trainer = Trainer(
        Transformer(CFG, rngs=nnx.Rngs(0)), algorithm, optax.sgd(1.0), settings=settings
    )
    laid = trainer.layout(dict(arrays))
    assert laid["packed_tokens"].shape == (4, 40) and trainer.passes._slots(laid) == 1
