"""Choosing the next token: temperature, top-k, top-p, and the logprob that travels with it.

Pure functions on a batch of logits [B, V]. The logprob returned for a token
is always under the *tempered full* distribution, softmax(logits / T): that is
what the trainer recomputes from the same tokens (``token_logprobs`` with the
same temperature), so sampler and trainer agree up to floating point, and the
remaining train/inference mismatch is measured by the trainer. Top-k and top-p
only restrict which tokens may be drawn.

References:
  Fan et al., 2018, https://arxiv.org/abs/1805.04833 (top-k sampling)
  Holtzman et al., 2019, https://arxiv.org/abs/1904.09751 (nucleus / top-p sampling)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def restrict_top_k(scaled: jax.Array, k: int) -> jax.Array:
    """Logits outside the k largest of each row become -inf (ties at the k-th value stay)."""
    kth = jax.lax.top_k(scaled, k)[0][:, -1:]
    return jnp.where(scaled < kth, -jnp.inf, scaled)


def restrict_top_p(scaled: jax.Array, p: float) -> jax.Array:
    """Keeps the smallest set of most likely tokens whose probability reaches ``p``.

    A token is kept when the probability mass of the tokens strictly more
    likely than it is below ``p`` (so the most likely token is always kept).
    """
    order = jnp.argsort(-scaled, axis=-1)
    sorted_logits = jnp.take_along_axis(scaled, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = mass_before < p
    # The smallest kept logit is the threshold; ties with it stay in.
    threshold = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(scaled < threshold, -jnp.inf, scaled)


def sample_token(
    logits: jax.Array,  # [B, V] float32
    key: jax.Array,
    temperature: jax.Array,  # scalar
    *,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row; returns (tokens [B], logprobs [B] under softmax(logits / T))."""
    scaled = logits / temperature
    allowed = scaled
    if top_k:
        allowed = restrict_top_k(allowed, top_k)
    if top_p < 1.0:
        allowed = restrict_top_p(allowed, top_p)
    tok = jax.random.categorical(key, allowed, axis=-1)
    logp = jax.nn.log_softmax(scaled, axis=-1)
    return tok, jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]
