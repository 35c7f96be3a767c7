"""REINFORCE++ and REINFORCE++-baseline: critic-free, normalised over the global batch.

REINFORCE++ gives each token the return of a KL-shaped reward and normalises
advantages over every token of the batch (not per group, which overfits the
few samples of one prompt):

.. math::

   r_t = R\\,[t = \\mathrm{last}] - \\beta\\,\\mathrm{KL}_t, \\qquad
   G_t = \\sum_{s \\ge t} r_s, \\qquad
   A_t = \\frac{G_t - \\mathrm{mean}_{batch}(G)}{\\mathrm{std}_{batch}(G)}

with the per-token k1 KL to the reference policy, and PPO's clipped
surrogate, token-mean. **REINFORCE++-baseline** first subtracts the group
mean of the rewards (:math:`R_i - \\mathrm{mean}_{group}(R)`), which removes the
prompt's difficulty, then applies the same global normalisation.

Reference: Hu, 2025, "REINFORCE++: A Simple and Efficient Approach for
Aligning Large Language Models", https://arxiv.org/abs/2501.03262 (eq. 7-9,
and the -baseline variant).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlax.core import hookimpl
from rlax.plugins.algorithms.advantages import group_centered, raw_returns
from rlax.plugins.algorithms.aggregation import Aggregation
from rlax.plugins.algorithms.alignment import AlignmentMode, IsBounds, IsCap
from rlax.plugins.algorithms.objectives import ClipEps, ClippedSurrogate, KlBeta
from rlax.plugins.algorithms.policy_gradient import PolicyGradient, alignment_of, settings_of
from rlax.plugins.algorithms.returns import Returns


def _build(
    name: str,
    estimator: Callable[[np.ndarray], np.ndarray],
    clip_eps: ClipEps,
    kl_beta: KlBeta,
    alignment: AlignmentMode,
    is_cap: IsCap,
    is_bounds: IsBounds,
) -> PolicyGradient:
    with settings_of(name):
        return PolicyGradient(
            name=name,
            estimator=estimator,
            objective=ClippedSurrogate(clip_eps, clip_eps),
            aggregation=Aggregation("token-mean"),
            alignment=alignment_of(alignment, is_cap, is_bounds),
            returns=Returns(gamma=1.0, lam=1.0, kl_beta=kl_beta, whiten=True),
        )


def reinforcepp(
    *,
    clip_eps: ClipEps = 0.2,
    kl_beta: KlBeta = 0.0,
    alignment: AlignmentMode = "none",
    is_cap: IsCap = 2.0,
    is_bounds: IsBounds = (0.5, 2.0),
) -> PolicyGradient:
    """REINFORCE++ (arXiv 2501.03262): raw rewards, KL-shaped returns, global whitening.

    Args:
      clip_eps: ε of the clipped surrogate (both sides).
      kl_beta: β of the per-token k1 KL penalty in the reward (> 0 needs a
        reference policy, which the trainer keeps frozen from the start).
      alignment: one of :data:`rlax.plugins.algorithms.alignment.ALIGNMENTS`.
      is_cap: C of truncated importance sampling.
      is_bounds: [C_min, C_max] of masked importance sampling.
    """
    return _build("reinforcepp", raw_returns, clip_eps, kl_beta, alignment, is_cap, is_bounds)


def reinforcepp_baseline(
    *,
    clip_eps: ClipEps = 0.2,
    kl_beta: KlBeta = 0.0,
    alignment: AlignmentMode = "none",
    is_cap: IsCap = 2.0,
    is_bounds: IsBounds = (0.5, 2.0),
) -> PolicyGradient:
    """REINFORCE++-baseline: group-mean baseline, then REINFORCE++'s global whitening.

    Args: as :func:`reinforcepp`.
    """
    return _build(
        "reinforcepp_baseline", group_centered, clip_eps, kl_beta, alignment, is_cap, is_bounds
    )


@hookimpl
def rlax_register_algorithms():
    return {"reinforcepp": reinforcepp, "reinforcepp_baseline": reinforcepp_baseline}
