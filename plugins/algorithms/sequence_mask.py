"""Off-policy sequence masking: negative-advantage sequences that drifted too far are dropped.

A rollout was sampled by :math:`\\pi_{old}` (the sampler, possibly several
versions behind, always with other numerics); the update is of
:math:`\\pi_\\theta`. A sequence whose tokens the current policy finds much less
likely than the sampler did, and whose advantage is negative, pushes the policy
away from text it would no longer write -- mostly noise, and a known source of
instability. DeepSeek-V3.2 masks such sequences whole:

.. math::

   M_{i,t} = \\begin{cases} 0 & \\hat A_{i,t} < 0 \\ \\text{and}\\
             \\frac{1}{|o_i|} \\sum_t \\log \\frac{\\pi_{old}(o_{i,t})}{\\pi_\\theta(o_{i,t})} > \\delta \\\\
             1 & \\text{otherwise} \\end{cases}

The sequence's drift is the mean over its loss-mask tokens of the sampler's
logprob less the current policy's (no gradient: the mask is a constant of the
step); positive-advantage tokens are never masked (they teach what the policy
already moved toward). The masked tokens leave the loss and the aggregation's
count, as an alignment mask's do. Logged: ``offpolicy_masked_fraction`` (of
sequences with a masked token) and ``offpolicy_drift_mean`` (the mean drift).

References:
  DeepSeek-AI, 2025, "DeepSeek-V3.2: Pushing the Frontier of Open Large Language
  Models", https://arxiv.org/abs/2512.02556 (off-policy sequence masking)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated

from rlax.core.constraints import Range
from rlax.plugins.algorithms.aggregation import masked_mean

if TYPE_CHECKING:  # annotations only: the algorithm's settings are read where JAX is not
    import jax

#: δ as an algorithm declares it (rlax.core.constraints); None: no masking.
OffPolicyDelta = Annotated[float, Range(gt=0, means="None: off")] | None


@dataclasses.dataclass(frozen=True)
class OffPolicySequenceMask:
    """The mask :math:`M` above with threshold ``delta`` (δ > 0)."""

    delta: float

    def __post_init__(self) -> None:
        if not self.delta > 0:
            raise ValueError(f"off-policy sequence mask: delta must be > 0, got {self.delta}")

    def __call__(
        self,
        new_logp: jax.Array,  # [B, L] the current policy's (gradient ignored)
        behaviour_logp: jax.Array,  # [B, L] the sampler's
        advantages: jax.Array,  # [B, L]
        mask: jax.Array,  # [B, L] the tokens the loss uses so far
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Returns (the thinned mask [B, L], metrics)."""
        import jax
        import jax.numpy as jnp

        d = behaviour_logp - jax.lax.stop_gradient(new_logp)
        count = jnp.sum(mask, axis=-1, keepdims=True)
        drift = jnp.sum(d * mask, axis=-1, keepdims=True) / jnp.maximum(count, 1.0)  # [B, 1]
        drop = (advantages < 0) & (drift > self.delta)
        kept = mask * (1.0 - drop.astype(mask.dtype))
        rows = (count > 0).astype(jnp.float32)
        dropped_rows = jnp.any((drop & (mask > 0)), axis=-1, keepdims=True).astype(jnp.float32)
        return kept, {
            "offpolicy_masked_fraction": masked_mean(dropped_rows, rows),
            "offpolicy_drift_mean": masked_mean(drift, rows),
        }
