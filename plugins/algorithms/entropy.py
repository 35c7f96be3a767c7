"""An entropy bonus: a loss term that rewards the policy for keeping its distribution wide.

.. math::

   L_H(\\theta) = -c_H\\ \\mathrm{Agg}_{i,t}\\big[H(\\pi_\\theta(\\cdot \\mid o_{i,<t}))\\big]

with :math:`H` the entropy of the full tempered distribution at each
sampled position (the trainer's ``entropy``, with gradient, from the same
forward pass as the logprobs) and :math:`\\mathrm{Agg}` the algorithm's own
aggregation over the loss mask. Added to the loss, so minimising it raises the
entropy. An algorithm with ``entropy_coef`` > 0 declares ``needs_entropy``
(:class:`rlax.core.contracts.UsesEntropy`) and the trainer hands the entropy to
its loss. Logged: ``entropy_bonus`` (:math:`c_H\\,\\mathrm{Agg}[H]`).

References:
  Williams & Peng, 1991, "Function optimization using connectionist reinforcement
  learning algorithms", Connection Science 3(3) (the entropy regulariser)
  Mnih et al., 2016, A3C, https://arxiv.org/abs/1602.01783 (entropy bonus in policy gradients)
  Schulman et al., 2017, PPO, https://arxiv.org/abs/1707.06347 (c_2 S[π_θ] in the objective)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated

from rlax.core.constraints import NonNegative
from rlax.plugins.algorithms.aggregation import Aggregation

if TYPE_CHECKING:  # annotations only: the algorithm's settings are read where JAX is not
    import jax

#: c_H as an algorithm declares it (rlax.core.constraints); 0: no bonus.
EntropyCoef = Annotated[float, NonNegative]


@dataclasses.dataclass(frozen=True)
class EntropyBonus:
    """The term :math:`L_H` above with coefficient ``coef`` (c_H >= 0)."""

    coef: float

    def __post_init__(self) -> None:
        if not self.coef >= 0:
            raise ValueError(f"entropy bonus: coef must be >= 0, got {self.coef}")

    def __call__(
        self,
        entropy: jax.Array,  # [B, L] with gradient
        aggregation: Aggregation,
        loss_mask: jax.Array,  # [B, L]
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Returns (the scalar term to add to the loss, metrics)."""
        import jax

        bonus = self.coef * aggregation(entropy, loss_mask, loss_mask)
        return -bonus, {"entropy_bonus": jax.lax.stop_gradient(bonus)}
