"""Sequence-level advantage estimators: rewards [M, G] -> advantages [M, G].

The experiment loop calls an algorithm's ``advantages(rewards)`` on the host
with one row per prompt and one column per completion (a *group*); the batch
then gives every token of a completion its value. These are those
estimators, pure numpy functions. Token-level estimators that need the
trainer (GAE with a critic, KL-shaped returns, batch whitening) live in
:mod:`rlax.plugins.algorithms.returns`.

Every estimator treats a group of one sample as carrying no relative
signal: its advantage is 0 where a baseline is subtracted.
"""

from __future__ import annotations

import numpy as np


def _as_groups(rewards: np.ndarray) -> np.ndarray:
    rewards = np.asarray(rewards, np.float64)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [groups, samples], got shape {rewards.shape}")
    return rewards


def group_normalized(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GRPO: :math:`A_i = (R_i - \\mathrm{mean}(R)) / (\\mathrm{std}(R) + \\epsilon)` per group.

    std with ddof = 1 (as TRL and verl); a group of one has std 0 by convention,
    so its advantage is 0. Reference: Shao et al., 2024, DeepSeekMath,
    https://arxiv.org/abs/2402.03300 (section 4.1.2).
    """
    rewards = _as_groups(rewards)
    mean = rewards.mean(axis=-1, keepdims=True)
    g = rewards.shape[-1]
    std = rewards.std(axis=-1, ddof=1, keepdims=True) if g > 1 else np.zeros_like(mean)
    return ((rewards - mean) / (std + eps)).astype(np.float32)


def group_centered(rewards: np.ndarray) -> np.ndarray:
    """Dr.GRPO / REINFORCE++-baseline: :math:`A_i = R_i - \\mathrm{mean}(R)` per group.

    No division by the std, which Dr.GRPO shows biases towards questions of
    very low or very high difficulty. Reference: Liu et al., 2025, Dr.GRPO,
    https://arxiv.org/abs/2503.20783 (eq. 3).
    """
    rewards = _as_groups(rewards)
    return (rewards - rewards.mean(axis=-1, keepdims=True)).astype(np.float32)


def leave_one_out(rewards: np.ndarray) -> np.ndarray:
    """RLOO: :math:`A_i = R_i - \\frac{1}{G-1}\\sum_{j \\ne i} R_j = \\frac{G}{G-1}(R_i - \\bar R)`.

    Each sample's baseline is the mean of the *other* samples, so it is
    independent of the sample itself (an unbiased REINFORCE baseline). A group
    of one has no other sample: advantage 0. Reference: Ahmadian et al., 2024,
    "Back to Basics", https://arxiv.org/abs/2402.14740 (eq. 6).
    """
    rewards = _as_groups(rewards)
    g = rewards.shape[-1]
    if g < 2:
        return np.zeros_like(rewards, dtype=np.float32)
    return ((rewards - rewards.mean(axis=-1, keepdims=True)) * g / (g - 1)).astype(np.float32)


def raw_returns(rewards: np.ndarray) -> np.ndarray:
    """The rewards themselves (PPO, REINFORCE++): the baseline comes later, in the trainer.

    PPO's critic and REINFORCE++'s batch normalisation work on tokens inside
    the train step; the sequence reward travels there as the terminal reward.
    """
    return _as_groups(rewards).astype(np.float32)
