"""Batches for the layout tests (packing edges, the context axis, prefix sharing).

Not a test module: ``test_packing_edges.py``, ``test_prefix_sharing.py`` and the 8-device
context checks import it. A ragged batch: groups of completions of 1 to 12 tokens after
prompts of 3 and 6 tokens, one a two-turn episode whose observation is a hole in its
mask, and one token the alignment mask drops.
"""

from __future__ import annotations

import numpy as np

from rlax.core.models.config import TransformerConfig
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.step import batch_arrays
from rlax.core.types import Completion, Group, Prompt

CFG = TransformerConfig(
    vocab_size=32, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)
BUDGET = 12  # the sampler's max_new_tokens: completions padded to it
EPISODE_MASK = np.array([1, 1, 1, 0, 0, 0, 1, 1, 1], np.int8)  # turn, observation, turn


def ragged_groups(
    seed: int = 0, prompts: tuple[int, ...] = (3, 6), lengths: tuple[int, ...] = (1, 4, 9, 12)
) -> list[Group]:
    """One group per prompt length, one completion per length; a 9-token completion is a
    two-turn episode (tokens 3..5 an observation)."""
    rng = np.random.default_rng(seed)
    groups = []
    for i, prompt_len in enumerate(prompts):
        prompt = Prompt(str(i), "", rng.integers(1, 32, prompt_len).astype(np.int32), "")
        completions = []
        for n in lengths:
            mask = EPISODE_MASK if n == 9 else None
            logprobs = -rng.random(n).astype(np.float32) * 3 - 0.5
            if mask is not None:
                logprobs = logprobs * mask
            tokens = rng.integers(1, 32, n).astype(np.int32)
            completions.append(Completion(tokens, logprobs, "", "stop", 0, None, mask))
        rewards = rng.random(len(lengths)).astype(np.float32)
        groups.append(Group(prompt, tuple(completions), rewards))
    return groups


def arrays_of(algorithm, groups: list[Group], budget: int = BUDGET, seed: int = 1):
    """The padded arrays of ``groups`` with ``algorithm``'s advantages (and teacher logprobs
    when it needs them); row 2's first target is made one the alignment mask drops."""
    advantages = algorithm.advantages(np.stack([g.rewards for g in groups]))
    arrays = batch_arrays(make_batch(groups, advantages, completion_len=budget))
    rng = np.random.default_rng(seed)
    if getattr(algorithm, "needs_teacher", False):
        arrays["teacher_logprobs"] = -rng.random(arrays["loss_mask"].shape) * arrays["loss_mask"]
    first = int(np.argmax(arrays["loss_mask"][2] > 0))
    arrays["old_logprobs"][2, first] = -30.0
    return {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in arrays.items()}


def ragged_arrays(algorithm, seed: int = 0) -> dict[str, np.ndarray]:
    return arrays_of(algorithm, ragged_groups(seed), seed=seed + 1)
