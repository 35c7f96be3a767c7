"""The static sampler's device programs: the prompt's prefill and the decode loop.

:class:`~rlax.plugins.samplers.jax_sampler.JaxSampler` jits :func:`generate` once per
model (its architecture, budget and sampling settings static) and calls it per batch;
a sampler's settings are read where no JAX is (the supervisor, the parameter server),
its programs only where it samples.

Shapes: the legend of :mod:`rlax.core.types` (B rows, U distinct prompts, P prompt
bucket, C = ``max_new_tokens``, S = P + C cache slots, V vocabulary; R routed layers and
k experts per token of a mixture-of-experts model).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rlax.core.models.moe import RoutesOut
from rlax.core.models.routing_replay import ROUTES_DTYPE
from rlax.core.models.tokenizer import PAD
from rlax.core.models.transformer import KVCache, Transformer, positions_from_mask
from rlax.plugins.samplers.sampling import sample_token

__all__ = ["generate"]


def _prefill(
    model: Transformer,
    tokens: jax.Array,  # [B, P] left-padded
    positions: jax.Array,  # [B, P]
    key_valid: jax.Array,  # [B, S] bool, S = P + max_new_tokens
    cache: KVCache,  # S slots, contents ignored: cleared here
    last_logits_only: bool,
) -> tuple[jax.Array, KVCache, jax.Array]:
    """The prompt's pass: logits at its last position [B, V], the cache of S slots and the
    prompt tokens' experts [B, P, R, k] (:func:`_route_ids`).

    ``last_logits_only`` applies the head at the last position alone (a real
    vocabulary); otherwise at every position, the toy models' path kept
    exactly as it was.
    """
    p, s = tokens.shape[1], key_valid.shape[1]
    prefill_mask = (jnp.arange(s)[None, :] <= jnp.arange(p)[:, None])[None] & key_valid[:, None, :]
    cache = jax.tree.map(jnp.zeros_like, cache)  # in place: the buffer is donated
    hidden, written, routed = model.routed_hidden_states(tokens, positions, prefill_mask, cache, 0)
    assert written is not None  # a call given a cache returns the written one
    routes = _route_ids(model, routed, tokens.shape)
    if last_logits_only:
        return model.logits(hidden[:, -1]), written, routes
    return model.logits(hidden)[:, -1], written, routes


def _route_ids(model: Transformer, routed: RoutesOut | None, shape: tuple[int, ...]) -> jax.Array:
    """Each token's experts, int16 [B, T, R, k] (R = 0 for a dense model): what routing
    replay records (:mod:`rlax.core.models.routing_replay`)."""
    if routed is None:
        return jnp.zeros((*shape, 0, 1), ROUTES_DTYPE)
    return routed.ids.astype(ROUTES_DTYPE)


def _prefill_rows(
    model: Transformer,
    cache: KVCache,  # [B, ..., S] (donated)
    tokens: jax.Array,  # [U, P]
    mask: jax.Array,  # [U, P]
    rows_of: jax.Array,  # [B]
    max_new_tokens: int,
    last_logits_only: bool,
) -> tuple[jax.Array, KVCache, jax.Array, jax.Array, jax.Array]:
    """Each row's prompt prefilled: last logits [B, V], the cache, key validity [B, S],
    positions [B, P] and the prompt's experts [B, P, R, k]. Each distinct prompt is prefilled once; with fewer prompts than rows
    (U < B) its keys and values are then copied into the rows of its samples, else the
    rows are prefilled in place (``rows_of`` is then the identity)."""
    u, p = tokens.shape
    prompt_valid = jnp.zeros((u, p + max_new_tokens), bool).at[:, :p].set(mask)
    positions = positions_from_mask(mask)
    if u == rows_of.shape[0]:
        logits, cache, routes = _prefill(
            model, tokens, positions, prompt_valid, cache, last_logits_only
        )
        return logits, cache, prompt_valid, positions, routes
    own = jax.tree.map(lambda c: jnp.zeros((u, *c.shape[1:]), c.dtype), cache)
    logits, own, routes = _prefill(model, tokens, positions, prompt_valid, own, last_logits_only)
    cache = jax.tree.map(lambda rows, prompt: rows.at[:].set(prompt[rows_of]), cache, own)
    return logits[rows_of], cache, prompt_valid[rows_of], positions[rows_of], routes[rows_of]


def generate(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    cache: KVCache,  # [B, ..., S = P + max_new_tokens] (donated)
    tokens: jax.Array,  # [U, P] the distinct prompts, left-padded
    mask: jax.Array,  # [U, P] bool
    rows_of: jax.Array,  # [B] int32: each row's prompt (its index in ``tokens``)
    key: jax.Array,
    temperature: jax.Array,  # scalar
    *,
    max_new_tokens: int,
    stop_ids: tuple[int, ...],
    top_k: int,
    top_p: float = 1.0,
    method: str = "gumbel",
    last_logits_only: bool = False,
    recorded: str = "full",
) -> tuple[jax.Array, jax.Array, jax.Array, KVCache, tuple[jax.Array, jax.Array]]:
    """Generated tokens [B, C] (PAD after the stop token), their logprobs [B, C], the kept
    sets' floors [B, C] (-inf: nothing cut; :mod:`.sampling`), the cache, and the experts
    of the prompt's tokens [B, P, R, k] and of the generated ones [B, C, R, k] (-1 after
    the stop; R = 0 for a dense model)."""
    model: Transformer = nnx.merge(graphdef, state)
    p, b = tokens.shape[1], rows_of.shape[0]
    slots = jnp.arange(p + max_new_tokens)
    stops = jnp.asarray(stop_ids, jnp.int32)
    last_logits, cache, key_valid, positions, prompt_routes = _prefill_rows(
        model, cache, tokens, mask, rows_of, max_new_tokens, last_logits_only
    )

    def cond(carry):
        i, done = carry[0], carry[1]
        return (i < max_new_tokens) & ~jnp.all(done)

    def body(carry):
        i, done, last_logits, pos, cache, key_valid, out_tok, out_logp, out_floor, routes, key = (
            carry
        )
        key, sub = jax.random.split(key)
        tok, logp, floor = sample_token(
            last_logits,
            sub,
            temperature,
            top_k=top_k,
            top_p=top_p,
            method=method,
            recorded=recorded,
        )
        tok = jnp.where(done, PAD, tok)
        out_tok = out_tok.at[:, i].set(tok)
        out_logp = out_logp.at[:, i].set(jnp.where(done, 0.0, logp))
        out_floor = out_floor.at[:, i].set(jnp.where(done, -jnp.inf, floor))
        key_valid = key_valid.at[:, p + i].set(~done)
        step_mask = ((slots <= p + i)[None, :] & key_valid)[:, None, :]
        hidden, cache, routed = model.routed_hidden_states(
            tok[:, None], pos[:, None], step_mask, cache, p + i
        )
        logits = model.logits(hidden)
        step_routes = _route_ids(model, routed, (b, 1))[:, 0]  # the fed token's experts
        routes = routes.at[:, i].set(jnp.where(done[:, None, None], -1, step_routes))
        if stop_ids:
            done = done | jnp.any(tok[:, None] == stops[None, :], axis=-1)
        out = (out_tok, out_logp, out_floor, routes)
        return i + 1, done, logits[:, 0], pos + 1, cache, key_valid, *out, key

    carry = (
        jnp.int32(0),
        jnp.zeros((b,), bool),
        last_logits,
        positions[:, -1] + 1,
        cache,
        key_valid,
        jnp.full((b, max_new_tokens), PAD, jnp.int32),
        jnp.zeros((b, max_new_tokens), jnp.float32),
        jnp.full((b, max_new_tokens), -jnp.inf, jnp.float32),
        jnp.full((b, max_new_tokens, *prompt_routes.shape[2:]), -1, ROUTES_DTYPE),
        key,
    )
    carry = jax.lax.while_loop(cond, body, carry)
    return carry[6], carry[7], carry[8], carry[4], (prompt_routes, carry[9])
