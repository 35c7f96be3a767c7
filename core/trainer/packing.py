"""Packed rows: the batch's sequences laid end to end in rows of a fixed length.

A padded batch (:func:`rlax.core.trainer.batches.make_batch`) gives every
completion a row of T = P + C tokens, so a batch of short completions with a
few long ones computes mostly padding (reasoning RL: 86% of the positions on
the rollout engine benchmark's lengths). Packing lays the rows' sequences
(prompt then completion, the row's real tokens) into packed rows of W tokens
and runs the model on those instead; the loss is computed on the padded
layout as before, so every algorithm is exact as it is:

1. **The packing rule: first-fit decreasing.** Sequences are taken longest
   first (ties: lower row first) and each goes to the first packed row with
   room for it, or opens a new one. A sequence longer than W is refused
   (ValueError); the trainer's W is at least the padded row width T unless
   ``row_tokens`` asks for less.
2. **Segments.** Each packed row's sequences get segment ids 1, 2, ... (0 is
   padding); the model's attention is causal within a segment and blind across
   segments, and positions count from 0 at each segment's first token
   (:func:`rlax.core.models.transformer.causal_mask`,
   :func:`~rlax.core.models.transformer.positions_from_mask`), so a sequence's
   logprobs are the ones it has alone in a row.
3. **Microbatches by token budget.** Packed rows are grouped into
   microbatches of ``rows_per_microbatch`` rows (the trainer's
   ``microbatch_tokens`` budget divided by W): k = ceil(B / rows) slots, the
   most any batch of B rows can need, are laid out so that
   :func:`rlax.core.trainer.microbatch.split_rows` gives microbatch i its rows,
   and rows are filled microbatch by microbatch. The step runs the microbatches
   that hold a sequence and skips the rest, so compute follows the batch's
   tokens while every array keeps its shape (no recompilation as lengths vary).
   A batch whose sequences fill at most half a microbatch would still compute
   a whole one: it gets one microbatch of the next power of two rows it needs
   instead (:func:`layout`; a handful of shapes, each compiled once).
4. **The way back.** ``unpack_index`` [B, L] says where in the packed per-token
   outputs [R, W - 1] (flattened) each padded target position's value is
   (-1: none); the step gathers logprobs, entropies and values into the padded
   layout with it (:func:`rlax.core.trainer.microbatch.unpack`).

Shapes: the legend of :mod:`rlax.core.types`, plus R packed rows of W tokens.

References:
  Krell et al., 2021, "Efficient Sequence Packing without Cross-contamination",
  https://arxiv.org/abs/2107.02027 (packing with per-sequence attention masks and positions)
  Johnson et al., 1974, first-fit decreasing bin packing (11/9 OPT + 6/9 rows at worst)
"""

from __future__ import annotations

import dataclasses

import numpy as np

#: The keys of a packed batch's model inputs; ``tokens`` and ``attention_mask`` are dropped.
PACKED_TOKENS, PACKED_SEGMENTS, UNPACK_INDEX = "packed_tokens", "packed_segments", "unpack_index"
#: Each packed token's identity in the padded layout (global row x T + column; -1: none):
#: what LoRA dropout draws its mask from (:func:`token_ids`), so every layout drops alike.
PACKED_IDS = "packed_token_ids"
#: Routing replay\'s ``routes`` [B, T, R, k] laid out as the packed rows [R, W, R, k].
PACKED_ROUTES = "packed_routes"


def token_ids(rows: np.ndarray, width: int) -> np.ndarray:
    """[len(rows), width] identities of a padded batch's tokens: global row x width + column.

    ``rows``: each local row's index in the global batch. A token keeps its identity in
    every layout, so randomness drawn from it (LoRA dropout) is the same however laid out.
    """
    return (np.asarray(rows, np.int64)[:, None] * width + np.arange(width)).astype(np.int32)


def check_targets(arrays: dict[str, np.ndarray]) -> None:
    """Refuses a batch with a loss-mask position whose input or target is not a real token.

    Position t of the loss mask is the prediction of token t + 1 from token t and those
    before it; a target whose token t is padding (a prompt of 0 tokens) or whose token
    t + 1 is padding has no position in the packed and prefix-shared layouts and a
    meaningless one padded, so the layouts' losses would differ: refused in all of them.
    """
    loss, mask = np.asarray(arrays["loss_mask"]), np.asarray(arrays["attention_mask"], bool)
    real = mask[:, :-1] & mask[:, 1:]
    bad = np.argwhere((loss != 0) & ~real)
    if len(bad):
        r, t = (int(v) for v in bad[0])
        what = "token t" if not mask[r, t] else "token t + 1"
        raise ValueError(
            f"batch row {r}: loss_mask position {t} predicts token {t + 1} but {what} is "
            "padding (a prompt or completion of 0 tokens?); every target needs a real token "
            "before it, in every layout (padded, packed, prefix-shared)"
        )


#: The sampler's kept sets (``kept_floor`` [B, L]) laid out as the packed targets [R, W - 1].
PACKED_FLOOR = "packed_kept_floor"


@dataclasses.dataclass(frozen=True)
class Plan:
    """Where each padded row's sequence goes.

    Attributes:
      starts: [B] the first real token of each padded row.
      lengths: [B] each row's real tokens (0: an empty filler row, not packed).
      bins: [B] the packed row (in filling order) each sequence goes to (-1: none).
      offsets: [B] its first column there.
      used: how many packed rows hold a sequence.
    """

    starts: np.ndarray
    lengths: np.ndarray
    bins: np.ndarray
    offsets: np.ndarray
    used: int


def plan(attention_mask: np.ndarray, width: int) -> Plan:
    """First-fit decreasing of the rows' sequences into packed rows of ``width`` tokens.

    Each row's real tokens must be contiguous (a left-padded prompt followed by
    its completion, as :func:`~rlax.core.trainer.batches.make_batch` lays them).
    """
    mask = np.asarray(attention_mask, bool)
    lengths = mask.sum(axis=1).astype(np.int64)
    starts = np.where(lengths > 0, np.argmax(mask, axis=1), 0)
    ends = starts + lengths
    cols = np.arange(mask.shape[1])
    inside = (cols[None] >= starts[:, None]) & (cols[None] < ends[:, None])
    if not np.array_equal(inside, mask):
        raise ValueError("pack: a row's real tokens are not contiguous")
    too_long = np.flatnonzero(lengths > width)
    if len(too_long):
        first = int(too_long[0])
        raise ValueError(
            f"pack: row {first}'s sequence has {int(lengths[first])} tokens > the packed row's "
            f"{width} (rlax.trainer_settings.row_tokens); sequences are never split"
        )
    bins, offsets, opened = first_fit_decreasing(lengths, width)
    return Plan(starts, lengths, bins, offsets, opened)


def first_fit_decreasing(lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(bins, offsets, used): items of ``lengths`` (each <= ``width``; 0: not placed, bin -1)
    taken longest first (ties: lower index first), each into the first row with room."""
    bins = np.full(len(lengths), -1, np.int64)
    offsets = np.zeros(len(lengths), np.int64)
    free = np.full(len(lengths), width, np.int64)  # at most one packed row per item
    opened = 0
    for r in sorted(np.flatnonzero(lengths > 0), key=lambda i: (-lengths[i], i)):
        fits = np.flatnonzero(free[:opened] >= lengths[r])
        b = int(fits[0]) if len(fits) else opened
        opened = max(opened, b + 1)
        bins[r], offsets[r] = b, width - free[b]
        free[b] -= lengths[r]
    return bins, offsets, opened


def rows_per_microbatch(budget: int, width: int, rows: int, multiple: int = 1) -> int:
    """Packed rows of ``width`` tokens per microbatch of a batch of ``rows`` rows: ``budget``
    tokens // width, at least one and at most ``rows`` (a batch never needs more packed rows
    than it has sequences), rounded up to a multiple of ``multiple`` (the devices it splits
    over)."""
    per = min(max(1, budget // width), rows)
    return -(-per // multiple) * multiple


def slots(rows: int, per_microbatch: int) -> tuple[int, np.ndarray]:
    """(k, order): k microbatches for a batch of ``rows`` rows and the packed-row index of
    each filling position (:func:`fill_order`)."""
    k = max(1, -(-rows // per_microbatch))
    return k, fill_order(k, per_microbatch)


def fill_order(k: int, per_microbatch: int) -> np.ndarray:
    """The packed-row index of each filling position of k microbatches, so that filling in
    order fills microbatch 0 first.

    Packed row g belongs to microbatch g % k (:func:`~rlax.core.trainer.microbatch.split_rows`
    interleaves), so filling position j (microbatch j // per, its (j % per)-th row) is row
    (j % per) * k + j // per.
    """
    j = np.arange(k * per_microbatch)
    return (j % per_microbatch) * k + j // per_microbatch


def layout(used: int, rows: int, per_microbatch: int, multiple: int = 1) -> tuple[int, int]:
    """(k, per): the microbatch slots and packed rows per microbatch a batch is laid out in.

    ``used``: the packed rows its sequences fill (with several processes, each packing its
    own: the most any fills, times their number); ``per_microbatch``: the budget's rows
    (:func:`rows_per_microbatch`). When the next power of two of ``used`` (rounded up to
    ``multiple``) is at most half of ``per_microbatch``: one microbatch of that many rows,
    instead of a whole budget's worth of rows mostly empty; otherwise :func:`slots`'s k
    microbatches of ``per_microbatch`` rows. The first has at most log2(per) shapes; a
    batch near the budget never switches between the two.
    """
    small = 1 << max(0, used - 1).bit_length()
    small = -(-small // multiple) * multiple
    if 2 * small <= per_microbatch:
        return 1, small
    return slots(rows, per_microbatch)[0], per_microbatch


def microbatch_slots(packed_rows: int, per_microbatch: int) -> int:
    """k of a packed batch of ``packed_rows`` rows laid out by :func:`layout` (from shapes:
    one small microbatch has fewer rows than the budget's, k of them k times as many)."""
    return 1 if packed_rows <= per_microbatch else packed_rows // per_microbatch


def pack(
    arrays: dict[str, np.ndarray],
    width: int,
    per_microbatch: int,
    the_plan: Plan | None = None,
    owned: np.ndarray | None = None,
    global_rows: int | None = None,
    k: int | None = None,
    row_ids: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The padded batch ``arrays`` with its ``tokens``/``attention_mask`` packed.

    Returns the other arrays unchanged plus ``packed_tokens`` and ``packed_segments``
    [k * per_microbatch, width] and ``unpack_index`` [B, L] (see the module doc).

    With several processes each packs its own rows: ``arrays`` are this process's B rows of
    a global batch of ``global_rows``, ``per_microbatch`` is the global count, and ``owned``
    the global packed rows this process feeds (:func:`rlax.core.parallel.multihost.process_rows`
    of the k x per_microbatch global rows); the packed arrays hold those rows, filled
    microbatch by microbatch, and ``unpack_index`` points into the global packed outputs.
    ``k``: the microbatches (:func:`layout`); by default :func:`slots`'s. ``row_ids``: each
    local row's index in the global batch (default: 0, 1, ...), for :data:`PACKED_IDS`.
    """
    tokens, mask = arrays["tokens"], arrays["attention_mask"]
    p = the_plan or plan(mask, width)
    if k is None:
        k = slots(global_rows or len(tokens), per_microbatch)[0]
    order = fill_order(k, per_microbatch)
    owned = np.arange(k * per_microbatch) if owned is None else np.asarray(owned)
    local = {int(g): i for i, g in enumerate(owned)}
    fill = [int(g) for g in order if int(g) in local]  # filling positions among ours
    n = len(owned)
    packed = np.zeros((n, width), np.int32)
    segments = np.zeros((n, width), np.int32)
    ids = np.full((n, width), -1, np.int32)
    padded_ids = token_ids(np.arange(len(tokens)) if row_ids is None else row_ids, tokens.shape[1])
    index = np.full((len(tokens), tokens.shape[1] - 1), -1, np.int32)
    next_segment = np.ones(n, np.int32)
    placed = np.flatnonzero(p.bins >= 0)
    for r in placed[np.lexsort((p.offsets[placed], p.bins[placed]))]:  # segments left to right
        g = fill[p.bins[r]]
        row, start, length, off = local[g], p.starts[r], p.lengths[r], p.offsets[r]
        packed[row, off : off + length] = tokens[r, start : start + length]
        segments[row, off : off + length] = next_segment[row]
        ids[row, off : off + length] = padded_ids[r, start : start + length]
        next_segment[row] += 1
        # Target position t (predicting token t + 1) of the padded row is column
        # off + t - start of the packed row, for the sequence's length - 1 targets.
        index[r, start : start + length - 1] = g * (width - 1) + off + np.arange(length - 1)
    out = {key: v for key, v in arrays.items() if key not in ("tokens", "attention_mask")}
    out.update(
        {PACKED_TOKENS: packed, PACKED_SEGMENTS: segments, UNPACK_INDEX: index, PACKED_IDS: ids}
    )
    if "kept_floor" in arrays:  # a model input too: the head truncates as the sampler did
        floor = np.full((n, width - 1), -np.inf, np.float32)
        real = index >= 0
        g, col = np.divmod(index[real], width - 1)
        floor[[local[int(x)] for x in g], col] = arrays["kept_floor"][real]
        out[PACKED_FLOOR] = floor
    if "routes" in arrays:  # routing replay: each token's recorded experts go with it
        out[PACKED_ROUTES] = _packed_routes(arrays["routes"], p, local, fill, n, width)
        del out["routes"]
    return out


def _packed_routes(
    routes: np.ndarray, p: Plan, local: dict[int, int], fill: list[int], n: int, width: int
) -> np.ndarray:
    """Routes [B, T, R, k] laid out as the packed rows [n, width, R, k] (-1 off the sequences)."""
    out = np.full((n, width, *routes.shape[2:]), -1, routes.dtype)
    for r in np.flatnonzero(p.bins >= 0):
        row, start, length, off = local[fill[p.bins[r]]], p.starts[r], p.lengths[r], p.offsets[r]
        out[row, off : off + length] = routes[r, start : start + length]
    return out


def step_cost(rows: int, width: int, passes: int, embed_dim: int) -> float:
    """A step's work in token-passes: rows x width tokens per pass, attention's quadratic term
    included (per token, attention's scores and mixing cost about width / (6 * D) of the
    layer's matmuls, whose weights cost ~12 D^2 flops against 2 * width * D)."""
    return passes * rows * width * (1.0 + width / (6.0 * embed_dim))


def packed_is_cheaper(
    padded_rows: int,
    padded_width: int,
    padded_passes: int,
    p: Plan,
    width: int,
    per_microbatch: int,
    embed_dim: int,
    packed_passes: int = 4,
) -> bool:
    """``packing = "auto"``: whether the packed step (two passes over the microbatches that hold
    a sequence: ``packed_passes`` 4; 3 when the rows make one microbatch) is estimated cheaper than the padded one
    (``padded_passes``: 3 for one forward-and-backward, 4 with row microbatches; a
    forward alone, as a teacher's, is 1 and 1)."""
    microbatches = max(1, -(-p.used // per_microbatch))
    packed = step_cost(microbatches * per_microbatch, width, packed_passes, embed_dim)
    return packed < step_cost(padded_rows, padded_width, padded_passes, embed_dim)
