"""Groups -> TrainBatch: the padded arrays the jitted train step consumes.

Row layout matches the sampler's: the prompt left-padded to P, the completion
right-padded to C. Masks come from lengths, never from token values, so a
generated token that happens to equal the pad id still counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlax.core.models.routing_replay import batch_routes
from rlax.core.types import Completion, Group, TrainBatch


def _bucket(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def _sampled_distribution(
    completions: Sequence[Completion], shape: tuple[int, int], p: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """What the sampler says of the distribution it drew from, [B, L] each: the kept sets'
    floors (-inf: none cut) when some completion was drawn truncated, and the drawn
    distribution's logprobs when some recorded ones are not its (elsewhere the recorded);
    None when no completion has them (:class:`~rlax.core.types.TrainBatch`)."""
    floor = sampled = None
    if any(c.kept_floor is not None for c in completions):
        floor = np.full(shape, -np.inf, np.float32)
    if any(c.sampled_logprobs is not None for c in completions):
        sampled = np.zeros(shape, np.float32)
    for r, c in enumerate(completions):
        where = slice(p - 1, p - 1 + len(c.tokens))
        if floor is not None and c.kept_floor is not None:
            floor[r, where] = c.kept_floor
        if sampled is not None:
            drawn = c.logprobs if c.sampled_logprobs is None else c.sampled_logprobs
            sampled[r, where] = drawn * c.model_mask
    return floor, sampled


def _lags(completions: Sequence[Completion], shape: tuple[int, int], p: int, version: int):
    """int32 [B, L]: how many versions before ``version`` each target was sampled with
    (per token, :attr:`Completion.versions`; 0 off the model's tokens)."""
    lag = np.zeros(shape, np.int32)
    for r, c in enumerate(completions):
        sampled_by = c.policy_version if c.versions is None else np.asarray(c.versions)
        lag[r, p - 1 : p - 1 + len(c.tokens)] = (version - sampled_by) * (c.model_mask > 0)
    return lag


def make_batch(
    groups: Sequence[Group],
    advantages: np.ndarray,  # [M, G] sequence-level advantages
    *,
    pad_id: int = 0,
    length_bucket: int = 8,
    row_multiple: int = 1,
    completion_len: int | None = None,
    version: int | None = None,
) -> TrainBatch:
    """Packs ``groups`` into a TrainBatch.

    Args:
      groups: M groups of G completions each.
      advantages: one advantage per completion, broadcast to its tokens.
      pad_id: token id written in padding.
      length_bucket: P and C are rounded up to multiples of this, so the train
        step sees few distinct shapes.
      row_multiple: pad the row count up to a multiple of this (all-masked
        filler rows), so a filter that removed groups costs at most a few
        distinct shapes for the train step.
      completion_len: pad completions to exactly this length (the sampler's
        budget) instead of the bucketed longest one, so the shape does not
        depend on the data.
      version: the weight version the batch trains (the trainer's): each
        target's ``policy_lag`` is this minus the version that sampled it
        (:attr:`Completion.versions`, else its ``policy_version``). None: no
        ``policy_lag``.
    """
    if not groups:
        raise ValueError("make_batch: no groups")
    if advantages.shape[0] != len(groups):
        raise ValueError(f"make_batch: {len(groups)} groups but advantages {advantages.shape}")
    completions = [(gi, g.prompt, c) for gi, g in enumerate(groups) for c in g.completions]
    if row_multiple < 1:
        raise ValueError(f"make_batch: row_multiple must be >= 1, got {row_multiple}")
    n = _bucket(len(completions), row_multiple)
    p = _bucket(max(len(g.prompt.tokens) for g in groups), length_bucket)
    longest = max(len(c.tokens) for _, _, c in completions)
    if completion_len is not None and longest > completion_len:
        raise ValueError(
            f"make_batch: a completion has {longest} tokens > completion_len={completion_len}"
        )
    c_len = completion_len if completion_len is not None else _bucket(longest, length_bucket)
    t = p + c_len
    tokens = np.full((n, t), pad_id, np.int32)
    attention = np.zeros((n, t), bool)
    loss_mask = np.zeros((n, t - 1), np.float32)
    old_logprobs = np.zeros((n, t - 1), np.float32)
    adv = np.zeros((n, t - 1), np.float32)
    group_ids = np.full((n,), -1, np.int32)
    flat_adv = np.asarray(advantages, np.float32).reshape(-1)
    for r, (gi, prompt, comp) in enumerate(completions):
        lp, lc = len(prompt.tokens), len(comp.tokens)
        tokens[r, p - lp : p] = prompt.tokens
        tokens[r, p : p + lc] = comp.tokens
        attention[r, p - lp : p + lc] = True
        # Position t predicts token t+1: generated tokens are targets at p-1 .. p+lc-2.
        # A multi-turn episode's observations are holes in the mask (model_mask 0).
        model = comp.model_mask
        loss_mask[r, p - 1 : p - 1 + lc] = model
        old_logprobs[r, p - 1 : p - 1 + lc] = comp.logprobs * model
        adv[r, p - 1 : p - 1 + lc] = flat_adv[r] * model
        group_ids[r] = gi
    rows = [c for _, _, c in completions]
    floor, sampled = _sampled_distribution(rows, (n, t - 1), p)
    routes = batch_routes([(len(pr.tokens), c.routes) for _, pr, c in completions], (n, t), p)
    return TrainBatch(
        tokens,
        attention,
        loss_mask,
        old_logprobs,
        adv,
        group_ids,
        kept_floor=floor,
        routes=routes,
        sampled_logprobs=sampled,
        policy_lag=None if version is None else _lags(rows, (n, t - 1), p, version),
    )
