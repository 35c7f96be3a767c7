"""The critic's loss: PPO's clipped value regression (an *extra term* of the objective)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rlax.core.configurables import configurables
from rlax.core.contracts import Critic
from rlax.plugins.algorithms.aggregation import masked_mean
from rlax.plugins.critics import head, separate

if TYPE_CHECKING:  # annotations only: the algorithm's settings are read where JAX is not
    import jax

HEAD = head.HeadCritic()  # the default critic: a value head on the policy's trunk


def critic_names() -> list[str]:
    """The critics gin builds (the plugin manager's loaded last), or the built-ins if none was."""
    found = configurables("critics")
    if not found:
        found = {**head.rlax_register_critics(), **separate.rlax_register_critics()}
    return sorted(found)


@dataclasses.dataclass(frozen=True)
class ValueLoss:
    """Clipped value loss, token-mean over the mask, weighted by ``coef``.

    .. math::

       L_V = \\tfrac12\\,\\mathrm{mean}_t \\max\\big((V_t - R_t)^2,\\
             (V^{old}_t + \\mathrm{clip}(V_t - V^{old}_t, -\\varepsilon_V, \\varepsilon_V) - R_t)^2\\big)

    :math:`V^{old}` are the critic's values at the start of the step and
    :math:`R` the GAE returns computed from them.

    Args:
      clip_eps: ε_V; the value may move at most this far from the old value
        before the regression stops pulling it.
      coef: weight of :math:`L_V` in the total loss (c_1 in the PPO paper).
      model: the critic the trainer builds and trains (a
        :class:`~rlax.core.contracts.Critic`; in gin ``@critics.head()``, a value
        head on the policy's own trunk, or ``@critics.separate()``, a value model
        initialised from the policy, with its own trunk).

    References:
      Schulman et al., 2017, PPO, https://arxiv.org/abs/1707.06347 (eq. 9)
      Huang et al., 2022, "The 37 implementation details of PPO",
      https://iclr-blog-track.github.io/2022/03/25/ppo-implementation-details/ (value clipping)
    """

    clip_eps: float = 0.2
    coef: float = 0.5
    model: Critic = HEAD

    def __post_init__(self) -> None:
        if isinstance(self.model, str):  # a name is not a critic: gin builds one by reference
            raise ValueError(  # noqa: TRY004 -- a setting: settings_of names its algorithm
                f"value model {self.model!r} is a name, not a critic: give the critic, in gin "
                f"@critics.NAME(); valid critics: {', '.join(critic_names())}"
            )
        if self.clip_eps <= 0 or self.coef <= 0:
            raise ValueError(
                f"value loss: need clip_eps > 0 and coef > 0, got {self.clip_eps}, {self.coef}"
            )

    def __call__(
        self,
        values: jax.Array,  # [B, L]
        old_values: jax.Array,  # [B, L]
        returns: jax.Array,  # [B, L]
        mask: jax.Array,  # [B, L]
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Returns (coef × L_V, metrics)."""
        import jax.numpy as jnp

        clipped = old_values + jnp.clip(values - old_values, -self.clip_eps, self.clip_eps)
        err = jnp.square(values - returns)
        err_clipped = jnp.square(clipped - returns)
        loss = 0.5 * masked_mean(jnp.maximum(err, err_clipped), mask)
        metrics = {
            "value_loss": loss,
            "value_clip_fraction": masked_mean((err_clipped > err).astype(jnp.float32), mask),
            "value_mean": masked_mean(values, mask),
        }
        return self.coef * loss, metrics
