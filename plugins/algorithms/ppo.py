"""PPO with a critic and GAE.

The completion is a trajectory whose only reward is the verifier's score on
its last token (optionally minus a per-token KL penalty to the reference). A
critic :math:`V` estimates the value of each prefix; GAE turns rewards and
values into per-token advantages, which are whitened over the batch:

.. math::

   \\delta_t = r_t + \\gamma V_{t+1} - V_t,\\qquad A_t = \\sum_{l \\ge 0} (\\gamma\\lambda)^l \\delta_{t+l},
   \\qquad V_{\\text{after last token}} = 0

.. math::

   L(\\theta) = \\mathrm{mean}_{t}\\Big[-\\min\\big(r_t A_t,\\
                \\mathrm{clip}(r_t, 1-\\varepsilon, 1+\\varepsilon) A_t\\big)\\Big]
              + c_V \\cdot \\tfrac12\\,\\mathrm{mean}_t \\max\\big((V_t - R_t)^2,
                (V^{old}_t + \\mathrm{clip}(V_t - V^{old}_t, \\pm\\varepsilon_V) - R_t)^2\\big)

The critic is any critic component (``value_model``, a
:class:`~rlax.core.contracts.Critic`): by default a value head on the policy's
own trunk (``@critics.head()``, one forward pass, shared features), or a
separate value model initialised from the policy (``@critics.separate()``, as
verl and OpenRLHF do for LLMs).

References:
  Schulman et al., 2017, PPO, https://arxiv.org/abs/1707.06347 (eq. 7, 9)
  Schulman et al., 2015, GAE, https://arxiv.org/abs/1506.02438 (eq. 16)
  Ouyang et al., 2022, InstructGPT, https://arxiv.org/abs/2203.02155 (KL in the reward)
"""

from __future__ import annotations

from typing import Annotated

from rlax.core import hookimpl
from rlax.core.constraints import Positive, Probability, checked_by
from rlax.core.contracts import Critic
from rlax.plugins.algorithms.advantages import raw_returns
from rlax.plugins.algorithms.aggregation import Aggregation, AggregationMode, MaxLen
from rlax.plugins.algorithms.alignment import AlignmentMode, IsBounds, IsCap
from rlax.plugins.algorithms.objectives import (
    ClipEps,
    ClippedSurrogate,
    DualClip,
    KlBeta,
    dual_clip_above_clip,
)
from rlax.plugins.algorithms.policy_gradient import PolicyGradient, alignment_of, settings_of
from rlax.plugins.algorithms.returns import Returns
from rlax.plugins.algorithms.value import HEAD, ValueLoss


@checked_by(dual_clip_above_clip)
def ppo(
    *,
    clip_eps: ClipEps = 0.2,
    gamma: Annotated[float, Probability] = 1.0,
    lam: Annotated[float, Probability] = 0.95,
    value_clip: Annotated[float, Positive] = 0.2,
    vf_coef: Annotated[float, Positive] = 0.5,
    value_model: Critic = HEAD,
    whiten_advantages: bool = True,
    kl_beta: KlBeta = 0.0,
    aggregation: AggregationMode = "token-mean",
    max_len: MaxLen = None,
    dual_clip: DualClip = None,
    alignment: AlignmentMode = "none",
    is_cap: IsCap = 2.0,
    is_bounds: IsBounds = (0.5, 2.0),
) -> PolicyGradient:
    """Proximal Policy Optimization with a critic (arXiv 1707.06347, 1506.02438).

    Args:
      clip_eps: ε of the clipped surrogate (both sides).
      gamma: discount γ of GAE.
      lam: λ of GAE.
      value_clip: ε_V of the clipped value loss.
      vf_coef: weight c_V of the value loss.
      value_model: the critic (gin: ``@critics.head()``, a value head on the
        policy, or ``@critics.separate()``, a value model of its own).
      whiten_advantages: normalise advantages over the batch's tokens.
      kl_beta: β of the per-token k1 KL penalty in the reward (0 = none).
      aggregation: how per-token policy losses are reduced (token-mean).
      max_len: L of ``seq-mean-token-sum-norm``; None: the generation budget
        (the completion region of the trainer's layout, the sampler's budget).
      dual_clip: c of dual-clip PPO (a token with A < 0 loses at most -c A;
        arXiv 1912.09729); None: off.
      alignment: one of :data:`rlax.plugins.algorithms.alignment.ALIGNMENTS`
        (``none``, ``tis``, ``mask``, ``icepop``, ``seq-tis``, ``seq-mis``).
      is_cap: C of truncated importance sampling.
      is_bounds: [C_min, C_max] of masked importance sampling.
    """
    with settings_of("ppo"):
        return PolicyGradient(
            name="ppo",
            estimator=raw_returns,
            objective=ClippedSurrogate(clip_eps, clip_eps, dual_clip),
            aggregation=Aggregation(aggregation, max_len),
            alignment=alignment_of(alignment, is_cap, is_bounds),
            returns=Returns(gamma=gamma, lam=lam, kl_beta=kl_beta, whiten=whiten_advantages),
            critic=ValueLoss(clip_eps=value_clip, coef=vf_coef, model=value_model),
        )


@hookimpl
def rlax_register_algorithms():
    return {"ppo": ppo}
