"""``critics.separate``: a value model with its own trunk, initialised as a copy of the policy.

A second transformer, a copy of the policy when the trainer is built, with a
zero-initialised value head (:class:`~rlax.core.models.critic.ValueModel`):
the critic runs its own forward pass on the batch's tokens and never shapes
the policy's features, as verl and OpenRLHF do for LLMs. It costs a second
copy of the weights, their gradients and optimiser state. Its parameters are
``trunk/...`` (the policy's tree) and ``head/proj/kernel``, ``head/proj/bias``.

References:
  Ouyang et al., 2022, InstructGPT, https://arxiv.org/abs/2203.02155 (a value
  function initialised from a model, separate from the policy)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rlax.core import hookimpl

if TYPE_CHECKING:  # the critic is built where the trainer runs; its settings are read anywhere
    import jax
    from flax import nnx

    from rlax.core.models.critic import ValueModel
    from rlax.core.models.transformer import Transformer


@dataclasses.dataclass(frozen=True)
class SeparateCritic:
    """A value model with a trunk of its own (module doc)."""

    def build(self, policy: Transformer, rngs: nnx.Rngs) -> ValueModel:
        from flax import nnx

        from rlax.core.models.critic import ValueModel

        return ValueModel(nnx.clone(policy), rngs=rngs)

    def values(
        self,
        module: nnx.Module,
        policy: Transformer,
        hidden: jax.Array,  # [B, T, D]
        tokens: jax.Array,  # [B, T]
        attention_mask: jax.Array,  # [B, T]
    ) -> jax.Array:
        """Values [B, T]: the value model's own pass on the batch's tokens."""
        from rlax.core.models.critic import ValueModel

        assert isinstance(module, ValueModel), f"not what build made: {type(module).__name__}"
        return module(tokens, attention_mask)


@hookimpl
def rlax_register_critics():
    return {"separate": SeparateCritic}
