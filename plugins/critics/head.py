"""``critics.head``: a value head on the policy's own final hidden states.

One linear layer D -> 1 (:class:`~rlax.core.models.critic.ValueHead`,
zero-initialised) reads the hidden states of the policy's forward pass, so
one pass gives logprobs and values and the value loss also shapes the policy's
features: PPO's original shared-parameter setting. Its parameters are
``proj/kernel`` [D, 1] and ``proj/bias`` [1].

References:
  Schulman et al., 2017, PPO, https://arxiv.org/abs/1707.06347 (section 5, eq. 9: shared parameters)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rlax.core import hookimpl

if TYPE_CHECKING:  # the critic is built where the trainer runs; its settings are read anywhere
    import jax
    from flax import nnx

    from rlax.core.models.critic import ValueHead
    from rlax.core.models.transformer import Transformer


@dataclasses.dataclass(frozen=True)
class HeadCritic:
    """A value head on the policy's trunk (module doc)."""

    def build(self, policy: Transformer, rngs: nnx.Rngs) -> ValueHead:
        from rlax.core.models.critic import ValueHead

        return ValueHead(policy.cfg.embed_dim, rngs=rngs)

    def values(
        self,
        module: nnx.Module,
        policy: Transformer,
        hidden: jax.Array,  # [B, T, D]
        tokens: jax.Array,  # [B, T]
        attention_mask: jax.Array,  # [B, T]
    ) -> jax.Array:
        """Values [B, T]: the head on the policy's hidden states."""
        from rlax.core.models.critic import ValueHead

        assert isinstance(module, ValueHead), f"not what build made: {type(module).__name__}"
        return module(hidden)


@hookimpl
def rlax_register_critics():
    return {"head": HeadCritic}
