"""Prompts -> scored groups: what a worker does between two weight loads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from rlax.core.types import Completion, Group, Prompt, RewardResult


class Sampler(Protocol):
    version: int

    def generate(
        self, prompts: Sequence[Prompt], n: int, *, seed: int
    ) -> list[tuple[Completion, ...]]: ...


class Reward(Protocol):
    def score(self, prompt: Prompt, completion_text: str) -> float | RewardResult: ...


def score(reward: Reward, prompt: Prompt, text: str) -> float:
    result = reward.score(prompt, text)
    value = result.score if isinstance(result, RewardResult) else result
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(
            f"reward {type(reward).__name__} returned {value} for prompt {prompt.id!r}"
        )
    return value


def rollout(
    prompts: Sequence[Prompt], sampler: Sampler, reward: Reward, group_size: int, seed: int
) -> list[Group]:
    """Samples ``group_size`` completions per prompt and scores each one."""
    completions = sampler.generate(prompts, group_size, seed=seed)
    return [
        Group(p, cs, np.array([score(reward, p, c.text) for c in cs], np.float32))
        for p, cs in zip(prompts, completions)
    ]


def generated_tokens(groups: Sequence[Group]) -> int:
    return sum(len(c.tokens) for g in groups for c in g.completions)
