"""Sampled-token logprobs and entropies without the whole batch's logits.

The policy-gradient step needs, per position, the log-probability of the
token that was sampled next and the entropy of the distribution: two numbers
out of a vocabulary-sized row. Computing them from ``model.logits(hidden)``
materialises float32 logits [B, T, V], their softmax and, in the backward
pass, their gradient: for SmolLM2 (V = 49152) at 64 rows of 300 tokens that
is 3.8 GB per copy, the bulk of the trainer's peak.

:func:`chunked_token_logprobs` splits the positions into chunks of
``chunk_tokens`` tokens (rows x positions), runs the output head, softmax,
pick and entropy for one chunk at a time inside a ``lax.scan`` whose body is
rematerialised (``jax.checkpoint``): the forward pass keeps no logits, and the
backward pass recomputes one chunk's logits, back-propagates them into the
hidden states and the head's weights (summed over chunks by the scan's
transpose) and drops them. Peak logits memory is one chunk's, [B, c, V] with
B x c <= ``chunk_tokens``; the values and gradients are the unchunked ones up to
float rounding.

Chunks run along positions, never rows, so a batch split by rows over
(data, fsdp) stays split inside every chunk and no data moves between devices.

Shapes: the legend of :mod:`rlax.core.types` (B batch, T tokens, D embed dim,
V vocabulary; n chunks of c positions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the chunk setting's default is read where JAX is not (the supervisor)
    import jax

# Tokens (rows x positions) per chunk: 1024 x 49152 float32 logits are 0.2 GB.
DEFAULT_CHUNK_TOKENS = 1024


# A token whose full logprob is within this of a kept set's floor counts as kept: the
# trainer's float32 log-softmax of the same logits differs from the sampler's by rounding.
FLOOR_TOLERANCE = 1e-5


def kept_logprobs(
    logp: jax.Array,  # [..., V] full log-probabilities
    targets: jax.Array,  # [...]
    floor: jax.Array,  # [...] the kept set's floor (-inf: everything kept)
) -> jax.Array:
    """log p(target) under ``logp`` truncated to the tokens at or above ``floor`` and renormalised.

    The truncation the sampler drew from (:mod:`rlax.plugins.samplers.sampling`):
    the kept set is every token whose full logprob is at least the floor (less
    :data:`FLOOR_TOLERANCE`), and always the target itself, so a policy that moved
    since sampling still gives it a finite logprob. Differentiable: the set's
    mass depends on ``logp``.
    """
    import jax
    import jax.numpy as jnp

    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    vocab = jnp.arange(logp.shape[-1])
    keep = (logp >= (floor - FLOOR_TOLERANCE)[..., None]) | (vocab == targets[..., None])
    return picked - jax.nn.logsumexp(jnp.where(keep, logp, -jnp.inf), axis=-1)


def logprobs_and_entropy(
    logits: jax.Array,  # [..., V]
    targets: jax.Array,  # [...]
    temperature: float = 1.0,
    floor: jax.Array | None = None,  # [...]
) -> tuple[jax.Array, jax.Array]:
    """log softmax(logits / temperature)[target] and the entropy, both [...], float32.

    With ``floor`` (the sampler's kept sets, :func:`kept_logprobs`) the logprob is
    under the truncated distribution; the entropy is the full distribution's either way.
    """
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    if floor is None:
        picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    else:
        picked = kept_logprobs(logp, targets, floor)
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return picked, entropy


def chunk_positions(rows: int, positions: int, chunk_tokens: int) -> int:
    """Positions per chunk: as many as fit ``chunk_tokens`` over ``rows`` rows, at least 1."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    return max(1, min(positions, chunk_tokens // max(rows, 1)))


def chunked_token_logprobs(
    head: Callable[[jax.Array], jax.Array],
    hidden: jax.Array,  # [B, T, D]
    tokens: jax.Array,  # [B, T]
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    floor: jax.Array | None = None,  # [B, T-1]
) -> tuple[jax.Array, jax.Array]:
    """Logprob of ``tokens[:, t+1]`` under ``head(hidden[:, t])`` and the entropy, chunked.

    Args:
      head: hidden states [..., D] -> logits [..., V] (the model's output head).
      hidden: the final-normed hidden states.
      tokens: the sequence; position t predicts token t+1.
      temperature: the logits are divided by it (the sampler's tempered policy).
      chunk_tokens: at most this many tokens' logits exist at once.
      floor: the sampler's kept set at each target position (:func:`kept_logprobs`);
        None: the full distribution.

    Returns:
      logprobs [B, T-1] and entropies [B, T-1], float32, equal (up to
      rounding) to :func:`logprobs_and_entropy` on the full logits.
    """
    import jax
    import jax.numpy as jnp

    rows, length = tokens.shape
    if length < 2:
        empty = jnp.zeros((rows, 0), jnp.float32)
        return empty, empty
    h, targets = hidden[:, :-1], tokens[:, 1:]
    c = chunk_positions(rows, length - 1, chunk_tokens)
    n = -(-(length - 1) // c)
    pad = n * c - (length - 1)
    if pad:
        h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
        if floor is not None:
            floor = jnp.pad(floor, ((0, 0), (0, pad)), constant_values=-jnp.inf)
    # [B, n*c, ...] -> [n, B, c, ...]: the scan walks chunks, rows stay where they are.
    h = jnp.moveaxis(h.reshape(rows, n, c, h.shape[-1]), 1, 0)
    targets = jnp.moveaxis(targets.reshape(rows, n, c), 1, 0)
    xs: tuple[jax.Array, ...] = (h, targets)
    if floor is not None:
        xs += (jnp.moveaxis(floor.astype(jnp.float32).reshape(rows, n, c), 1, 0),)

    @jax.checkpoint
    def one_chunk(h_c, t_c, f_c=None):
        return logprobs_and_entropy(head(h_c), t_c, temperature, f_c)

    def body(carry, xs):
        return carry, one_chunk(*xs)

    _, (logp, entropy) = jax.lax.scan(body, None, xs)

    def unchunk(x):  # [n, B, c] -> [B, T-1]
        return jnp.moveaxis(x, 0, 1).reshape(rows, n * c)[:, : length - 1]

    return unchunk(logp), unchunk(entropy)
