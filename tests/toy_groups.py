"""The toy batch trainer-level tests share: two groups of three completions.

Prompts of 3 and 4 tokens, completions of 2, 3 and 1 tokens (ids 3..8, for a
vocabulary of 9), sampling log-probs in (-1, 0], rewards (1, 0, 0) in each
group; the same ``seed`` gives the same batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlax.core.trainer.batches import make_batch
from rlax.core.types import Completion, Group, Prompt, TrainBatch

__all__ = ["toy_batch", "toy_groups"]


def toy_groups(seed: int = 0) -> list[Group]:
    rng = np.random.default_rng(seed)
    groups = []
    for i in range(2):
        prompt = Prompt(str(i), "", rng.integers(3, 9, size=3 + i).astype(np.int32), "")
        completions = tuple(
            Completion(
                rng.integers(3, 9, size=n).astype(np.int32),
                -rng.random(n).astype(np.float32),
                "",
                "stop",
                0,
            )
            for n in (2, 3, 1)
        )
        groups.append(Group(prompt, completions, np.array([1.0, 0.0, 0.0], np.float32)))
    return groups


def toy_batch(algorithm: Any = None, seed: int = 0) -> TrainBatch:
    """:func:`toy_groups` as a batch, with ``algorithm``'s advantages (GRPO's by default)."""
    from rlax.plugins.algorithms.grpo import grpo

    groups = toy_groups(seed)
    advantages = (algorithm or grpo()).advantages(np.stack([g.rewards for g in groups]))
    return make_batch(groups, advantages)
