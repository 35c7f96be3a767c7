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

- ``icepop``: decoupled ratio, and the token's weight is its importance
  ratio :math:`\rho_t = \\pi_{train} / \\pi_{sampler}` where
  :math:`\rho_t \\in [C_{min}, C_{max}]`; tokens outside are dropped (IcePop's
  double-sided masking, ratio-bound token masking).
- ``seq-tis``: decoupled ratio, every token of sequence i weighted by its
  truncated *sequence* ratio :math:`\\min(\\prod_t \rho_{i,t}, C)`.
- ``seq-mis``: decoupled ratio, every token of sequence i weighted by
  :math:`\\prod_t \rho_{i,t}` when that lies in :math:`[C_{min}, C_{max}]`;
  other sequences are dropped whole (sequence-level masked IS).

The weight carries no gradient (both logprobs are inputs). The mismatch itself
(mean |Δlogp|, KL) is measured by the trainer for every algorithm.

References:
  Yao et al., 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
  Training", https://fengyao.notion.site/off-policy-rl (truncated IS, C = 2)
  Hilton et al., 2021, "Batch size-invariance for policy optimization",
  https://arxiv.org/abs/2110.00641 (the decoupled proximal/behaviour ratio)
  Zhou et al., 2025, RLAX, https://arxiv.org/abs/2512.06392 (alignment of trainer and sampler)
  Liu, Li et al., 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
  Training-Inference Mismatch",
  https://yingru.notion.site/When-Speed-Kills-Stability-271211a558b7808d8b12d403fd15edda
  (sequence-level TIS and MIS)
  Ling Team, 2025, "Every Step Evolves: Scaling Reinforcement Learning for Trillion-Scale
  Thinking Model", https://arxiv.org/abs/2510.18855 (IcePop: ratio-bound token masking)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated

from rlax.core.constraints import OneOf, Positive, Range
from rlax.plugins.algorithms.aggregation import masked_mean

if TYPE_CHECKING:  # annotations only: the algorithm's settings are read where JAX is not
    import jax

ALIGNMENTS = ("none", "tis", "mask", "icepop", "seq-tis", "seq-mis")

# The alignment's settings as an algorithm declares them (rlax.core.constraints).
AlignmentMode = Annotated[str, OneOf(*ALIGNMENTS)]
IsCap = Annotated[float, Positive]
IsBounds = tuple[Annotated[float, Range(ge=0, lt=1)], Annotated[float, Range(gt=1)]]


@dataclasses.dataclass(frozen=True)
class Alignment:
    """How the sampler/trainer mismatch enters the loss (see the module docstring).

    Args:
      mode: one of :data:`ALIGNMENTS`.
      cap: C of (sequence-level) truncated importance sampling.
      bounds: (C_min, C_max) of masked importance sampling (``mask``,
        ``icepop``, ``seq-mis``).
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
        import jax.numpy as jnp

        mask = batch["loss_mask"]
        if self.mode == "none":
            return batch["old_logprobs"], jnp.ones_like(mask), mask, {}
        train = batch["train_logprobs"]
        log_ratio = train - batch["old_logprobs"]
        if self.mode.startswith("seq-"):
            weight, mask, metrics = self._sequence(log_ratio, mask)
            return train, weight, mask, metrics
        is_ratio = jnp.exp(log_ratio)
        if self.mode == "tis":
            weight = jnp.minimum(is_ratio, self.cap)
            truncated = (is_ratio > self.cap).astype(jnp.float32)
            return train, weight, mask, {"is_truncated_fraction": masked_mean(truncated, mask)}
        low, high = self.bounds
        keep = ((is_ratio >= low) & (is_ratio <= high)).astype(mask.dtype)
        metrics = {"is_masked_fraction": masked_mean(1.0 - keep, mask)}
        weight = jnp.ones_like(mask) if self.mode == "mask" else is_ratio * keep  # icepop
        return train, weight, mask * keep, metrics

    def _sequence(
        self,
        log_ratio: jax.Array,  # [B, L]
        mask: jax.Array,  # [B, L]
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """(weight, mask, metrics) of the sequence-level modes: one ratio per row."""
        import jax.numpy as jnp

        seq_log = jnp.sum(log_ratio * mask, axis=-1, keepdims=True)  # [B, 1]: log prod_t rho
        rows = (jnp.sum(mask, axis=-1, keepdims=True) > 0).astype(jnp.float32)
        if self.mode == "seq-tis":
            log_cap = jnp.log(self.cap)
            weight = jnp.exp(jnp.minimum(seq_log, log_cap)) * jnp.ones_like(mask)
            truncated = (seq_log > log_cap).astype(jnp.float32)
            return weight, mask, {"is_truncated_fraction": masked_mean(truncated, rows)}
        low, high = self.bounds
        keep = ((seq_log >= jnp.log(low)) & (seq_log <= jnp.log(high))).astype(mask.dtype)
        weight = jnp.exp(jnp.minimum(seq_log, jnp.log(high))) * keep * jnp.ones_like(mask)
        return weight, mask * keep, {"is_masked_fraction": masked_mean(1.0 - keep, rows)}
