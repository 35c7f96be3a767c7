"""``seq-mean-token-sum-norm`` divides by the generation budget, never by the mask's width.

In the trainer's layout the mask is [B, P + C - 1] (prompt bucket P, budget C);
Dr.GRPO's L_max is C. The same rollouts packed with two prompt buckets must
give the same loss, and that loss is written out by hand.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.step import batch_arrays
from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.algorithms.aggregation import aggregate, completion_width
from rlax.plugins.algorithms.dapo import dapo
from rlax.plugins.algorithms.drgrpo import drgrpo
from rlax.plugins.algorithms.grpo import grpo
from rlax.plugins.algorithms.ppo import ppo
from rlax.plugins.algorithms.rloo import rloo

BUDGET = 6


def one_group(prompt_len: int) -> Group:
    # Completions of 2 and 3 tokens, sampler logprobs = new logprobs (ratio 1).
    comps = (
        Completion(np.array([3, 4], np.int32), np.array([-0.5, -0.5], np.float32), "", "stop", 0),
        Completion(np.array([5, 6, 7], np.int32), np.full(3, -0.5, np.float32), "", "stop", 0),
    )
    prompt = Prompt("p", "", np.arange(1, prompt_len + 1, dtype=np.int32), "")
    return Group(prompt, comps, np.array([1.0, 0.0], np.float32))


def loss_of(algo, prompt_len: int, bucket: int = 8) -> float:
    group = one_group(prompt_len)
    adv = algo.advantages(group.rewards[None])
    b = make_batch([group], adv, length_bucket=bucket, completion_len=BUDGET)
    arrays = {k: jnp.asarray(v) for k, v in batch_arrays(b).items()}
    arrays["train_logprobs"] = arrays["old_logprobs"]
    if algo.needs_critic:
        arrays["values"] = arrays["old_values"] = jnp.zeros_like(arrays["loss_mask"])
    loss, _ = algo.loss(arrays["old_logprobs"], arrays)
    return float(loss)


def test_completion_width_is_the_budget_in_the_trainers_layout():
    for prompt_len, bucket in ((3, 8), (9, 8), (3, 4)):
        b = make_batch(
            [one_group(prompt_len)], np.zeros((1, 2)), length_bucket=bucket, completion_len=BUDGET
        )
        assert b.loss_mask.shape[1] > BUDGET  # the mask also spans the prompt bucket
        assert float(completion_width(jnp.asarray(b.loss_mask))) == BUDGET


def test_normaliser_by_hand():
    # Rows of 2 and 3 tokens with values 1 and 2, the budget 6 inside a width-9 mask.
    mask = np.zeros((2, 9), np.float32)
    mask[0, 3:5] = 1.0
    mask[1, 3:6] = 1.0
    x = np.where(mask > 0, np.array([[1.0], [2.0]]), 0.0)
    got = float(aggregate(jnp.asarray(x), jnp.asarray(mask), "seq-mean-token-sum-norm"))
    assert got == pytest.approx((2 * 1.0 / 6 + 3 * 2.0 / 6) / 2)  # not / 9


@pytest.mark.parametrize("make", [grpo, dapo, rloo, ppo])
def test_loss_does_not_depend_on_the_prompt_bucket(make):
    algo = make(aggregation="seq-mean-token-sum-norm")
    short, long = loss_of(algo, prompt_len=3), loss_of(algo, prompt_len=11)  # P = 8 vs 16
    assert short == pytest.approx(long, abs=1e-7)


def test_grpo_matches_drgrpos_constant_normaliser_by_hand():
    # GRPO advantages of rewards [1, 0]: mean 1/2, std (ddof 1) = 1/sqrt(2), so
    # A = +-(1/2) * sqrt(2) = +-0.7071; ratio 1, so the token loss is -A.
    a = 0.5 * np.sqrt(2.0) / (1.0 + 1e-6 * np.sqrt(2.0))
    want = (-(2 * a) / BUDGET + (3 * a) / BUDGET) / 2
    assert loss_of(grpo(aggregation="seq-mean-token-sum-norm"), 3) == pytest.approx(want, rel=1e-5)
    # Dr.GRPO's A = R - mean = +-1/2 with its explicit L_max = the budget.
    want = (-(2 * 0.5) / BUDGET + (3 * 0.5) / BUDGET) / 2
    assert loss_of(drgrpo(max_len=BUDGET), 11) == pytest.approx(want, rel=1e-6)
    assert loss_of(grpo(aggregation="seq-mean-token-sum-norm", max_len=12), 3) == pytest.approx(
        (-(2 * a) / 12 + (3 * a) / 12) / 2, rel=1e-5
    )
