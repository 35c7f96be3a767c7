"""Routing replay (R3): the trainer routes each rollout token to the experts the sampler chose.

A mixture-of-experts policy's sampler and trainer run the same weights with
different numerics (another dtype, batch shape or kernel), and a token whose
top-k scores are close is then routed to different experts by the two: the
rollout's logprobs come from another network than the one trained, and the
importance ratios blow up. With replay, the sampler records each token's
expert ids per sparse layer and the trainer's forward routes by them (the
router's scores at those ids still weight the experts, so the router keeps
its gradient).

The record of a row is int16 ``routes`` [T, R, k] aligned with its tokens
(R sparse layers, k experts per token), -1 where a token was not routed by
the sampler (padding, the last generated token): those tokens are routed by
the trainer itself. On the wire that is 2 * R * k bytes per token.

**R2-style replay** (``trainer``): with several updates per rollout batch
(:mod:`rlax.core.trainer.epochs`), the first pass over the batch (the one that
fixes the updates' anchors) records the trainer's own routing, and every
update of the batch routes by it, so a later update's ratio compares the same
network's experts even after the router moved.

References:
  Ma et al., 2025, "Stabilizing MoE Reinforcement Learning by Aligning Training and
    Inference Routers" (rollout routing replay, R3)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the routes' records are numpy (the samplers'); the replay is the trainer's
    import jax

    from rlax.core.models.transformer import Transformer

__all__ = ["REPLAY_MODES", "ROUTES_DTYPE", "batch_routes", "replayed_logprobs"]

ROUTES_DTYPE = np.int16  # expert ids < 32768; -1: not recorded
#: ``off``: the trainer routes every token itself; ``rollout``: it routes rollout tokens
#: by the sampler's recorded experts (R3); ``trainer``: with several updates per batch, every
#: update routes the batch's tokens as the trainer's first pass over it did (R2-style).
REPLAY_MODES = ("off", "rollout", "trainer")


def replayed_logprobs(
    model: Transformer,
    tokens: jax.Array,  # [B, T]
    attention_mask: jax.Array,  # [B, T] bool, or segment ids of a packed batch
    routes: jax.Array,  # [B, T, R, k] int, -1: route the token itself
    temperature: float,
    chunk_tokens: int,
    floor: jax.Array | None = None,  # [B, T-1]: the sampler's kept sets
) -> tuple[jax.Array, jax.Array]:
    """:func:`rlax.core.models.transformer.sequence_logprobs` with the tokens routed by ``routes``."""
    from rlax.core.models.logprobs import chunked_token_logprobs
    from rlax.core.models.transformer import causal_mask, positions_from_mask

    hidden, _, _ = model.routed_hidden_states(
        tokens, positions_from_mask(attention_mask), causal_mask(attention_mask), replay=routes
    )
    extra: tuple[Any, ...] = () if floor is None else (floor,)
    return chunked_token_logprobs(model.logits, hidden, tokens, temperature, chunk_tokens, *extra)


def batch_routes(
    rows: Sequence[tuple[int, np.ndarray | None]],  # (prompt tokens, routes or None) per row
    shape: tuple[int, int],  # (B, T) of the batch
    prompt_width: int,  # P: each row's prompt is left-padded to it
) -> np.ndarray | None:
    """The batch's ``routes`` [B, T, R, k] from each row's record (None if no row has one).

    A row's record covers its prompt's ``prompt tokens`` tokens and then its
    completion's, so it lands at ``P - prompt tokens`` of its padded row.
    """
    records = [r for _, r in rows if r is not None]
    if not records:
        return None
    out = np.full((*shape, *records[0].shape[1:]), -1, ROUTES_DTYPE)
    for i, (prompt_tokens, record) in enumerate(rows):
        if record is not None:
            start = prompt_width - prompt_tokens
            out[i, start : start + len(record)] = record
    return out
