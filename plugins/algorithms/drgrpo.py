"""Dr.GRPO: GRPO done right — no std normalisation, a constant loss normaliser.

.. math::

   A_i = R_i - \\mathrm{mean}(R), \\qquad
   L(\\theta) = \\frac{1}{G\\,L_{max}} \\sum_{i=1}^{G} \\sum_t
       -\\min\\big(r_{i,t} A_i,\\ \\mathrm{clip}(r_{i,t}, 1-\\varepsilon, 1+\\varepsilon) A_i\\big)

Dividing each sequence by its own length |o_i| (GRPO) favours short correct
answers and long wrong ones; dividing by the std favours groups that are almost
all right or almost all wrong. Dr.GRPO removes both: every token of every
sequence has the same weight 1 / (G L_max), with L_max the generation budget.
Over a batch of groups this is ``seq-mean-token-sum-norm`` with L = L_max.

Reference: Liu et al., 2025, "Understanding R1-Zero-Like Training: A Critical
Perspective", https://arxiv.org/abs/2503.20783 (section 3.2, eq. 3).
"""

from __future__ import annotations

from typing import Annotated

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, checked_by
from rlax.plugins.algorithms.advantages import group_centered
from rlax.plugins.algorithms.aggregation import Aggregation
from rlax.plugins.algorithms.alignment import AlignmentMode, IsBounds, IsCap
from rlax.plugins.algorithms.objectives import (
    ClipEps,
    ClippedSurrogate,
    DualClip,
    KlBeta,
    KlEstimator,
    dual_clip_above_clip,
)
from rlax.plugins.algorithms.policy_gradient import PolicyGradient, alignment_of, settings_of


@checked_by(dual_clip_above_clip)
def drgrpo(
    *,
    max_len: Annotated[int, AtLeast(1)],
    clip_eps: ClipEps = 0.2,
    kl_beta: KlBeta = 0.0,
    dual_clip: DualClip = None,
    kl_estimator: KlEstimator = "k3",
    alignment: AlignmentMode = "none",
    is_cap: IsCap = 2.0,
    is_bounds: IsBounds = (0.5, 2.0),
) -> PolicyGradient:
    """Dr.GRPO (arXiv 2503.20783).

    Args:
      max_len: L_max, the constant normaliser: the sampler's generation budget
        in tokens (required).
      clip_eps: ε of the clipped surrogate (both sides).
      kl_beta: weight of a KL to a reference (the paper uses none: 0).
      dual_clip: c of dual-clip PPO (a token with A < 0 loses at most -c A;
        arXiv 1912.09729); None: off.
      kl_estimator: the KL term's per-token estimator, ``k1``, ``k2`` or ``k3``.
      alignment: one of :data:`rlax.plugins.algorithms.alignment.ALIGNMENTS`
        (``none``, ``tis``, ``mask``, ``icepop``, ``seq-tis``, ``seq-mis``).
      is_cap: C of truncated importance sampling.
      is_bounds: [C_min, C_max] of masked importance sampling.
    """
    with settings_of("drgrpo"):
        return PolicyGradient(
            name="drgrpo",
            estimator=group_centered,
            objective=ClippedSurrogate(clip_eps, clip_eps, dual_clip),
            aggregation=Aggregation("seq-mean-token-sum-norm", max_len=max_len),
            alignment=alignment_of(alignment, is_cap, is_bounds),
            kl_beta=kl_beta,
            kl_estimator=kl_estimator,
        )


@hookimpl
def rlax_register_algorithms():
    return {"drgrpo": drgrpo}
