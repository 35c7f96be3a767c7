"""Per-token policy objectives: the *(advantage × gradient term)* of the unified objective.

Each objective is a frozen, validated value with a pure ``__call__``::

    per_token, metrics = objective(logp, old_logp, advantages, mask)

``logp`` are the new log-probabilities (the differentiated input), ``old_logp``
the denominator of the importance ratio :math:`r = \\pi_\\theta / \\pi_{old}`
(which one that is, sampler or trainer, is the alignment's choice), and
``per_token`` is a *loss* (to be minimised) on every position of the mask,
ready for an :class:`~rlax.plugins.algorithms.aggregation.Aggregation`.
Metrics are scalars, already averaged.

Shapes: the legend of :mod:`rlax.core.types` (B rows, L target positions).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated

from rlax.core.constraints import NonNegative, OneOf, Positive, Range
from rlax.core.errors import BadSetting
from rlax.plugins.algorithms.aggregation import masked_mean

if TYPE_CHECKING:  # annotations only: the algorithm's settings are read where JAX is not
    import jax


def clipped_surrogate(
    logratio: jax.Array, advantages: jax.Array, eps_low: float, eps_high: float
) -> tuple[jax.Array, jax.Array]:
    """Per-token :math:`-\\min(r A, \\mathrm{clip}(r, 1-\\varepsilon_{low}, 1+\\varepsilon_{high}) A)`.

    Returns the loss and whether the clipped branch was taken (the token then
    has zero gradient). References: Schulman et al., 2017, PPO,
    https://arxiv.org/abs/1707.06347 (eq. 7); Yu et al., 2025, DAPO,
    https://arxiv.org/abs/2503.14476 (the decoupled ε_low, ε_high: "clip-higher").
    """
    import jax.numpy as jnp

    ratio = jnp.exp(logratio)
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    return -jnp.minimum(unclipped, clipped), clipped < unclipped


def k3_kl(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """Per-token k3 estimate of KL(π ‖ ref): :math:`e^{ref - logp} - (ref - logp) - 1 \\ge 0`.

    Unbiased for tokens sampled from π, and non-negative everywhere.
    Reference: Schulman, 2020, "Approximating KL divergence",
    http://joschu.net/blog/kl-approx.html
    """
    import jax.numpy as jnp

    d = ref_logp - logp
    return jnp.exp(d) - d - 1.0


KL_ESTIMATORS = ("k1", "k2", "k3", "k3-is")

# The objectives' settings as an algorithm declares them (rlax.core.constraints).
ClipEps = Annotated[float, Range(gt=0, le=0.999)]  # epsilon of a clip's lower side, symmetric ones
EpsHigh = Annotated[float, Positive]  # epsilon of a clip's upper side
KlBeta = Annotated[float, NonNegative]
KlEstimator = Annotated[str, OneOf(*KL_ESTIMATORS)]
DualClip = Annotated[float, Range(gt=1, means="None: off")] | None
StdEps = Annotated[float, Positive]  # added to a group's std


def dual_clip_above_clip(
    *, dual_clip: float | None = None, clip_eps: float = 0.2, eps_high: float | None = None, **_
) -> None:
    """BadSetting unless dual-clip's c is above the clip's upper end, 1 + eps_high."""
    high = clip_eps if eps_high is None else eps_high
    if dual_clip is not None and dual_clip <= 1.0 + high:
        raise BadSetting(
            "dual_clip",
            f"must be > 1 + {'eps_high' if eps_high is not None else 'clip_eps'} "
            f"= {1.0 + high}, got {dual_clip}",
        )


def kl_estimate(
    logp: jax.Array,
    ref_logp: jax.Array,
    estimator: str = "k3",
    behaviour_logp: jax.Array | None = None,
) -> jax.Array:
    """Per-token estimate of KL(π ‖ ref) on tokens sampled from π, with d = log π − log ref.

    - ``k1``: :math:`d` (unbiased, high variance, negative on some tokens; in a
      loss its expected gradient is 0 on-policy, so it acts through the ratio);
    - ``k2``: :math:`\tfrac12 d^2` (biased, low variance, ≥ 0; its gradient is
      that of KL's score-function estimator, d ∇log π);
    - ``k3``: :math:`e^{-d} - 1 + d` (unbiased, low variance, ≥ 0);
    - ``k3-is``: k3 weighted by the importance ratio
      :math:`\\pi_\theta / \\pi_{old}` of the policy that sampled the tokens
      (``behaviour_logp``, the sampler's logprobs), with gradient through both:
      the tokens come from :math:`\\pi_{old}`, not :math:`\\pi_\theta`, and
      :math:`E_{\\pi_{old}}[\frac{\\pi_\theta}{\\pi_{old}} k_3] = KL(\\pi_\theta \\| \\pi_{ref})`
      exactly, so the estimate and its gradient are unbiased off-policy
      (DeepSeek-V3.2's unbiased KL estimate).

    References:
      Schulman, 2020, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html
      DeepSeek-AI, 2025, "DeepSeek-V3.2", https://arxiv.org/abs/2512.02556 (k3-is)
    """
    import jax.numpy as jnp

    if estimator == "k3-is":
        if behaviour_logp is None:
            raise ValueError("the k3-is KL estimator needs the sampler's logprobs")
        return jnp.exp(logp - behaviour_logp) * k3_kl(logp, ref_logp)
    d = logp - ref_logp
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * jnp.square(d)
    if estimator == "k3":
        return k3_kl(logp, ref_logp)
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")


def _check_eps(name: str, eps_low: float, eps_high: float, *, low_max: float = 1.0) -> None:
    if not (0.0 < eps_low <= low_max and eps_high > 0.0):
        raise ValueError(
            f"{name}: need 0 < eps_low <= {low_max} and eps_high > 0, "
            f"got eps_low={eps_low}, eps_high={eps_high}"
        )


@dataclasses.dataclass(frozen=True)
class ClippedSurrogate:
    """PPO's clipped surrogate at the token level (GRPO, DAPO, Dr.GRPO, RLOO, REINFORCE++, PPO).

    .. math::

       \\ell_{i,t} = -\\min\\big(r_{i,t} A_{i,t},\\
                     \\mathrm{clip}(r_{i,t}, 1-\\varepsilon_{low}, 1+\\varepsilon_{high}) A_{i,t}\\big),
       \\qquad r_{i,t} = e^{\\log\\pi_\\theta - \\log\\pi_{old}}

    The gradient w.r.t. :math:`\\log\\pi_\\theta` is :math:`-r A` where the
    unclipped branch is the minimum, and 0 where the clip holds: above
    :math:`1+\\varepsilon_{high}` for :math:`A > 0`, below
    :math:`1-\\varepsilon_{low}` for :math:`A < 0`.

    With ``dual_clip`` = c > 1 (dual-clip PPO) the loss of a token with
    :math:`A < 0` is also bounded by :math:`-cA`:
    :math:`\\ell = \\min(\\ell, -cA)`, i.e. the objective
    :math:`\\max(\\min(rA, \\mathrm{clip}(r)A), cA)`; such tokens (ratio above c)
    get no gradient.

    References:
      Schulman et al., 2017, PPO, https://arxiv.org/abs/1707.06347
      Yu et al., 2025, DAPO, https://arxiv.org/abs/2503.14476 (asymmetric ε)
      Ye et al., 2020, "Mastering Complex Control in MOBA Games with Deep
      Reinforcement Learning", https://arxiv.org/abs/1912.09729 (dual clip, eq. 5; c = 3)
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None

    def __post_init__(self) -> None:
        _check_eps("clipped surrogate", self.eps_low, self.eps_high, low_max=0.999)
        if self.dual_clip is not None and self.dual_clip <= 1.0 + self.eps_high:
            raise ValueError(
                f"clipped surrogate: dual_clip must be > 1 + eps_high = {1.0 + self.eps_high}, "
                f"got {self.dual_clip}"
            )

    def __call__(self, logp, old_logp, advantages, mask):
        import jax.numpy as jnp

        logratio = logp - old_logp
        loss, _ = clipped_surrogate(logratio, advantages, self.eps_low, self.eps_high)
        ratio = jnp.exp(logratio)
        high = (advantages > 0) & (ratio > 1.0 + self.eps_high)
        low = (advantages < 0) & (ratio < 1.0 - self.eps_low)
        f32 = jnp.float32
        metrics = {
            "clip_fraction": masked_mean((high | low).astype(f32), mask),
            "clip_fraction_high": masked_mean(high.astype(f32), mask),
            "clip_fraction_low": masked_mean(low.astype(f32), mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
        if self.dual_clip is not None:
            # Dual clip: for A < 0 the loss is at most -c A, so a huge ratio on a bad token
            # (a stale or mismatched sample) cannot blow the update up.
            bound = -self.dual_clip * advantages
            dual = (advantages < 0) & (loss > bound)
            loss = jnp.where(dual, bound, loss)
            metrics["dual_clip_fraction"] = masked_mean(dual.astype(f32), mask)
        return loss, metrics


@dataclasses.dataclass(frozen=True)
class SequenceClippedSurrogate:
    """GSPO's sequence-level clipped surrogate, written on every token of the sequence.

    .. math::

       s_i = \\exp\\Big(\\frac{1}{|o_i|} \\sum_t (\\log\\pi_\\theta - \\log\\pi_{old})_{i,t}\\Big),
       \\qquad
       \\ell_i = -\\min\\big(s_i A_i,\\ \\mathrm{clip}(s_i, 1-\\varepsilon_{low}, 1+\\varepsilon_{high}) A_i\\big)

    :math:`A_i` is the token mean of the row's advantages (they are constant
    on a row for sequence-level estimators). Every token of row i carries
    :math:`\\ell_i`, so ``seq-mean-token-mean`` aggregation gives
    :math:`\\frac1N\\sum_i \\ell_i`, the paper's objective; unclipped, the
    gradient w.r.t. each :math:`\\log\\pi_\\theta(o_{i,t})` is then
    :math:`-s_i A_i / (N |o_i|)`.

    Reference: Zheng et al., 2025, GSPO, https://arxiv.org/abs/2507.18071 (eq. 5-7;
    ε_low = 3e-4, ε_high = 4e-4).
    """

    eps_low: float = 3e-4
    eps_high: float = 4e-4

    def __post_init__(self) -> None:
        _check_eps("sequence clipped surrogate", self.eps_low, self.eps_high, low_max=0.999)

    def __call__(self, logp, old_logp, advantages, mask):
        import jax.numpy as jnp

        n_tokens = jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
        seq_logratio = jnp.sum((logp - old_logp) * mask, axis=-1) / n_tokens  # [B]
        seq_adv = jnp.sum(advantages * mask, axis=-1) / n_tokens  # [B]
        loss, _ = clipped_surrogate(seq_logratio, seq_adv, self.eps_low, self.eps_high)
        ratio = jnp.exp(seq_logratio)
        clipped = ((seq_adv > 0) & (ratio > 1.0 + self.eps_high)) | (
            (seq_adv < 0) & (ratio < 1.0 - self.eps_low)
        )
        has_tokens = (jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)
        metrics = {
            "clip_fraction": masked_mean(clipped.astype(jnp.float32), has_tokens),
            "seq_ratio_mean": masked_mean(ratio, has_tokens),
        }
        return jnp.broadcast_to(loss[:, None], logp.shape), metrics


@dataclasses.dataclass(frozen=True)
class ClippedISWeight:
    """CISPO: REINFORCE weighted by the clipped, stop-gradient importance weight.

    .. math::

       \\ell_{i,t} = -\\,\\mathrm{sg}\\big(\\hat r_{i,t}\\big)\\, A_{i,t} \\log\\pi_\\theta(o_{i,t}),
       \\qquad \\hat r = \\mathrm{clip}(r, 1-\\varepsilon_{low}, 1+\\varepsilon_{high})

    Unlike the clipped surrogate no token loses its gradient: clipping bounds
    the weight, :math:`\\partial\\ell/\\partial\\log\\pi_\\theta = -\\hat r A`. The
    paper imposes no lower bound (ε_low = 1, so the weight is only clipped above).

    Reference: MiniMax, 2025, MiniMax-M1, https://arxiv.org/abs/2506.13585 (eq. 4-5).
    """

    eps_low: float = 1.0
    eps_high: float = 0.28

    def __post_init__(self) -> None:
        _check_eps("clipped IS weight", self.eps_low, self.eps_high)

    def __call__(self, logp, old_logp, advantages, mask):
        import jax
        import jax.numpy as jnp

        ratio = jnp.exp(logp - old_logp)
        weight = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - self.eps_low, 1.0 + self.eps_high))
        clipped = (ratio > 1.0 + self.eps_high) | (ratio < 1.0 - self.eps_low)
        metrics = {"clip_fraction": masked_mean(clipped.astype(jnp.float32), mask)}
        return -weight * advantages * logp, metrics
