"""DAPO: GRPO's loss with clip-higher and token-mean aggregation.

.. math::

   L(\\theta) = \\frac{1}{\\sum_i |o_i|} \\sum_i \\sum_t
       -\\min\\big(r_{i,t} A_i,\\ \\mathrm{clip}(r_{i,t}, 1-\\varepsilon_{low}, 1+\\varepsilon_{high}) A_i\\big),
   \\qquad A_i = \\frac{R_i - \\mathrm{mean}(R)}{\\mathrm{std}(R) + \\epsilon}

with ε_low = 0.2, ε_high = 0.28 (a larger upper clip leaves room for
low-probability tokens to grow) and every token of the batch weighted
equally, so long sequences are not down-weighted. The paper's two other
ingredients are separate plugins, reusable with any algorithm:

- dynamic sampling: ``@curation.dynamic_sampling()``
  (:mod:`rlax.plugins.curation.dynamic_sampling`) drops groups whose rewards
  are all equal and keeps sampling until the batch is full;
- overlong reward shaping: ``@rewards.overlong()``
  (:mod:`rlax.plugins.rewards.overlong`).

``configs/algorithms/dapo.gin`` puts the first three together and
``configs/experiments/dapo.gin`` adds the fourth for the quickstart's task.

Reference: Yu et al., 2025, DAPO, https://arxiv.org/abs/2503.14476 (eq. 8-13).
"""

from __future__ import annotations

import functools

from rlax.core import hookimpl
from rlax.core.constraints import checked_by
from rlax.plugins.algorithms.advantages import group_normalized
from rlax.plugins.algorithms.aggregation import Aggregation, AggregationMode, MaxLen
from rlax.plugins.algorithms.alignment import AlignmentMode, IsBounds, IsCap
from rlax.plugins.algorithms.entropy import EntropyBonus, EntropyCoef
from rlax.plugins.algorithms.objectives import (
    ClipEps,
    ClippedSurrogate,
    DualClip,
    EpsHigh,
    KlBeta,
    KlEstimator,
    StdEps,
    dual_clip_above_clip,
)
from rlax.plugins.algorithms.policy_gradient import (
    PolicyGradient,
    alignment_of,
    off_policy_mask,
    settings_of,
)
from rlax.plugins.algorithms.sequence_mask import OffPolicyDelta


@checked_by(dual_clip_above_clip)
def dapo(
    *,
    eps_low: ClipEps = 0.2,
    eps_high: EpsHigh = 0.28,
    kl_beta: KlBeta = 0.0,
    aggregation: AggregationMode = "token-mean",
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
    """Decoupled Clip and Dynamic sAmpling Policy Optimization (arXiv 2503.14476).

    Args:
      eps_low: lower clip ε_low of the ratio.
      eps_high: upper clip ε_high ("clip-higher").
      kl_beta: weight of a KL to a reference (the paper drops it: 0).
      aggregation: token-mean (the paper's); any of the aggregations.
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
    with settings_of("dapo"):
        return PolicyGradient(
            name="dapo",
            estimator=functools.partial(group_normalized, eps=std_eps),
            objective=ClippedSurrogate(eps_low, eps_high, dual_clip),
            aggregation=Aggregation(aggregation, max_len),
            alignment=alignment_of(alignment, is_cap, is_bounds),
            kl_beta=kl_beta,
            kl_estimator=kl_estimator,
            sequence_mask=off_policy_mask(off_policy_delta),
            entropy=EntropyBonus(entropy_coef) if entropy_coef else None,
        )


@hookimpl
def rlax_register_algorithms():
    return {"dapo": dapo}
