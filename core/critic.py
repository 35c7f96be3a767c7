"""The critic contract: the value model an algorithm with a critic trains beside the policy.

A critic is a plugin component (``rlax_register_critics``, gin module
``critics``): ``critics.head`` (a value head on the policy's trunk) and
``critics.separate`` (a value model with a trunk of its own) are the
built-ins (``plugins/critics/``), made of the modules of
:mod:`rlax.core.models.critic`. An algorithm that ``needs_critic`` gives one
as its ``value_model``; the trainer builds its module, trains its parameters
and asks it for values, never which critic it is. Re-exported by
:mod:`rlax.core.contracts`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import jax
    from flax import nnx

    from rlax.core.models.transformer import Transformer


class Critic(Protocol):
    """A critic's architecture: what the trainer (:mod:`rlax.core.trainer.step`) builds
    and asks for values when the algorithm ``needs_critic``.

    The component is the architecture and its settings; the module it builds
    holds the parameters, which the trainer trains with the policy's optimiser
    on the algorithm's loss and checkpoints with the policy (``TrainState.critic``:
    a resumed run restores them into the same tree). The trainer never asks which
    critic it runs.
    """

    def build(self, policy: Transformer, rngs: nnx.Rngs) -> nnx.Module:
        """A fresh critic module for ``policy``, once, when the trainer is built.

        Its parameter tree is what checkpoints hold, so it must not change
        between versions of the critic. Values that start at 0 (a zero-initialised
        head, as the built-ins have) keep the critic's first gradients from
        disturbing a policy that shares its features.
        """

    def values(
        self,
        module: nnx.Module,
        policy: Transformer,
        hidden: jax.Array,
        tokens: jax.Array,
        attention_mask: jax.Array,
    ) -> jax.Array:
        """Float32 values [B, T] of every position, inside the jitted step, with gradient.

        ``module`` is what ``build`` made, with the critic's current parameters;
        ``policy`` the policy being trained and ``hidden`` its final hidden
        states [B, T, D] of this very forward pass (a head on them shares the
        policy's pass and features); ``tokens`` and ``attention_mask`` [B, T] are
        the batch's (a critic with its own trunk runs it on them). The value at
        t is read where token t+1 is predicted: the trainer keeps ``values[:, :-1]``,
        aligned with the logprobs [B, L]. Only ``jax`` operations: it is traced.
        """
