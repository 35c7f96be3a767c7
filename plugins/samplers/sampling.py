"""Choosing the next token: temperature, top-k, top-p, and the logprob that travels with it.

Pure functions on a batch of logits [B, V]. Which distribution a token's
recorded logprob is under is the sampler's ``recorded_logprobs`` setting
(:data:`RECORDED`):

- ``"truncated"`` (the default): the distribution the token was actually drawn
  from, softmax(logits / T) restricted to the kept set (top-k, top-p) and
  renormalised. Beside it travels the set's **floor**: the log-probability,
  under the full tempered distribution, of the least likely token kept (-inf
  where nothing was cut). The kept set is exactly the tokens whose full
  logprob is at least the floor, so the trainer rebuilds it from its own
  logits and the floor alone (:func:`rlax.core.models.logprobs.logprobs_and_entropy`),
  and its ratio compares like with like: at the sampler's weights the two
  logprobs agree up to float rounding.
- ``"full"``: the full tempered distribution's logprob (no floor travels), the
  behaviour before truncation was recorded. With top-k / top-p on, the token
  was drawn from another distribution than the one recorded: importance
  ratios and the alignment corrections then correct toward the wrong
  behaviour policy (peers measured a mean ratio near 0.9 at top_p 0.8).

Without top-k and top-p the two are the same numbers (the floor is -inf).

Greedy decoding is its own method, ``"greedy"``: the most likely token of
each row (argmax of the logits, the first on a tie; top-k and top-p change
nothing), with its logprob under softmax(logits / T) like every other. A
temperature of 0 is refused rather than read as greedy: the trainer recomputes
the logprobs at the sampler's temperature, and at 0 there is no distribution
to recompute.

Two exact ways to draw from softmax(allowed):

- ``"gumbel"``: argmax of logits plus Gumbel noise (``jax.random.categorical``):
  one random number per vocabulary entry. Cheap for a small vocabulary.
- ``"inverse_cdf"``: two uniforms per row. The vocabulary is cut into blocks;
  a block is drawn by inverting the cumulative distribution of the block
  masses, then a token within it the same way. Drawing 49k random numbers per
  row per step costs far more than the model on a CPU (threefry bits), and
  two short cumulative sums beat one vocabulary-long scan.

References:
  Fan et al., 2018, https://arxiv.org/abs/1805.04833 (top-k sampling)
  Holtzman et al., 2019, https://arxiv.org/abs/1904.09751 (nucleus / top-p sampling)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the choices are read where JAX is not (a sampler's settings)
    import jax


# How a token is chosen: the two exact draws, and the most likely token.
METHODS = ("gumbel", "inverse_cdf", "greedy")
# Which distribution the recorded logprobs are under (see the module doc).
RECORDED = ("truncated", "full")


def restrict_top_k(scaled: jax.Array, k: int) -> jax.Array:
    """Logits outside the k largest of each row become -inf (ties at the k-th value stay)."""
    import jax
    import jax.numpy as jnp

    kth = jax.lax.top_k(scaled, k)[0][:, -1:]
    return jnp.where(scaled < kth, -jnp.inf, scaled)


def restrict_top_p(scaled: jax.Array, p: float) -> jax.Array:
    """Keeps the smallest set of most likely tokens whose probability reaches ``p``.

    A token is kept when the probability mass of the tokens strictly more
    likely than it is below ``p`` (so the most likely token is always kept).
    """
    import jax
    import jax.numpy as jnp

    order = jnp.argsort(-scaled, axis=-1)
    sorted_logits = jnp.take_along_axis(scaled, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = mass_before < p
    # The smallest kept logit is the threshold; ties with it stay in.
    threshold = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(scaled < threshold, -jnp.inf, scaled)


def _last_positive(x: jax.Array) -> jax.Array:
    """Index of the last entry > 0 along the last axis (0 if none), [B]."""
    import jax.numpy as jnp

    idx = jnp.arange(x.shape[-1])
    return jnp.max(jnp.where(x > 0, idx, 0), axis=-1)


def _invert(weights: jax.Array, u: jax.Array) -> jax.Array:
    """Index i with cumsum(w)[i-1] <= u * sum(w) < cumsum(w)[i], never a zero-weight entry."""
    import jax.numpy as jnp

    cdf = jnp.cumsum(weights, axis=-1)
    idx = jnp.sum(cdf <= u[:, None] * cdf[:, -1:], axis=-1)
    return jnp.minimum(idx, _last_positive(weights))


def _inverse_cdf_from_weights(key: jax.Array, weights: jax.Array, block: int) -> jax.Array:
    import jax
    import jax.numpy as jnp

    b, v = weights.shape
    blocks = jnp.pad(weights, ((0, 0), (0, -v % block))).reshape(b, -1, block)
    u = jax.random.uniform(key, (2, b))
    which = _invert(blocks.sum(-1), u[0])  # [B]
    inside = jnp.take_along_axis(blocks, which[:, None, None], axis=1)[:, 0]  # [B, block]
    return which * block + _invert(inside, u[1])


def inverse_cdf_sample(key: jax.Array, logits: jax.Array, block: int = 256) -> jax.Array:
    """One exact draw per row from softmax(logits) [B, V] (-inf entries are never drawn)."""
    import jax.numpy as jnp

    weights = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
    return _inverse_cdf_from_weights(key, weights, block)


def kept_floor(
    allowed: jax.Array,  # [B, V] the restricted scaled logits (-inf: cut)
    logp: jax.Array,  # [B, V] log softmax of the unrestricted scaled logits
) -> jax.Array:
    """The full logprob of the least likely kept token of each row, [B] (-inf: none cut)."""
    import jax.numpy as jnp

    cut = jnp.any(allowed == -jnp.inf, axis=-1)
    floor = jnp.min(jnp.where(allowed > -jnp.inf, logp, jnp.inf), axis=-1)
    return jnp.where(cut, floor, -jnp.inf)


def sample_token(
    logits: jax.Array,  # [B, V] float32
    key: jax.Array,
    temperature: jax.Array,  # scalar
    *,
    top_k: int = 0,
    top_p: float = 1.0,
    method: str = "gumbel",
    recorded: str = "truncated",
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Draws one token per row: (tokens [B], logprobs [B], kept [B]).

    The logprobs are under the distribution ``recorded`` names (:data:`RECORDED`).
    ``kept`` describes the kept sets: under ``"truncated"`` their floors
    (:func:`kept_floor`, -inf where nothing was cut); under ``"full"`` the log of
    their mass under the full distribution (0 where nothing was cut), so that
    logprob - kept is the logprob under the distribution the token was drawn
    from (what the trainer's mismatch metrics compare with). ``method="greedy"`` takes
    the most likely token of each row instead of drawing one (logprob under
    softmax(logits / T), floor -inf).
    """
    import jax
    import jax.numpy as jnp

    if method not in METHODS:
        raise ValueError(f"sampling method must be one of {', '.join(METHODS)}, got {method!r}")
    if recorded not in RECORDED:
        raise ValueError(
            f"recorded logprobs must be one of {', '.join(RECORDED)}, got {recorded!r}"
        )
    scaled = logits / temperature
    none = jnp.full(logits.shape[:1], -jnp.inf, jnp.float32)
    if top_k >= logits.shape[-1]:  # keeps the whole vocabulary: no cut
        top_k = 0
    if method == "greedy":
        tok = jnp.argmax(logits, axis=-1)
        logp = jax.nn.log_softmax(scaled, axis=-1)
        return tok, jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0], none
    restricted = bool(top_k) or top_p < 1.0
    if method == "inverse_cdf" and not restricted:
        # One pass of exp serves both the draw and the logprob's normaliser.
        top = jnp.max(scaled, axis=-1, keepdims=True)
        weights = jnp.exp(scaled - top)
        tok = _inverse_cdf_from_weights(key, weights, 256)
        lse = top[:, 0] + jnp.log(jnp.sum(weights, axis=-1))
        return tok, jnp.take_along_axis(scaled, tok[:, None], axis=-1)[:, 0] - lse, none
    allowed = scaled
    if top_k:
        allowed = restrict_top_k(allowed, top_k)
    if top_p < 1.0:
        allowed = restrict_top_p(allowed, top_p)
    if method == "gumbel":
        tok = jax.random.categorical(key, allowed, axis=-1)
    else:
        tok = inverse_cdf_sample(key, allowed)
    logp = jax.nn.log_softmax(scaled, axis=-1)
    picked = jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]
    if not restricted:
        return tok, picked, none if recorded == "truncated" else jnp.zeros_like(picked)
    # The kept set's mass from the full logprobs, as the trainer computes it (kept_logprobs).
    kept_mass = jax.nn.logsumexp(jnp.where(allowed > -jnp.inf, logp, -jnp.inf), axis=-1)
    if recorded == "full":
        return tok, picked, kept_mass
    return tok, picked - kept_mass, kept_floor(allowed, logp)
