"""Lite PPO, composed from rlax's pieces plus one new advantage estimator.

.. math::

   A_i = \\frac{R_i - \\mathrm{mean}_{group}(R)}{\\mathrm{std}_{batch}(R) + \\epsilon},
   \\qquad L = \\mathrm{token\\text{-}mean}\\big[-\\min(r A, \\mathrm{clip}(r, 1 \\pm \\varepsilon) A)\\big]

Reference: Liu et al., 2025, "Part I: Tricks or Traps? A Deep Dive into RL for
LLM Reasoning", https://arxiv.org/abs/2508.08221 (group mean, batch std, token-level loss).
"""

from __future__ import annotations

import numpy as np

from rlax.core import hookimpl
from rlax.plugins import algorithms as algos


def group_mean_batch_std(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """The new piece: rewards [N, G] centred per group, scaled by the whole batch's std."""
    rewards = np.asarray(rewards, np.float64)
    centred = rewards - rewards.mean(axis=-1, keepdims=True)
    return (centred / (rewards.std() + eps)).astype(np.float32)


def lite_ppo(
    *, clip_eps: algos.ClipEps = 0.2, alignment: algos.AlignmentMode = "none"
) -> algos.PolicyGradient:
    """Lite PPO; ``alignment`` as for the built-ins (the types carry the valid values)."""
    return algos.PolicyGradient(
        name="lite_ppo",
        estimator=group_mean_batch_std,
        objective=algos.ClippedSurrogate(clip_eps, clip_eps),
        aggregation=algos.Aggregation("token-mean"),
        alignment=algos.alignment_of(alignment, cap=2.0, bounds=(0.5, 2.0)),
    )


@hookimpl
def rlax_register_algorithms():
    return {"lite_ppo": lite_ppo}
