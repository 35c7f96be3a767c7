"""RLOO: REINFORCE with a leave-one-out baseline.

.. math::

   A_i = R_i - \\frac{1}{G-1}\\sum_{j \\ne i} R_j, \\qquad
   L(\\theta) = \\frac{1}{N}\\sum_i \\sum_t
       -\\min\\big(r_{i,t} A_i,\\ \\mathrm{clip}(r_{i,t}, 1-\\varepsilon, 1+\\varepsilon) A_i\\big)

The paper treats a whole completion as one action: its gradient is
:math:`A_i \\nabla \\log\\pi(o_i) = A_i \\sum_t \\nabla\\log\\pi(o_{i,t})`, which is
what the clipped surrogate with ``seq-mean-token-sum`` aggregation gives
on-policy (r = 1). The clip, as in the TRL and OpenRLHF implementations, only
acts when the rollout is off-policy (stale weights, sampler mismatch).

Reference: Ahmadian et al., 2024, "Back to Basics: Revisiting REINFORCE Style
Optimization for Learning from Human Feedback in LLMs",
https://arxiv.org/abs/2402.14740 (section 3.3, eq. 6).
"""

from __future__ import annotations

from rlax.core import hookimpl
from rlax.core.constraints import checked_by
from rlax.plugins.algorithms.advantages import leave_one_out
from rlax.plugins.algorithms.aggregation import Aggregation, AggregationMode, MaxLen
from rlax.plugins.algorithms.alignment import AlignmentMode, IsBounds, IsCap
from rlax.plugins.algorithms.objectives import (
    ClipEps,
    ClippedSurrogate,
    DualClip,
    dual_clip_above_clip,
)
from rlax.plugins.algorithms.policy_gradient import PolicyGradient, alignment_of, settings_of


@checked_by(dual_clip_above_clip)
def rloo(
    *,
    clip_eps: ClipEps = 0.2,
    aggregation: AggregationMode = "seq-mean-token-sum",
    max_len: MaxLen = None,
    dual_clip: DualClip = None,
    alignment: AlignmentMode = "none",
    is_cap: IsCap = 2.0,
    is_bounds: IsBounds = (0.5, 2.0),
) -> PolicyGradient:
    """REINFORCE Leave-One-Out (arXiv 2402.14740).

    Args:
      clip_eps: ε of the clipped surrogate (both sides).
      aggregation: ``seq-mean-token-sum`` (a sequence is one action); any of
        the aggregations.
      max_len: L of ``seq-mean-token-sum-norm``; None: the generation budget
        (the completion region of the trainer's layout, the sampler's budget).
      dual_clip: c of dual-clip PPO (a token with A < 0 loses at most -c A;
        arXiv 1912.09729); None: off.
      alignment: one of :data:`rlax.plugins.algorithms.alignment.ALIGNMENTS`
        (``none``, ``tis``, ``mask``, ``icepop``, ``seq-tis``, ``seq-mis``).
      is_cap: C of truncated importance sampling.
      is_bounds: [C_min, C_max] of masked importance sampling.
    """
    with settings_of("rloo"):
        return PolicyGradient(
            name="rloo",
            estimator=leave_one_out,
            objective=ClippedSurrogate(clip_eps, clip_eps, dual_clip),
            aggregation=Aggregation(aggregation, max_len),
            alignment=alignment_of(alignment, is_cap, is_bounds),
        )


@hookimpl
def rlax_register_algorithms():
    return {"rloo": rloo}
