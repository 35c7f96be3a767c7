"""Several updates per rollout batch: epochs over shuffled minibatches of whole groups."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from rlax.core.errors import ConfigError
from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.epochs import (
    check_processes,
    fixed_anchors,
    mean_metrics,
    minibatch_rows,
    several_updates,
    update_on_batch,
)
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.trainer.step import Trainer, batch_arrays
from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.algorithms.grpo import grpo
from rlax.plugins.algorithms.ppo import ppo
from rlax.plugins.algorithms.reinforcepp import reinforcepp

CFG = TransformerConfig(
    vocab_size=9, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)


def groups(m: int = 4):
    rng = np.random.default_rng(0)
    out = []
    for i in range(m):
        prompt = Prompt(str(i), "", rng.integers(3, 9, size=3).astype(np.int32), "")
        comps = tuple(
            Completion(
                rng.integers(3, 9, size=n).astype(np.int32),
                -rng.random(n).astype(np.float32),
                "",
                "stop",
                0,
            )
            for n in (2, 3)
        )
        out.append(Group(prompt, comps, np.array([1.0, 0.0], np.float32)))
    return out


def batch_for(algo, m: int = 4):
    gs = groups(m)
    return make_batch(gs, algo.advantages(np.stack([g.rewards for g in gs])), row_multiple=8)


def arrays_of(batch):
    return batch_arrays(batch), batch.group_ids


def trainer_for(algo, lr=1.0, **settings):
    return Trainer(
        Transformer(CFG, rngs=nnx.Rngs(0)),
        algo,
        optax.sgd(lr),
        settings=TrainerSettings(**settings),
    )


def leaves(trainer):
    return [np.asarray(x) for x in jax.tree.leaves(trainer.state.params)]


def test_minibatches_hold_whole_groups_once_per_epoch_and_pad_to_one_shape():
    group_ids = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, -1, -1])
    parts = minibatch_rows(group_ids, 2, np.random.default_rng(0), row_multiple=4)
    assert [len(p) for p in parts] == [8, 8]  # 3 and 2 groups, padded to a multiple of 4
    real = np.concatenate([p[p < len(group_ids)] for p in parts])
    assert sorted(real) == list(range(10))  # every row of every group once, no filler row
    for p in parts:
        ids = group_ids[p[p < len(group_ids)]]
        for g in np.unique(ids):  # a group's two rows are in the same minibatch
            assert np.sum(ids == g) == 2
    again = minibatch_rows(group_ids, 2, np.random.default_rng(0), row_multiple=4)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    orders = {
        tuple(np.concatenate(minibatch_rows(group_ids, 5, np.random.default_rng(s))))
        for s in range(6)
    }
    assert len(orders) > 1  # the seed shuffles the groups
    # More minibatches than groups: the empty ones are left out.
    assert len(minibatch_rows(np.array([0, 0, 1, 1]), 4, np.random.default_rng(0))) == 2


def test_one_epoch_of_one_minibatch_is_todays_update_bit_for_bit():
    algo = grpo()
    a, b = trainer_for(algo), trainer_for(algo)
    batch = batch_for(algo)
    got = update_on_batch(a, batch, batch, seed=3, step=1)
    want = b.step(batch)
    assert got == want
    for x, y in zip(leaves(a), leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert a.state.step == b.state.step == 1


def test_two_by_two_updates_bind_the_clip_and_count_one_step():
    algo = grpo(alignment="tis")  # the ratio's denominator: the anchors, fixed for the batch
    trainer = trainer_for(algo, lr=3.0, epochs=2, minibatches=2)
    per_update = several_updates(trainer, *arrays_of(batch_for(algo)), seed=0, step=1)
    assert len(per_update) == 4 and trainer.state.step == 1
    first, later = per_update[0], per_update[1:]
    # The first update starts where the anchors were taken: ratio 1, nothing clipped.
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert first["clip_fraction"] == 0.0
    # Every later one sees a policy the earlier updates moved: the ratio leaves 1 and clips.
    assert all(abs(m["ratio_mean"] - 1.0) > 1e-3 for m in later)
    assert max(m["clip_fraction"] for m in later) > 0.0
    means = mean_metrics(per_update)
    assert means["updates"] == 4.0
    assert means["clip_fraction"] == pytest.approx(
        np.mean([m["clip_fraction"] for m in per_update])
    )


def test_ppo_value_clip_binds_against_the_batchs_old_values():
    algo = ppo(value_clip=0.01)
    one = trainer_for(algo, lr=1.0)
    assert one.step(batch_for(algo))["value_clip_fraction"] == 0.0  # old values = values
    several = trainer_for(algo, lr=1.0, epochs=2, minibatches=2)
    per_update = several_updates(several, *arrays_of(batch_for(algo)), seed=0, step=1)
    assert per_update[0]["value_clip_fraction"] == 0.0
    assert max(m["value_clip_fraction"] for m in per_update[1:]) > 0.0


def test_reinforcepp_whitens_over_the_whole_batch_not_each_minibatch():
    # Group i rewards its two completions (2 and 3 tokens) i and 0: over the batch's
    # 20 tokens the return-to-go has mean 12/20 = 0.6 and variance 28/20 - 0.36 = 1.04.
    algo = reinforcepp()
    gs = [
        dataclasses.replace(g, rewards=np.array([float(i), 0.0], np.float32))
        for i, g in enumerate(groups())
    ]
    batch = make_batch(gs, algo.advantages(np.stack([g.rewards for g in gs])), row_multiple=8)
    trainer = trainer_for(algo, epochs=1, minibatches=2)
    anchored = fixed_anchors(trainer, batch_arrays(batch))
    mask, raw = anchored["loss_mask"], anchored["advantages"]
    assert mask.sum() == 20 and raw[mask > 0].mean() == pytest.approx(0.6)
    want = (raw - 0.6) / np.sqrt(1.04 + 1e-8) * mask
    np.testing.assert_allclose(anchored["batch_advantages"], want, atol=1e-6)
    # A minibatch of groups 0 and 1 alone would whiten to mean 0 (a zero loss at ratio 1);
    # with the batch's terms its loss is minus their token mean there.
    rows = np.flatnonzero(np.isin(batch.group_ids, [0, 1]))
    part = {k: jax.numpy.asarray(v[rows]) for k, v in anchored.items()}
    own = {k: v for k, v in part.items() if not k.startswith("batch_")}
    at_one = part["old_logprobs"]  # the ratio's denominator without alignment: ratio 1
    assert float(algo.loss(at_one, own)[0]) == pytest.approx(0.0, abs=1e-6)
    expected = -want[rows].sum() / mask[rows].sum()
    # With the batch's terms the minibatch's loss scans nothing (no GAE of its own).
    scans = lambda batch: str(jax.make_jaxpr(lambda b: algo.loss(at_one, b))(batch)).count("scan")
    assert scans(part) == 0 and scans(own) > 0
    # 10 tokens there: two of 1 (group 1's first row), eight of 0.
    assert expected == pytest.approx((0.6 * 8 - 0.4 * 2) / np.sqrt(1.04) / 10, abs=1e-6)
    assert float(algo.loss(at_one, part)[0]) == pytest.approx(expected, abs=1e-6)
    # The update itself gets them: its first minibatch's loss, at the anchors' policy.
    first = minibatch_rows(batch.group_ids, 2, np.random.default_rng([0, 1, 0]), 8)[0]
    padded = {
        k: np.concatenate([v, np.zeros((1, *v.shape[1:]), v.dtype)]) for k, v in anchored.items()
    }
    mb = {k: jax.numpy.asarray(v[first]) for k, v in padded.items()}
    loss = several_updates(trainer, *arrays_of(batch), seed=0, step=1)[0]["loss"]
    assert loss == pytest.approx(float(algo.loss(mb["train_logprobs"], mb)[0]), abs=1e-5)
    without = {k: v for k, v in mb.items() if not k.startswith("batch_")}
    assert loss != pytest.approx(float(algo.loss(mb["train_logprobs"], without)[0]), abs=1e-3)


def test_the_shuffle_depends_on_seed_and_step_only():
    algo = grpo(alignment="tis")
    runs = []
    for _ in range(2):
        trainer = trainer_for(algo, lr=0.5, epochs=2, minibatches=2)
        for step in (1, 2):
            several_updates(trainer, *arrays_of(batch_for(algo)), seed=7, step=step)
        runs.append(leaves(trainer))
    for x, y in zip(*runs, strict=True):
        np.testing.assert_array_equal(x, y)
    other = trainer_for(algo, lr=0.5, epochs=2, minibatches=2)
    for step in (1, 2):
        several_updates(other, *arrays_of(batch_for(algo)), seed=8, step=step)
    assert any(not np.array_equal(x, y) for x, y in zip(runs[0], leaves(other), strict=True))


def test_several_updates_on_several_processes_are_a_config_error():
    with pytest.raises(ConfigError, match="several updates per batch run on one trainer process"):
        check_processes(TrainerSettings(epochs=2), 2)
    check_processes(TrainerSettings(epochs=2), 1)
    check_processes(TrainerSettings(), 4)  # one update per batch: any number of processes
    check_processes(None, 4)


def test_settings_reject_zero_epochs_and_minibatches():
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        TrainerSettings(epochs=0)
    with pytest.raises(ValueError, match="minibatches must be >= 1"):
        TrainerSettings(minibatches=0)
