"""The slot engine's compiled programs: prefill new rows, place them in slots, decode a chunk.

The engine (:mod:`.engine`) keeps R rows ("slots") on the device, each with
its own KV cache of S columns, and every decode step advances all of them at
once. The caches are one **ring**: decode step g writes every slot's new key
and value at column ``g mod S``, the same column for all rows, so the model's
own cached forward pass (one ``dynamic_update_slice`` at a scalar index) does
the writing. A row placed at step g has its prefix (prompt, plus the tokens
of a resumed partial row) in the Pb columns just behind g, written there by
:func:`place`; its later tokens follow at g, g+1, ... Attention does not care
where a key sits, only about its position (RoPE positions are passed
explicitly) and whether it is valid (``key_valid`` [R, S], reset when a row is
placed), so rows of any length share one static shape. A row needs Pb + its
new tokens <= S columns, which the engine guarantees by its choice of S.

**Tiers.** On a CPU a decode step's time goes mostly to reading the cache,
so a short row should not pay for S columns. The slots are split into tiers
(consecutive slot ranges), each with a ring of its own, ``window`` columns
wide (the last tier's is S): decode step g writes column ``g mod window`` of
every tier. A row starts in the smallest tier its prefix fits and is moved
(:func:`move`: its columns copied, in order, into a larger tier's ring)
before it outgrows its window.

Shapes: the legend of :mod:`rlax.core.types`; here R slots, U prefixes in a
prefill batch, Pb their bucketed length, W rows placed by one call, and the
longest ring's S columns.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rlax.core.models.layers import decode_attention
from rlax.core.models.moe import Routing, mlp_output
from rlax.core.models.rope import rope_tables
from rlax.core.models.routing_replay import ROUTES_DTYPE
from rlax.core.models.tokenizer import PAD
from rlax.core.models.transformer import (
    KVCache,
    Transformer,
    causal_mask,
    init_cache,
    positions_from_mask,
)
from rlax.plugins.samplers.engine_host import Ring
from rlax.plugins.samplers.sampling import sample_token


class Slots(NamedTuple):
    """Everything the device holds of the R rows in flight."""

    cache: tuple[
        tuple[dict[str, jax.Array], ...], ...
    ]  # per tier, per layer: k [R_t, K, H, W_t], v [R_t, K, W_t, H]
    key_valid: tuple[jax.Array, ...]  # per tier [R_t, W_t] bool: the current row's columns
    tok: jax.Array  # [R] int32: the next token to feed (last of prefix, or last drawn)
    pos: jax.Array  # [R] int32: its position
    active: jax.Array  # [R] bool: the slot holds a row still generating
    generated: jax.Array  # [R] int32: tokens the row has generated (a resumed row's included)
    limit: jax.Array  # [R] int32: the row stops once generated reaches it
    used: jax.Array  # [R] int32: ring columns the row spans (its prefix bucket + tokens fed)


def empty_slots(model: Transformer, ring: Ring, dtype=jnp.float32) -> Slots:
    rows = ring.tiers[-1][1]

    def zeros():  # distinct buffers: the engine donates them
        return jnp.zeros((rows,), jnp.int32)

    return Slots(
        cache=tuple(tuple(init_cache(model.cfg, b - a, w, dtype)) for a, b, w in ring.tiers),
        key_valid=tuple(jnp.zeros((b - a, w), bool) for a, b, w in ring.tiers),
        tok=zeros(),
        pos=zeros(),
        active=jnp.zeros((rows,), bool),
        generated=zeros(),
        limit=zeros(),
        used=zeros(),
    )


def prefill(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    tokens: jax.Array,  # [U, Pb] left-padded prefixes (without their feed token)
    mask: jax.Array,  # [U, Pb] bool
    replay: jax.Array | None = None,  # [U, Pb, L, k] int16: recorded experts, -1 none
) -> tuple[KVCache, jax.Array | None]:
    """The keys and values of each prefix, per layer [U, K, H, Pb] / [U, K, Pb, H], and
    a mixture-of-experts model's routing of its tokens, int16 [U, Pb, L, k] (None: dense),
    what routing replay records for them. A resumed row's tokens are routed by its
    record (``replay``), so its cache holds what its earlier tokens were computed with."""
    model: Transformer = nnx.merge(graphdef, state)
    u, pb = tokens.shape
    cache = init_cache(model.cfg, u, pb)
    _, written, routed = model.routed_hidden_states(
        tokens, positions_from_mask(mask), causal_mask(mask), cache, 0, replay
    )
    assert written is not None  # a call given a cache returns the written one
    return written, None if routed is None else routed.ids.astype(ROUTES_DTYPE)


def _local(target: jax.Array, a: int, b: int) -> jax.Array:
    """Slot indices within the tier [a, b); b - a (dropped by a scatter) for the others."""
    return jnp.where((target >= a) & (target < b), target - a, b - a)


def place(
    slots: Slots,
    written: KVCache,  # per layer [U, K, H, Pb] / [U, K, Pb, H], from prefill
    source: jax.Array,  # [W] int32: which prefix of ``written`` each placed row uses
    target: jax.Array,  # [W] int32: the slot it goes to (R or more: a filler, dropped)
    valid: jax.Array,  # [W, Pb] bool: the prefix's real columns
    feed: jax.Array,  # [W] int32: the feed token
    feed_pos: jax.Array,  # [W] int32: its position
    count: jax.Array,  # [W] int32: tokens already generated (a resumed row)
    limit: jax.Array,  # [W] int32: the row's budget of generated tokens
    step: jax.Array,  # scalar int32: the next decode step's number
    *,
    ring: Ring,
) -> Slots:
    """Starts W rows in their target slots; each prefix fills the Pb columns behind ``step``."""
    pb = valid.shape[1]
    caches, key_valid = [], []
    for (a, b, w), tier, tier_valid in zip(ring.tiers, slots.cache, slots.key_valid):
        local = _local(target, a, b)[:, None]  # [W, 1]
        cols = ((step - pb + jnp.arange(pb)) % w)[None, :]  # [1, Pb]
        layers = []
        for layer, new in zip(tier, written):
            k = new["k"][source].transpose(0, 3, 1, 2)  # [W, Pb, K, H]
            v = new["v"][source].transpose(0, 2, 1, 3)
            layers.append(
                {
                    "k": layer["k"].at[local, :, :, cols].set(k, mode="drop"),
                    "v": layer["v"].at[local, :, cols, :].set(v, mode="drop"),
                }
            )
        caches.append(tuple(layers))
        cleared = tier_valid.at[local[:, 0]].set(False, mode="drop")
        key_valid.append(cleared.at[local, cols].set(valid, mode="drop"))
    return Slots(
        cache=tuple(caches),
        key_valid=tuple(key_valid),
        tok=slots.tok.at[target].set(feed, mode="drop"),
        pos=slots.pos.at[target].set(feed_pos, mode="drop"),
        active=slots.active.at[target].set(True, mode="drop"),
        generated=slots.generated.at[target].set(count, mode="drop"),
        limit=slots.limit.at[target].set(limit, mode="drop"),
        used=slots.used.at[target].set(pb, mode="drop"),
    )


def move(
    slots: Slots,
    source: jax.Array,  # [W] int32 slots (R: a filler)
    target: jax.Array,  # [W] int32 slots of other tiers (R: a filler)
    ends: jax.Array,  # [W] int32: the step after each source row's last column
    step: jax.Array,  # scalar int32: the next decode step
    *,
    ring: Ring,
) -> Slots:
    """Moves the rows in ``source`` to ``target``, all read before any is written (two
    rows may swap). A row's columns go, in order, behind ``step`` in the other ring (a
    paused row's end earlier: attention reads positions from the keys, not from where
    they sit); a row moved to a smaller tier must fit its window. The sources are freed,
    the moved rows active (a paused row resumes)."""
    caches = [list(t) for t in slots.cache]
    key_valid = list(slots.key_valid)
    for t, (a, b, w) in enumerate(ring.tiers):
        src = _local(source, a, b)
        for u, (c, d, x) in enumerate(ring.tiers):
            if u == t:
                continue
            dst = jnp.where(src < b - a, _local(target, c, d), d - c)[:, None]
            m = min(w, x)  # the most recent m columns, oldest first
            from_cols = (ends[:, None] - m + jnp.arange(m)[None, :]) % w  # [W, m]
            to_cols = ((step - m + jnp.arange(m)) % x)[None, :]  # [1, m]
            rows = src[:, None]
            for i, (old, new) in enumerate(zip(slots.cache[t], caches[u])):
                k = old["k"][rows, :, :, from_cols]  # [W, m, K, H]
                v = old["v"][rows, :, from_cols, :]
                caches[u][i] = {
                    "k": new["k"].at[dst, :, :, to_cols].set(k, mode="drop"),
                    "v": new["v"].at[dst, :, to_cols, :].set(v, mode="drop"),
                }
            valid = slots.key_valid[t][rows, from_cols]  # [W, m]
            cleared = key_valid[u].at[dst[:, 0]].set(False, mode="drop")
            key_valid[u] = cleared.at[dst, to_cols].set(valid, mode="drop")

    def copy(x: jax.Array) -> jax.Array:
        return x.at[target].set(x[source], mode="drop")

    flat = slots._replace(cache=tuple(tuple(t) for t in caches), key_valid=tuple(key_valid))
    moved = flat._replace(
        tok=copy(flat.tok),
        pos=copy(flat.pos),
        generated=copy(flat.generated),
        limit=copy(flat.limit),
        used=copy(flat.used),
    )
    active = moved.active.at[source].set(False, mode="drop")
    return moved._replace(active=active.at[target].set(True, mode="drop"))


def _forward(model: Transformer, sl: Slots, step: jax.Array, ring: Ring):
    """One decode step of every slot, each tier against its own ring: logits [R, V],
    the caches and the key masks with this step's column written, and the fed tokens'
    experts [R, L, k] int16 (L sparse layers; [R, 0, 1] for a dense model)."""
    cfg = model.cfg
    x = model.embed(sl.tok[:, None])  # [R, 1, D]
    rope = rope_tables(sl.pos[:, None], cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    cols = [step % w for _, _, w in ring.tiers]
    # An inactive slot's column keeps what it held: a paused row's keys stay valid.
    key_valid = [
        jax.lax.dynamic_update_slice_in_dim(
            kv, sl.active[a:b, None] | jax.lax.dynamic_slice_in_dim(kv, c, 1, axis=1), c, axis=1
        )
        for (a, b, _), kv, c in zip(ring.tiers, sl.key_valid, cols)
    ]
    caches: list[list[dict[str, jax.Array]]] = [[] for _ in ring.tiers]
    routings: list[Routing] = []
    for i, block in enumerate(model.blocks):
        q, k, v = block.attn.project(block.attn_norm(x), rope)  # [R, 1, K, (G,) H]
        k_t = k.transpose(0, 2, 3, 1)  # [R, K, H, 1]
        v_t = v.transpose(0, 2, 1, 3)  # [R, K, 1, H]
        parts = []
        for t, (a, b, _) in enumerate(ring.tiers):
            layer, on = sl.cache[t][i], sl.active[a:b, None, None, None]
            old_k = jax.lax.dynamic_slice_in_dim(layer["k"], cols[t], 1, axis=3)
            old_v = jax.lax.dynamic_slice_in_dim(layer["v"], cols[t], 1, axis=2)
            new_k = jnp.where(on, k_t[a:b].astype(old_k.dtype), old_k)
            new_v = jnp.where(on, v_t[a:b].astype(old_v.dtype), old_v)
            layer = {
                "k": jax.lax.dynamic_update_slice_in_dim(layer["k"], new_k, cols[t], axis=3),
                "v": jax.lax.dynamic_update_slice_in_dim(layer["v"], new_v, cols[t], axis=2),
            }
            caches[t].append(layer)
            parts.append(decode_attention(q[a:b, 0], layer["k"], layer["v"], key_valid[t]))
        out = jnp.concatenate(parts) if len(parts) > 1 else parts[0]  # [R, K, G, H]
        r = out.shape[0]
        x = x + block.attn.o(out.reshape(r, -1)).reshape(r, 1, -1)
        mlp = block.mlp(block.mlp_norm(x))
        if isinstance(mlp, tuple):  # a sparse layer: (output, its routing)
            routings.append(mlp[1])
        x = x + mlp_output(mlp)
    logits = model.logits(model.final_norm(x))[:, 0]
    rows = sl.tok.shape[0]
    routes = (
        jnp.stack([r.ids.reshape(rows, -1) for r in routings], axis=1).astype(ROUTES_DTYPE)
        if routings
        else jnp.zeros((rows, 0, 1), ROUTES_DTYPE)
    )
    return logits, tuple(tuple(c) for c in caches), tuple(key_valid), routes


class Chunk(NamedTuple):
    """What one decode call produced: ``steps`` columns of which the first ``n`` ran."""

    tokens: jax.Array  # [R, steps] int32 (PAD where the slot emitted nothing)
    logprobs: jax.Array  # [R, steps] float32
    emitted: jax.Array  # [R, steps] bool
    n: jax.Array  # scalar int32
    floors: jax.Array  # [R, steps] float32: the kept sets (-inf: nothing cut; sampling.py)
    routes: jax.Array  # [R, steps, L, k] int16: the fed token's experts (-1: not fed)


def _empty_chunk(rows: int, steps: int, route_shape: tuple[int, ...]) -> Chunk:
    return Chunk(
        tokens=jnp.full((rows, steps), PAD, jnp.int32),
        logprobs=jnp.zeros((rows, steps), jnp.float32),
        emitted=jnp.zeros((rows, steps), bool),
        n=jnp.int32(0),
        floors=jnp.full((rows, steps), -jnp.inf, jnp.float32),
        routes=jnp.full((rows, steps, *route_shape), -1, ROUTES_DTYPE),
    )


def _record(
    out: Chunk,
    i: jax.Array,
    on: jax.Array,
    nxt: jax.Array,
    logp: jax.Array,
    floor: jax.Array,
    routes: jax.Array,
) -> Chunk:
    """``out`` with decode step ``i``'s column written: the token ``nxt``, its logprob
    ``logp`` and kept set's ``floor`` of each row that was active (``on``), and the
    experts ``routes`` of the token it fed; PAD, 0, -inf and -1 for the others."""
    return Chunk(
        tokens=out.tokens.at[:, i].set(jnp.where(on, nxt, PAD)),
        logprobs=out.logprobs.at[:, i].set(jnp.where(on, logp, 0.0)),
        emitted=out.emitted.at[:, i].set(on),
        n=i + 1,
        floors=out.floors.at[:, i].set(jnp.where(on, floor, -jnp.inf)),
        routes=out.routes.at[:, i].set(jnp.where(on[:, None, None], routes, -1)),
    )


def _advance(
    sl: Slots, cache: tuple, key_valid: tuple, nxt: jax.Array, stopped: jax.Array
) -> Slots:
    """The slots after a decode step that wrote ``cache`` and ``key_valid``: each active row
    is one position and one ring column further, feeds its drawn token ``nxt`` next, and is
    no longer active once ``stopped``."""
    on = sl.active
    return Slots(
        cache=cache,
        key_valid=key_valid,
        tok=jnp.where(on, nxt, sl.tok),
        pos=sl.pos + on,
        active=on & ~stopped,
        generated=sl.generated + on,
        limit=sl.limit,
        used=sl.used + on,
    )


def decode(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    slots: Slots,
    key: jax.Array,
    temperature: jax.Array,  # scalar
    start: jax.Array,  # scalar int32: the number of this call's first decode step
    *,
    ring: Ring,
    steps: int,
    refill_at: int,
    stop_ids: tuple[int, ...],
    top_k: int,
    top_p: float,
    method: str,
    recorded: str = "full",
) -> tuple[Slots, Chunk]:
    """Up to ``steps`` decode steps over every slot.

    Stops early once ``refill_at`` rows have finished in this call (their slots
    should take new rows), once a row would outgrow its tier's window (it must
    move first), or when no row is active.
    """
    model: Transformer = nnx.merge(graphdef, state)
    r = slots.tok.shape[0]
    stops = jnp.asarray(stop_ids, jnp.int32)
    windows = ring.windows()

    def cond(carry):
        i, finished, sl = carry[0], carry[1], carry[2]
        outgrown = jnp.any(sl.active & (sl.used + 1 > windows))
        return (i < steps) & (finished < refill_at) & jnp.any(sl.active) & ~outgrown

    def body(carry):
        i, finished, sl, out, key = carry
        on = sl.active
        logits, cache, key_valid, routes = _forward(model, sl, start + i, ring)
        key, sub = jax.random.split(key)
        nxt, logp, floor = sample_token(
            logits, sub, temperature, top_k=top_k, top_p=top_p, method=method, recorded=recorded
        )
        count = sl.generated + on
        stopped = count >= sl.limit
        if stop_ids:
            stopped = stopped | jnp.any(nxt[:, None] == stops[None, :], axis=-1)
        out = _record(out, i, on, nxt, logp, floor, routes)
        sl = _advance(sl, cache, key_valid, nxt, stopped)
        return i + 1, finished + jnp.sum(on & stopped), sl, out, key

    moe = model.cfg.moe
    route_shape = (len(model.cfg.moe_layers), moe.experts_per_token) if moe else (0, 1)
    carry = (jnp.int32(0), jnp.int32(0), slots, _empty_chunk(r, steps, route_shape), key)
    _, _, slots, out, _ = jax.lax.while_loop(cond, body, carry)
    return slots, out
