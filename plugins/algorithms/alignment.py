"""Train/inference alignment: the *importance weight* of the unified objective.

A rollout's tokens were sampled by the inference engine (``old_logprobs``:
the sampler's own log-probabilities, which travel with the rollout), possibly
with older weights, and always with different numerics from the training
graph. The trainer recomputes every token's log-probability with the
training graph at the start of the step (``train_logprobs``, no gradient).
The two differ by the train/inference mismatch (plus staleness); this piece
decides what the policy ratio is measured against and how the difference is
corrected:

- ``none``: the sampler's logprobs are the ratio's denominator,
  :math:`r = \\pi_\\theta / \\pi_{sampler}`, so the mismatch is absorbed by the
  ratio (and its clipping), as in plain PPO/GRPO. No weight.
- ``tis``: decoupled — :math:`r = \\pi_\\theta / \\pi_{train}` and each token's loss
  is weighted by the truncated importance weight
  :math:`w = \\min(\\pi_{train} / \\pi_{sampler}, C)`.
- ``mask``: decoupled ratio as in ``tis``, and tokens whose weight lies outside
  :math:`[C_{min}, C_{max}]` are dropped from the loss (masked importance
  sampling); the others get weight 1.

The weight carries no gradient (both logprobs are inputs). The mismatch itself
(mean |Δlogp|, KL) is measured by the trainer for every algorithm.

References:
  Yao et al., 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
  Training", https://fengyao.notion.site/off-policy-rl (truncated IS, C = 2)
  Hilton et al., 2021, "Batch size-invariance for policy optimization",
  https://arxiv.org/abs/2110.00641 (the decoupled proximal/behaviour ratio)
  Zhou et al., 2025, RLAX, https://arxiv.org/abs/2512.06392 (alignment of trainer and sampler)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rlax.plugins.algorithms.aggregation import masked_mean

ALIGNMENTS = ("none", "tis", "mask")


@dataclasses.dataclass(frozen=True)
class Alignment:
    """How the sampler/trainer mismatch enters the loss (see the module docstring).

    Args:
      mode: ``none``, ``tis`` or ``mask``.
      cap: C of truncated importance sampling.
      bounds: (C_min, C_max) of masked importance sampling.
    """

    mode: str = "none"
    cap: float = 2.0
    bounds: tuple[float, float] = (0.5, 2.0)

    def __post_init__(self) -> None:
        if self.mode not in ALIGNMENTS:
            raise ValueError(f"unknown alignment {self.mode!r}; valid: {', '.join(ALIGNMENTS)}")
        low, high = self.bounds
        if self.cap <= 0 or not 0 <= low < 1 < high:
            raise ValueError(
                f"alignment: need cap > 0 and 0 <= C_min < 1 < C_max, "
                f"got cap={self.cap}, bounds={self.bounds}"
            )

    def __call__(
        self, batch: dict[str, jax.Array]
    ) -> tuple[jax.Array, jax.Array, jax.Array, dict[str, jax.Array]]:
        """Returns (ratio denominator logprobs, per-token weight, loss mask, metrics)."""
        mask = batch["loss_mask"]
        if self.mode == "none":
            return batch["old_logprobs"], jnp.ones_like(mask), mask, {}
        train = batch["train_logprobs"]
        is_ratio = jnp.exp(train - batch["old_logprobs"])
        if self.mode == "tis":
            weight = jnp.minimum(is_ratio, self.cap)
            truncated = (is_ratio > self.cap).astype(jnp.float32)
            return train, weight, mask, {"is_truncated_fraction": masked_mean(truncated, mask)}
        low, high = self.bounds
        keep = ((is_ratio >= low) & (is_ratio <= high)).astype(mask.dtype)
        metrics = {"is_masked_fraction": masked_mean(1.0 - keep, mask)}
        return train, jnp.ones_like(mask), mask * keep, metrics
