"""CISPO: clip the importance weight, never the token's gradient.

.. math::

   L(\\theta) = -\\frac{1}{\\sum_i |o_i|} \\sum_i \\sum_t
       \\mathrm{sg}\\big(\\hat r_{i,t}\\big)\\, A_i \\log\\pi_\\theta(o_{i,t}),
   \\qquad \\hat r_{i,t} = \\mathrm{clip}\\big(r_{i,t}, 1-\\varepsilon_{low}, 1+\\varepsilon_{high}\\big)

with GRPO's group-normalised :math:`A_i`. PPO-style clipping drops the
gradient of tokens whose ratio left the trust region — often rare "fork"
tokens that matter for reasoning; CISPO keeps every token and only bounds its
weight. The paper sets no lower bound (ε_low = 1) and tunes only ε_high.

Reference: MiniMax, 2025, MiniMax-M1, https://arxiv.org/abs/2506.13585 (section 3.1, eq. 4-5).
"""

from __future__ import annotations

import functools
from typing import Annotated

from rlax.core import hookimpl
from rlax.core.constraints import Range
from rlax.plugins.algorithms.advantages import group_normalized
from rlax.plugins.algorithms.aggregation import Aggregation
from rlax.plugins.algorithms.alignment import AlignmentMode, IsBounds, IsCap
from rlax.plugins.algorithms.objectives import ClippedISWeight, EpsHigh, StdEps
from rlax.plugins.algorithms.policy_gradient import PolicyGradient, alignment_of, settings_of


def cispo(
    *,
    eps_low: Annotated[float, Range(gt=0, le=1)] = 1.0,
    eps_high: EpsHigh = 0.28,
    std_eps: StdEps = 1e-6,
    alignment: AlignmentMode = "none",
    is_cap: IsCap = 2.0,
    is_bounds: IsBounds = (0.5, 2.0),
) -> PolicyGradient:
    """Clipped IS-weight Policy Optimization (arXiv 2506.13585).

    Args:
      eps_low: lower clip of the IS weight (1.0: no lower bound, as the paper).
      eps_high: upper clip of the IS weight.
      std_eps: ε added to the group std.
      alignment: one of :data:`rlax.plugins.algorithms.alignment.ALIGNMENTS`.
      is_cap: C of truncated importance sampling.
      is_bounds: [C_min, C_max] of masked importance sampling.
    """
    with settings_of("cispo"):
        return PolicyGradient(
            name="cispo",
            estimator=functools.partial(group_normalized, eps=std_eps),
            objective=ClippedISWeight(eps_low, eps_high),
            aggregation=Aggregation("token-mean"),
            alignment=alignment_of(alignment, is_cap, is_bounds),
        )


@hookimpl
def rlax_register_algorithms():
    return {"cispo": cispo}
