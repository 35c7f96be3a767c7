"""A decoder-only transformer in flax nnx, with an explicit KV cache.

The layer stack is the Llama recipe: pre-RMSNorm, rotary position embeddings,
grouped-query attention, SwiGLU MLP, tied or untied output head. Two switches
cover the Qwen families: ``qkv_bias`` (Qwen2: biases on the q/k/v projections)
and ``qk_norm`` (Qwen3: an RMSNorm over each head's query and key before RoPE;
OLMoE's spans the whole projection, ``qk_norm_scope``).
RoPE takes the config's theta and optional scaling (``linear`` or ``llama3``). The same
forward pass serves training (no cache), prefill (fills the cache) and decode
(one token at a time against the cache); callers pass positions and a key
mask explicitly, so left-padded prompts work everywhere.

Shapes: the legend of :mod:`rlax.core.types` (B batch, T query length, S cache
length, N query heads, K key/value heads, H head dim, D embed dim, F MLP dim, V
vocabulary).

One file per concern: :mod:`~rlax.core.models.config` (the architecture and
its presets), :mod:`~rlax.core.models.rope` (rotary embeddings),
:mod:`~rlax.core.models.layers` (attention, MLP, block); this module holds the
model, its cache and the mask and logprob helpers the trainer and samplers use.

References:
  Vaswani et al., 2017, https://arxiv.org/abs/1706.03762 (the transformer)
"""

from __future__ import annotations

from typing import cast

import jax
import jax.numpy as jnp
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.layers import Block
from rlax.core.models.logprobs import (
    DEFAULT_CHUNK_TOKENS,
    chunked_token_logprobs,
    logprobs_and_entropy,
)
from rlax.core.models.moe import MoeBlock, RoutesOut, Routing, load_balancing_loss
from rlax.core.models.rope import rope_tables

KVCache = list[dict[str, jax.Array]]  # per layer: {"k": [B,K,H,S], "v": [B,K,S,H]}


class _ShapeOnlyKeys:
    """Stands in for ``nnx.Rngs`` where only shapes are wanted: every stream gives key 0.

    ``nnx.Rngs`` counts its draws in a Variable. Under ``eval_shape`` each count is a
    tracer, every update of it asks the tracer for its sharding, and JAX builds the
    error that answers by walking the trace so far: quadratic in the parameters
    (SmolLM2-135M's 30 layers: 3.3 s to trace, 0.5 s with these keys, same shapes).
    """

    def __getattr__(self, stream: str):
        return lambda: jax.random.key(0)


def abstract_transformer(cfg: TransformerConfig) -> Transformer:
    """A model of ``cfg`` whose parameters are shapes and dtypes only (no memory)."""
    return nnx.eval_shape(lambda: Transformer(cfg, rngs=_ShapeOnlyKeys()))  # type: ignore[arg-type]


class Transformer(nnx.Module):
    """Decoder-only language model.

    ``model(tokens, positions, attn_mask)`` returns logits [B, T, V]; with a
    ``cache`` it also writes this call's keys and values at ``cache_index`` and
    returns the updated cache.
    """

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.embed_dim, rngs=rngs)
        self.blocks = nnx.List(
            [
                MoeBlock(cfg, rngs=rngs) if cfg.is_moe_layer(i) else Block(cfg, rngs=rngs)
                for i in range(cfg.num_layers)
            ]
        )
        self.final_norm = nnx.RMSNorm(cfg.embed_dim, epsilon=cfg.norm_eps, rngs=rngs)
        if not cfg.tie_embeddings:
            self.head = nnx.Linear(cfg.embed_dim, cfg.vocab_size, use_bias=False, rngs=rngs)

    def __call__(
        self,
        tokens: jax.Array,  # [B, T]
        positions: jax.Array,  # [B, T]
        attn_mask: jax.Array,  # [B, T, S] bool
        cache: KVCache | None = None,
        cache_index: jax.Array | int | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        x, new_cache = self.hidden_states(tokens, positions, attn_mask, cache, cache_index)
        return self.logits(x), new_cache

    def hidden_states(
        self,
        tokens: jax.Array,  # [B, T]
        positions: jax.Array,  # [B, T]
        attn_mask: jax.Array,  # [B, T, S] bool
        cache: KVCache | None = None,
        cache_index: jax.Array | int | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """The final-normed hidden states [B, T, D] (and the cache): ``__call__`` without the head.

        A sampler's prefill needs logits at the last position only; on a large
        vocabulary the head over every prompt position is a tenth of its work.
        """
        x, new_cache, _ = self.routed_hidden_states(
            tokens, positions, attn_mask, cache, cache_index
        )
        return x, new_cache

    def routed_hidden_states(
        self,
        tokens: jax.Array,  # [B, T]
        positions: jax.Array,  # [B, T]
        attn_mask: jax.Array,  # [B, T, S] bool
        cache: KVCache | None = None,
        cache_index: jax.Array | int | None = None,
        replay: jax.Array | None = None,  # [B, T, R, k] int: R sparse layers, -1 not replayed
    ) -> tuple[jax.Array, KVCache | None, RoutesOut | None]:
        """``hidden_states`` that also returns a mixture-of-experts model's routing
        (None for a dense one), and routes its tokens by ``replay`` where given."""
        x = self.embed(tokens)
        cfg = self.cfg
        rope = rope_tables(positions, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        new_cache: KVCache | None = [] if cache is not None else None
        routings: list[Routing] = []
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache[i]
            if isinstance(block, MoeBlock) or cfg.is_moe_layer(i):  # wrapped blocks too
                r = len(routings)
                layer_replay = None if replay is None else replay[:, :, r]
                sparse = cast(MoeBlock, block)  # or a wrapper of one (remat, sharding)
                x, layer_cache, routing = sparse(
                    x, rope, attn_mask, layer_cache, cache_index, layer_replay
                )
                routings.append(routing)
            else:
                x, layer_cache = block(x, rope, attn_mask, layer_cache, cache_index)
            if new_cache is not None:
                new_cache.append(layer_cache)
        routes = None
        if routings:
            assert cfg.moe is not None
            b, t = tokens.shape
            routes = RoutesOut(
                ids=jnp.stack([r.ids.reshape(b, t, -1) for r in routings], axis=2),
                aux_loss=jnp.mean(
                    jnp.stack([load_balancing_loss(r, cfg.moe.num_experts) for r in routings])
                ),
                probs=jnp.stack([r.probs.reshape(b, t, -1) for r in routings], axis=2),
            )
        return self.final_norm(x), new_cache, routes

    def logits(self, x: jax.Array) -> jax.Array:
        """The output head on hidden states [..., D] -> float32 logits [..., V]."""
        flat = x.reshape(-1, x.shape[-1])  # [*, D]: see Attention
        if self.cfg.tie_embeddings:
            logits = self.embed.attend(flat)
        else:
            logits = self.head(flat)
        return logits.reshape(*x.shape[:-1], -1).astype(jnp.float32)


def init_cache(cfg: TransformerConfig, batch: int, length: int, dtype=jnp.float32) -> KVCache:
    """Zeroed per-layer keys [B, K, H, S] and values [B, K, S, H] (S = ``length`` slots)."""
    k, h = cfg.num_kv_heads, cfg.head_dim
    return [
        {"k": jnp.zeros((batch, k, h, length), dtype), "v": jnp.zeros((batch, k, length, h), dtype)}
        for _ in range(cfg.num_layers)
    ]


def causal_mask(attention_mask: jax.Array) -> jax.Array:
    """[B, T] key validity or segment ids -> [B, T, T] mask: query t sees keys s <= t.

    A bool mask holds one sequence per row (True on its tokens): query t sees
    the valid keys s <= t. An integer mask holds segment ids, several
    sequences packed in a row (:mod:`rlax.core.trainer.packing`): 0 is
    padding, and query t sees the keys s <= t of its own segment only, so
    sequences packed together never see one another. A tree (prefix sharing,
    :mod:`rlax.core.trainer.prefix`) also gives each token a parent segment
    (:func:`tree_ids`): its queries see the parent's keys too.
    """
    t = attention_mask.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    if attention_mask.dtype == jnp.bool_:
        return causal[None] & attention_mask[:, None, :]
    seg, parent = segments_and_parents(attention_mask)
    same = seg[:, :, None] == seg[:, None, :]
    shared = (parent[:, :, None] == seg[:, None, :]) & (parent[:, :, None] > 0)
    return causal[None] & (same | shared) & (seg[:, None, :] > 0)


#: A tree's integer mask holds segment + TREE_SHIFT x parent segment (:func:`tree_ids`).
TREE_SHIFT = 1 << 16


def tree_ids(segments: jax.Array, parents: jax.Array) -> jax.Array:
    """The integer attention mask of packed segments with parents (0: none): each branch
    of a tree sees its parent segment (a shared prefix) and itself, and its positions
    continue from the parent's length. Segments < TREE_SHIFT, parents < 2**15."""
    return segments + TREE_SHIFT * parents


def segments_and_parents(attention_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """An integer mask's segment ids and parent segments (:func:`tree_ids`)."""
    return attention_mask % TREE_SHIFT, attention_mask // TREE_SHIFT


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
    """Position of each token counting only its own sequence's tokens.

    A bool mask: real tokens count from 0, left padding ignored. Segment ids
    (an integer mask, see :func:`causal_mask`): each segment counts from 0 at
    its first token (a segment's tokens are contiguous), a tree's branch from
    its parent segment's length.
    """
    if attention_mask.dtype == jnp.bool_:
        return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)
    seg, parent = segments_and_parents(attention_mask)
    index = jnp.broadcast_to(jnp.arange(seg.shape[-1], dtype=jnp.int32), seg.shape)
    starts = jnp.concatenate(
        [jnp.ones_like(seg[:, :1], dtype=bool), seg[:, 1:] != seg[:, :-1]], axis=-1
    )
    own = index - jax.lax.cummax(jnp.where(starts, index, 0), axis=seg.ndim - 1)
    # A branch continues from its parent: + the parent segment's token count.
    counts = jax.vmap(lambda s: jnp.bincount(s, length=seg.shape[-1] + 1))(seg)
    inherited = jnp.take_along_axis(counts, jnp.minimum(parent, seg.shape[-1]), axis=-1)
    return own + jnp.where(parent > 0, inherited, 0)


def token_logprobs(
    logits: jax.Array,  # [B, T, V]
    tokens: jax.Array,  # [B, T]
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Log-probability of ``tokens[:, t+1]`` under ``logits[:, t]`` and the entropy.

    The unchunked reference: it needs the whole batch's logits.
    :func:`sequence_logprobs` computes the same without them.

    Returns:
      logprobs [B, T-1] and entropy [B, T-1] of the (tempered) distributions.
    """
    return logprobs_and_entropy(logits[:, :-1], tokens[:, 1:], temperature)


def sequence_logprobs(
    model: Transformer,
    tokens: jax.Array,  # [B, T]
    attention_mask: jax.Array,  # [B, T]
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    floor: jax.Array | None = None,  # [B, T-1]
) -> tuple[jax.Array, jax.Array]:
    """Full forward pass: per-token logprobs and entropies, both [B, T-1].

    The head runs on ``chunk_tokens`` tokens at a time
    (:func:`rlax.core.models.logprobs.chunked_token_logprobs`), so the whole
    batch's logits [B, T, V] never exist, in the forward or the backward pass.
    ``floor``: the sampler's kept sets, for logprobs under its truncated distribution.
    """
    hidden, _ = model.hidden_states(
        tokens, positions_from_mask(attention_mask), causal_mask(attention_mask)
    )
    return chunked_token_logprobs(model.logits, hidden, tokens, temperature, chunk_tokens, floor)
