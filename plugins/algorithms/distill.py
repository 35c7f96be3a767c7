r"""On-policy distillation: the student samples, a teacher's logprobs are the signal.

The algorithm is GRPO's clipped surrogate whose advantages are the
distillation piece's per-token term
(:class:`~rlax.plugins.algorithms.distillation.Distillation`),
:math:`A_{i,t} = c(\log\pi_T - \log\pi_{old})(o_{i,t})`, plus optionally the
group-normalised reward advantages scaled by ``reward_coef``. The teacher is
a model checkpoint named in gin::

    rlax.train.algorithm = @algorithms.distill()
    rlax.train.teacher = '/path/to/teacher'

It must share the student's tokenizer (the same token ids); its size and
architecture may differ.

References: as :mod:`rlax.plugins.algorithms.distillation` (GKD, MiniLLM,
Thinking Machines' on-policy distillation).
"""

from __future__ import annotations

import functools
from typing import Annotated

import numpy as np

from rlax.core import hookimpl
from rlax.core.constraints import NonNegative, Positive
from rlax.plugins.algorithms.advantages import group_normalized
from rlax.plugins.algorithms.aggregation import Aggregation, AggregationMode, MaxLen
from rlax.plugins.algorithms.alignment import AlignmentMode, IsBounds, IsCap
from rlax.plugins.algorithms.distillation import Distillation
from rlax.plugins.algorithms.objectives import (
    ClipEps,
    ClippedSurrogate,
    KlBeta,
    KlEstimator,
    StdEps,
)
from rlax.plugins.algorithms.policy_gradient import PolicyGradient, alignment_of, settings_of


def _scaled_group_normalized(rewards: np.ndarray, *, coef: float, eps: float) -> np.ndarray:
    return coef * group_normalized(rewards, eps=eps)


def distill(
    *,
    coef: Annotated[float, Positive] = 1.0,
    reward_coef: Annotated[float, NonNegative] = 0.0,
    clip_eps: ClipEps = 0.2,
    kl_beta: KlBeta = 0.0,
    kl_estimator: KlEstimator = "k3",
    aggregation: AggregationMode = "token-mean",
    max_len: MaxLen = None,
    std_eps: StdEps = 1e-6,
    alignment: AlignmentMode = "none",
    is_cap: IsCap = 2.0,
    is_bounds: IsBounds = (0.5, 2.0),
) -> PolicyGradient:
    """On-policy distillation from the teacher ``rlax.train.teacher`` names (module doc).

    Args:
      coef: weight c of the teacher's per-token term.
      reward_coef: weight of GRPO's group-normalised reward advantages (0: pure
        distillation, the rewards are only logged).
      clip_eps: ε of the clipped surrogate (both sides).
      kl_beta: β of a KL term in the loss; its target is the frozen starting
        policy (the reference), not the teacher.
      kl_estimator: ``k1``, ``k2`` or ``k3``.
      aggregation: any of the aggregations (token-mean).
      max_len: L of ``seq-mean-token-sum-norm`` (None: the generation budget).
      std_eps: ε added to the group std.
      alignment: one of :data:`rlax.plugins.algorithms.alignment.ALIGNMENTS`.
      is_cap: C of truncated importance sampling.
      is_bounds: [C_min, C_max] of masked importance sampling.
    """
    with settings_of("distill"):
        if reward_coef < 0:
            raise ValueError(f"reward_coef must be >= 0, got {reward_coef}")
        return PolicyGradient(
            name="distill",
            estimator=functools.partial(_scaled_group_normalized, coef=reward_coef, eps=std_eps),
            objective=ClippedSurrogate(clip_eps, clip_eps),
            aggregation=Aggregation(aggregation, max_len),
            alignment=alignment_of(alignment, is_cap, is_bounds),
            kl_beta=kl_beta,
            kl_estimator=kl_estimator,
            distill=Distillation(coef),
        )


@hookimpl
def rlax_register_algorithms():
    return {"distill": distill}
