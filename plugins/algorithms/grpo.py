"""GRPO: group-relative advantages with a clipped surrogate.

For a group of G completions of one prompt with rewards R_1..R_G:

.. math::

   A_i = \\frac{R_i - \\mathrm{mean}(R)}{\\mathrm{std}(R) + \\epsilon}
   \\qquad (\\mathrm{std}\\ \\text{with ddof} = 1,\\ \\epsilon = 10^{-6})

and every token t of completion i gets A_i. With the importance ratio
:math:`r_{i,t} = \\pi_\\theta(o_{i,t}) / \\pi_{old}(o_{i,t})` the per-token loss is

.. math::

   \\ell_{i,t} = -\\min\\big(r_{i,t} A_i,\\ \\mathrm{clip}(r_{i,t}, 1-\\varepsilon, 1+\\varepsilon) A_i\\big)
                 + \\beta\\, \\mathrm{KL}_{k3}(\\pi_\\theta \\| \\pi_{ref})

with :math:`\\mathrm{KL}_{k3} = e^{ref - new} - (ref - new) - 1`, aggregated over
tokens and sequences by one of ``token-mean``, ``seq-mean-token-mean`` (the
paper's) or ``seq-mean-token-sum-norm``.

References:
  Shao et al., 2024, DeepSeekMath, https://arxiv.org/abs/2402.03300
  Schulman et al., 2017, PPO, https://arxiv.org/abs/1707.06347 (the clipped surrogate)
  Schulman, 2020, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html (k3)
"""

from __future__ import annotations

import functools

from rlax.core import hookimpl
from rlax.core.constraints import checked_by
from rlax.plugins.algorithms.advantages import group_normalized
from rlax.plugins.algorithms.aggregation import (
    AGGREGATIONS,
    Aggregation,
    AggregationMode,
    MaxLen,
    aggregate,
)
from rlax.plugins.algorithms.alignment import AlignmentMode, IsBounds, IsCap
from rlax.plugins.algorithms.entropy import EntropyBonus, EntropyCoef
from rlax.plugins.algorithms.objectives import (
    ClipEps,
    ClippedSurrogate,
    DualClip,
    KlBeta,
    KlEstimator,
    StdEps,
    clipped_surrogate,
    dual_clip_above_clip,
    k3_kl,
)
from rlax.plugins.algorithms.policy_gradient import (
    PolicyGradient,
    alignment_of,
    off_policy_mask,
    settings_of,
)
from rlax.plugins.algorithms.sequence_mask import OffPolicyDelta

# The walking skeleton's names, still importable from here.
group_advantages = group_normalized
__all__ = [
    "AGGREGATIONS",
    "GRPO",
    "aggregate",
    "clipped_surrogate",
    "group_advantages",
    "grpo",
    "k3_kl",
]


@checked_by(dual_clip_above_clip)
def grpo(
    *,
    clip_eps: ClipEps = 0.2,
    kl_beta: KlBeta = 0.0,
    aggregation: AggregationMode = "seq-mean-token-mean",
    max_len: MaxLen = None,
    std_eps: StdEps = 1e-6,
    dual_clip: DualClip = None,
    kl_estimator: KlEstimator = "k3",
    alignment: AlignmentMode = "none",
    is_cap: IsCap = 2.0,
    is_bounds: IsBounds = (0.5, 2.0),
    off_policy_delta: OffPolicyDelta = None,
    entropy_coef: EntropyCoef = 0.0,
) -> PolicyGradient:
    """Group Relative Policy Optimization (arXiv 2402.03300).

    Args:
      clip_eps: ε of the clipped surrogate (both sides).
      kl_beta: weight of the KL to a frozen reference policy (0 = none).
      aggregation: ``token-mean``, ``seq-mean-token-mean`` (the paper's) or
        ``seq-mean-token-sum-norm``.
      max_len: L of ``seq-mean-token-sum-norm``; None: the generation budget
        (the completion region of the trainer's layout, the sampler's budget).
      std_eps: ε added to the group std.
      dual_clip: c of dual-clip PPO (a token with A < 0 loses at most -c A;
        arXiv 1912.09729); None: off.
      kl_estimator: the KL term's per-token estimator, ``k1``, ``k2`` or ``k3``.
      alignment: one of :data:`rlax.plugins.algorithms.alignment.ALIGNMENTS`
        (``none``, ``tis``, ``mask``, ``icepop``, ``seq-tis``, ``seq-mis``).
      is_cap: C of truncated importance sampling.
      is_bounds: [C_min, C_max] of masked importance sampling.
      off_policy_delta: δ of off-policy sequence masking (DeepSeek-V3.2: a
        negative-advantage sequence whose mean log(π_sampler / π_θ) exceeds δ
        leaves the loss); None: off.
      entropy_coef: c_H of an entropy bonus, -c_H Agg[H(π_θ)] (0: none).
    """
    with settings_of("grpo"):
        return PolicyGradient(
            name="grpo",
            estimator=functools.partial(group_normalized, eps=std_eps),
            objective=ClippedSurrogate(clip_eps, clip_eps, dual_clip),
            aggregation=Aggregation(aggregation, max_len),
            alignment=alignment_of(alignment, is_cap, is_bounds),
            kl_beta=kl_beta,
            kl_estimator=kl_estimator,
            sequence_mask=off_policy_mask(off_policy_delta),
            entropy=EntropyBonus(entropy_coef) if entropy_coef else None,
        )


GRPO = grpo  # the walking skeleton's class name: GRPO(clip_eps=...) still builds it


@hookimpl
def rlax_register_algorithms():
    return {"grpo": grpo}
