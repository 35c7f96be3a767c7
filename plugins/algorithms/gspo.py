"""GSPO: a sequence-level importance ratio, clipped per sequence.

.. math::

   s_i(\\theta) = \\Big(\\frac{\\pi_\\theta(o_i)}{\\pi_{old}(o_i)}\\Big)^{1/|o_i|}
              = \\exp\\Big(\\frac{1}{|o_i|}\\sum_t \\log\\frac{\\pi_\\theta(o_{i,t})}{\\pi_{old}(o_{i,t})}\\Big)

.. math::

   L(\\theta) = \\frac{1}{G}\\sum_{i=1}^{G}
       -\\min\\big(s_i A_i,\\ \\mathrm{clip}(s_i, 1-\\varepsilon_{low}, 1+\\varepsilon_{high}) A_i\\big)

with GRPO's group-normalised :math:`A_i` and a very narrow clip range
(ε_low = 3e-4, ε_high = 4e-4), since a length-normalised sequence ratio moves
far less than a token's. The importance weight matches the unit the reward
is given to: the whole sequence.

Reference: Zheng et al., 2025, Group Sequence Policy Optimization,
https://arxiv.org/abs/2507.18071 (eq. 5-7).
"""

from __future__ import annotations

import functools

from rlax.core import hookimpl
from rlax.plugins.algorithms.advantages import group_normalized
from rlax.plugins.algorithms.aggregation import Aggregation
from rlax.plugins.algorithms.alignment import AlignmentMode, IsBounds, IsCap
from rlax.plugins.algorithms.objectives import ClipEps, EpsHigh, SequenceClippedSurrogate, StdEps
from rlax.plugins.algorithms.policy_gradient import PolicyGradient, alignment_of, settings_of


def gspo(
    *,
    eps_low: ClipEps = 3e-4,
    eps_high: EpsHigh = 4e-4,
    std_eps: StdEps = 1e-6,
    alignment: AlignmentMode = "none",
    is_cap: IsCap = 2.0,
    is_bounds: IsBounds = (0.5, 2.0),
) -> PolicyGradient:
    """Group Sequence Policy Optimization (arXiv 2507.18071).

    Args:
      eps_low: lower clip of the sequence ratio.
      eps_high: upper clip of the sequence ratio.
      std_eps: ε added to the group std.
      alignment: one of :data:`rlax.plugins.algorithms.alignment.ALIGNMENTS`.
      is_cap: C of truncated importance sampling.
      is_bounds: [C_min, C_max] of masked importance sampling.
    """
    with settings_of("gspo"):
        return PolicyGradient(
            name="gspo",
            estimator=functools.partial(group_normalized, eps=std_eps),
            objective=SequenceClippedSurrogate(eps_low, eps_high),
            # Each token carries its sequence's loss: seq-mean-token-mean is the mean over sequences.
            aggregation=Aggregation("seq-mean-token-mean"),
            alignment=alignment_of(alignment, is_cap, is_bounds),
        )


@hookimpl
def rlax_register_algorithms():
    return {"gspo": gspo}
