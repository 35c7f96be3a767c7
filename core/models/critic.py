"""What every critic shares, and the policy's forward pass with a critic's values.

A critic is a plugin component (``rlax_register_critics``; the contract
:class:`rlax.core.contracts.Critic`): it builds its module for the policy and
computes values from the policy's hidden states, tokens and attention mask.
:func:`forward_with_values` asks it, whichever it is. The built-ins
(``plugins/critics/``) are made of the modules here:

- ``critics.head``: a :class:`ValueHead`, one linear layer D -> 1 on the
  policy's final hidden states. One forward pass gives both logprobs and
  values, and the value loss also shapes the policy's features (PPO's original
  shared-parameter setting).
- ``critics.separate``: a :class:`ValueModel`, a second transformer
  initialised as a copy of the policy, with its own value head (the usual
  choice for LLMs in verl and OpenRLHF).

Either way the value of position t is read from the hidden state that
predicts token t+1, so ``values[:, t]`` lines up with ``logprobs[:, t]`` and
the loss mask: it estimates the return of the prefix before that token.
The heads start at zero (V = 0 everywhere), so the critic's first gradients
cannot disturb the policy.

Shapes: the legend of :mod:`rlax.core.types`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from rlax.core.models.logprobs import DEFAULT_CHUNK_TOKENS, chunked_token_logprobs
from rlax.core.models.transformer import (
    Transformer,
    causal_mask,
    positions_from_mask,
)

if TYPE_CHECKING:
    from rlax.core.critic import Critic


def hidden_states(
    model: Transformer,
    tokens: jax.Array,  # [B, T]
    attention_mask: jax.Array,  # [B, T]
) -> jax.Array:
    """The final-normed hidden states [B, T, D] of a full (cache-free) forward pass.

    The same computation as ``Transformer.__call__`` up to the output head.
    """
    x, _ = model.hidden_states(
        tokens, positions_from_mask(attention_mask), causal_mask(attention_mask)
    )
    return x


def logits_from_hidden(model: Transformer, hidden: jax.Array) -> jax.Array:
    """The output head of ``model`` applied to ``hidden``: logits [B, T, V], float32."""
    logits = model.embed.attend(hidden) if model.cfg.tie_embeddings else model.head(hidden)
    return logits.astype(jnp.float32)


class ValueHead(nnx.Module):
    """Hidden states [B, T, D] -> values [B, T], initialised to output 0."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs):
        zeros = nnx.initializers.zeros_init()
        self.proj = nnx.Linear(dim, 1, kernel_init=zeros, bias_init=zeros, rngs=rngs)

    def __call__(self, hidden: jax.Array) -> jax.Array:
        return self.proj(hidden)[..., 0].astype(jnp.float32)


class ValueModel(nnx.Module):
    """A separate critic: its own transformer trunk and a value head."""

    def __init__(self, trunk: Transformer, *, rngs: nnx.Rngs):
        self.trunk = trunk
        self.head = ValueHead(trunk.cfg.embed_dim, rngs=rngs)

    def __call__(self, tokens: jax.Array, attention_mask: jax.Array) -> jax.Array:
        return self.head(hidden_states(self.trunk, tokens, attention_mask))


def forward_with_values(
    policy: Transformer,
    critic: Critic,
    module: nnx.Module,
    tokens: jax.Array,  # [B, T]
    attention_mask: jax.Array,  # [B, T]
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    floor: jax.Array | None = None,  # [B, L]: the sampler's kept sets
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-token logprobs, entropies and values, each [B, L].

    ``critic`` computes the values with its ``module`` (built by
    ``critic.build``) from the policy's hidden states of this pass. The
    logprobs come from the head chunked over tokens
    (:func:`rlax.core.models.logprobs.chunked_token_logprobs`): no [B, T, V] logits.
    """
    hidden = hidden_states(policy, tokens, attention_mask)
    logp, entropy = chunked_token_logprobs(
        policy.logits, hidden, tokens, temperature, chunk_tokens, floor
    )
    values = critic.values(module, policy, hidden, tokens, attention_mask)
    return logp, entropy, values[:, :-1]
