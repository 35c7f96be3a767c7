"""Token-level advantages computed inside the train step (PPO, REINFORCE++).

The host-side estimator hands the trainer one number per sequence (for PPO
and REINFORCE++ the reward itself). Here, traced inside the jitted step, it
becomes a terminal reward on the completion's last token, optionally shaped
by a per-token KL penalty against the reference policy, and turns into
per-token advantages by generalised advantage estimation against a critic's
values (or against V = 0, which with γ = λ = 1 is the plain return-to-go),
optionally whitened over the whole batch.

Shapes: the legend of :mod:`rlax.core.types` (B rows, L target positions). A multi-turn
episode's mask has holes (the environment's observations, mask 0): "the next token" of
position t is the next position *on the mask*, so an observation is part of the
environment's transition between two model tokens, never a step with a value of its own.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rlax.plugins.algorithms.aggregation import masked_mean

if TYPE_CHECKING:  # annotations only: the algorithm's settings are read where JAX is not
    import jax


def terminal_rewards(seq_reward: jax.Array, mask: jax.Array) -> jax.Array:
    """The sequence reward on the last masked token of each row, 0 elsewhere.

    ``seq_reward`` is [B, L] (constant on a row's mask) or [B]. With holes in
    the mask (a multi-turn episode) only the row's last model token gets it,
    not the last token of each turn.
    """
    import jax.numpy as jnp

    if seq_reward.ndim == 1:
        seq_reward = seq_reward[:, None]
    masked_after = jnp.flip(jnp.cumsum(jnp.flip(mask, -1), axis=-1), -1) - mask  # [B, L]
    is_last = mask * (masked_after == 0)
    return seq_reward * is_last


def gae(
    rewards: jax.Array,  # [B, L]
    values: jax.Array,  # [B, L]
    mask: jax.Array,  # [B, L]
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation along each row; returns (advantages, returns).

    .. math::

       \\delta_t = r_t + \\gamma V_{t+1} - V_t, \\qquad
       A_t = \\delta_t + \\gamma\\lambda A_{t+1}, \\qquad R_t = A_t + V_t

    where :math:`t+1` is the next position on the mask (holes, a multi-turn
    episode's observations, are skipped: their values and rewards never
    enter), and :math:`V`, :math:`A` after the last masked token of a row
    equal 0. Off the mask both outputs are 0. Computed with a reverse
    ``lax.scan`` whose carry (the next model token's A and V) passes through
    the holes unchanged.

    Reference: Schulman et al., 2015, GAE, https://arxiv.org/abs/1506.02438 (eq. 16).
    """
    import jax
    import jax.numpy as jnp

    def step(carry, xs):
        adv_next, value_next = carry
        r, v, m = xs
        adv = r + gamma * value_next - v + gamma * lam * adv_next
        on = m > 0
        return (jnp.where(on, adv, adv_next), jnp.where(on, v, value_next)), adv * m

    zeros = jnp.zeros_like(rewards[:, 0])
    _, adv = jax.lax.scan(step, (zeros, zeros), (rewards.T, values.T, mask.T), reverse=True)
    adv = adv.T * mask
    return adv, (adv + values) * mask


def whiten(x: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
    """:math:`(x - \\mu) / \\sqrt{\\sigma^2 + \\epsilon}` with μ, σ over every masked token of the batch.

    REINFORCE++'s global-batch normalisation (and PPO's advantage whitening).
    A constant input becomes all zeros. Reference: Hu, 2025, REINFORCE++,
    https://arxiv.org/abs/2501.03262 (eq. 9).
    """
    import jax
    import jax.numpy as jnp

    mean = masked_mean(x, mask)
    var = masked_mean(jnp.square(x - mean), mask)
    return (x - mean) * jax.lax.rsqrt(var + eps) * mask


@dataclasses.dataclass(frozen=True)
class Returns:
    """Per-token advantages from a terminal reward: KL shaping, then GAE, then whitening.

    .. math::

       r_t = R\\,[t = \\mathrm{last}] - \\beta\\,(\\log\\pi_{old} - \\log\\pi_{ref})_t,
       \\qquad (A, R) = \\mathrm{GAE}_{\\gamma,\\lambda}(r, V)

    with V the critic's values, or 0 for an algorithm without one (then,
    with γ = λ = 1, :math:`A_t = \\sum_{s \\ge t} r_s`, REINFORCE++'s return).
    The KL term uses the k1 estimator on the tokens as the papers do, with
    :math:`\\pi_{old}` the trainer's own logprobs at the start of the step.

    Args:
      gamma: discount γ.
      lam: GAE's λ.
      kl_beta: β of the per-token KL penalty in the reward (0 = none; > 0 needs
        a reference policy).
      whiten: normalise the advantages over every token of the batch.

    References:
      Schulman et al., 2015, GAE, https://arxiv.org/abs/1506.02438
      Ouyang et al., 2022, InstructGPT, https://arxiv.org/abs/2203.02155 (KL in the reward)
      Hu, 2025, REINFORCE++, https://arxiv.org/abs/2501.03262 (eq. 7-9)
    """

    gamma: float = 1.0
    lam: float = 1.0
    kl_beta: float = 0.0
    whiten: bool = False

    def __post_init__(self) -> None:
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lam <= 1.0 and self.kl_beta >= 0.0):
            raise ValueError(
                f"returns: need 0 <= gamma, lam <= 1 and kl_beta >= 0, got gamma={self.gamma}, "
                f"lam={self.lam}, kl_beta={self.kl_beta}"
            )

    @property
    def needs_reference(self) -> bool:
        return self.kl_beta > 0

    def __call__(
        self, batch: dict[str, jax.Array], mask: jax.Array, values: jax.Array | None
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """Returns (advantages, returns, metrics), each array [B, L] and 0 off the mask."""
        import jax.numpy as jnp

        rewards = terminal_rewards(batch["advantages"], mask)
        if self.needs_reference:
            rewards = rewards - self.kl_beta * self._k1(batch, mask)
        v = jnp.zeros_like(rewards) if values is None else values
        adv, returns = gae(rewards, v, mask, self.gamma, self.lam)
        if self.whiten:
            adv = whiten(adv, mask)
        return adv, returns, self.metrics(batch, mask)

    def metrics(self, batch: dict[str, jax.Array], mask: jax.Array) -> dict[str, jax.Array]:
        """``reward_kl`` (the mean k1 term over ``mask``) with a reference, else nothing;
        without the GAE scan, for a minibatch whose returns were computed for its batch."""
        return (
            {"reward_kl": masked_mean(self._k1(batch, mask), mask)} if self.needs_reference else {}
        )

    @staticmethod
    def _k1(batch: dict[str, jax.Array], mask: jax.Array) -> jax.Array:
        return (batch["train_logprobs"] - batch["ref_logprobs"]) * mask
