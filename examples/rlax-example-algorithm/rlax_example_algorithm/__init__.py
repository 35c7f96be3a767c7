"""An example third-party rlax algorithm (see README.md)."""

from __future__ import annotations

from rlax_example_algorithm.lite_ppo import group_mean_batch_std, lite_ppo

__all__ = ["group_mean_batch_std", "lite_ppo"]
