"""The ``composite`` reward: a weighted sum of other rewards.

.. math::  R(y) = \\sum_i w_i R_i(y)

In gin::

    REWARD = @rewards.composite()        # rlax.run.reward (configs/base/roles.gin)
    rewards.composite.rewards = [@rewards.math(), @rewards.format(), @rewards.length()]
    rewards.composite.weights = [1.0, 0.1, 0.05]

The reason lists every part, so a log shows why a completion scored what it did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlax.core import hookimpl
from rlax.core.rollout.reward_pool import score_one
from rlax.core.types import Prompt, RewardResult

__all__ = ["CompositeReward"]


class CompositeReward:
    """Weighted sum of ``rewards`` (each weight 1.0 unless ``weights`` is given).

    Args:
      rewards: the reward objects.
      weights: one weight per reward.
      names: one short name per reward for the reason (default: class names).
    """

    def __init__(
        self,
        *,
        rewards: Sequence[Any],
        weights: Sequence[float] | None = None,
        names: Sequence[str] | None = None,
    ) -> None:
        if not rewards:
            raise ValueError("rewards.composite: give at least one reward")
        weights = [1.0] * len(rewards) if weights is None else list(weights)
        names = [type(r).__name__ for r in rewards] if names is None else list(names)
        if len(weights) != len(rewards) or len(names) != len(rewards):
            raise ValueError(
                f"rewards.composite: {len(rewards)} rewards, {len(weights)} weights, "
                f"{len(names)} names"
            )
        self.rewards, self.weights, self.names = list(rewards), weights, names

    def score(self, prompt: Prompt, completion_text: str) -> RewardResult:
        total, parts = 0.0, []
        for reward, weight, name in zip(self.rewards, self.weights, self.names):
            value, reason = score_one(reward, prompt, completion_text)
            total += weight * value
            parts.append(
                f"{weight:g}*{name}={value:g} ({reason})"
                if reason
                else f"{weight:g}*{name}={value:g}"
            )
        return RewardResult(total, " + ".join(parts))


@hookimpl
def rlax_register_rewards():
    return {"composite": CompositeReward}
