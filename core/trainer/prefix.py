"""Prefix-shared rows: a group's shared prefix computed once, its completions as branches.

A GRPO group is G completions of one prompt; packed flat
(:mod:`rlax.core.trainer.packing`) the prompt is computed G times. This layout
packs each group as a tree: the prefix its rows share once, then each row's
remainder as a branch that attends to the prefix and to itself only, with
positions continuing from the prefix. Causal attention makes it exact: a
token's hidden state depends on the tokens before it alone, so the prefix's
states are the same under every branch, and a branch's are its row's.

1. **What is shared.** Rows are grouped by the tokens before the batch's
   completion column (the prompt: :func:`prompt_column`); a group's shared
   length s is the longest common prefix of its rows' real tokens, so
   multi-turn episodes that share history beyond the prompt (identical first
   turns) share that too. Rows whose group has one row, or s < 2, are packed
   flat.
2. **The tree.** The shared piece is the prefix's first s - 1 tokens (segment
   id i, parent 0); each branch is its row's tokens from s - 1 on (segment
   i + 1 + j, parent i), so it starts with the last shared token: its hidden
   state predicts the row's own next token, which differs between branches.
   The first branch follows the shared piece, so the shared piece's last
   position predicts token s - 1 (the same in every row). A tree longer than
   a row is cut into several, each with the shared piece.
3. **The way back.** ``unpack_index`` points a row's targets before s - 1 at
   the shared piece's positions (several rows the same position: the gather's
   transpose sums their cotangents) and the others at its branch.

Trees and flat sequences are placed first-fit decreasing in rows of
``width`` tokens and microbatches as packing lays them; the model reads the
tree through its integer attention mask
(:func:`rlax.core.models.transformer.tree_ids`). Shapes: B rows, T the padded
width, W the packed width.

Not shared (refused when asked for, never chosen automatically): LoRA dropout
(a shared token would get one mask where the padded rows draw one each) and
batches with other per-token model inputs (the sampler's kept sets, routing
replay), which are recorded per row.

Reference: the tree-shaped attention of AReaL's prefix sharing
(https://github.com/inclusionAI/AReaL), here derived from causality alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rlax.core.models.transformer import TREE_SHIFT
from rlax.core.trainer import packing

#: Per-token model inputs other than the tokens, recorded per row: not shared.
PER_ROW_INPUTS = ("kept_floor", "routes")


@dataclasses.dataclass(frozen=True)
class Item:
    """One placed unit: a flat sequence (``shared`` 0, one branch) or a tree.

    Attributes:
      rows: the padded rows it holds (a tree's branches, in order).
      shared: the shared piece's tokens (s - 1; 0 for a flat sequence).
      length: its tokens in the packed row.
    """

    rows: tuple[int, ...]
    shared: int
    length: int


@dataclasses.dataclass(frozen=True)
class TreePlan:
    """The items, their rows and columns, and the padded rows' real-token spans."""

    items: list[Item]
    bins: np.ndarray
    offsets: np.ndarray
    used: int
    starts: np.ndarray
    lengths: np.ndarray


def prompt_column(loss_mask: np.ndarray) -> int:
    """The first column no row's prompt reaches: one past the first loss-mask target of any
    row (``make_batch`` puts every completion's first token there; a row whose first
    completion token is off the mask makes it later, which only shortens the key)."""
    targets = np.flatnonzero(np.asarray(loss_mask).any(axis=0))
    return int(targets[0]) + 1 if len(targets) else 0


def _common_prefix(seqs: list[np.ndarray]) -> int:
    n = min(len(s) for s in seqs)
    first = seqs[0][:n]
    same = np.ones(n, bool)
    for s in seqs[1:]:
        same &= s[:n] == first
    return int(np.argmin(same)) if not same.all() else n


def plan(tokens: np.ndarray, mask: np.ndarray, loss_mask: np.ndarray, width: int) -> TreePlan:
    """Groups rows by prompt, cuts each group into trees that fit ``width``, packs them."""
    base = packing.plan(mask, width)  # checks contiguity and lengths
    column = prompt_column(loss_mask)
    groups: dict[bytes, list[int]] = {}
    for row in np.flatnonzero(base.lengths > 0).tolist():
        key = tokens[row, base.starts[row] : max(base.starts[row], column)]
        groups.setdefault(key.tobytes() if len(key) else f"row{row}".encode(), []).append(row)
    items: list[Item] = []
    for rows in groups.values():
        seqs = [tokens[r, base.starts[r] : base.starts[r] + base.lengths[r]] for r in rows]
        s = _common_prefix(seqs) if len(rows) > 1 else 0
        if s < 2:
            items += [Item((r,), 0, int(base.lengths[r])) for r in rows]
            continue
        current: list[int] = []
        size = s - 1
        for r in rows:
            branch = int(base.lengths[r]) - (s - 1)
            if current and size + branch > width:
                items.append(Item(tuple(current), s - 1, size))
                current, size = [], s - 1
            current.append(r)
            size += branch
        items.append(Item(tuple(current), s - 1, size))
    lengths = np.array([i.length for i in items], np.int64)
    bins, offsets, used = packing.first_fit_decreasing(lengths, width)
    return TreePlan(items, bins, offsets, used, base.starts, base.lengths)


def packed_tokens(p: TreePlan) -> int:
    """The tokens the prefix-shared rows hold (the flat packing's: ``lengths.sum()``)."""
    return int(sum(i.length for i in p.items))


def pack(
    arrays: dict[str, np.ndarray], width: int, per_microbatch: int, p: TreePlan, k: int
) -> dict[str, np.ndarray]:
    """The padded batch ``arrays`` with its tokens laid out as trees (one process).

    Returns the other arrays plus ``packed_tokens``, ``packed_segments`` (tree ids:
    segment + TREE_SHIFT x parent) [k * per_microbatch, width] and ``unpack_index`` [B, L],
    as :func:`rlax.core.trainer.packing.pack` does.
    """
    tokens = arrays["tokens"]
    n = k * per_microbatch
    fill = packing.fill_order(k, per_microbatch)
    packed = np.zeros((n, width), np.int32)
    ids = np.zeros((n, width), np.int64)
    index = np.full((len(tokens), tokens.shape[1] - 1), -1, np.int32)
    next_segment = np.ones(n, np.int64)
    for i in np.lexsort((p.offsets, p.bins)):  # items left to right in each row
        item, g = p.items[i], int(fill[p.bins[i]])
        col, base = int(p.offsets[i]), g * (width - 1)
        parent = 0
        if item.shared:  # the shared piece, from the first branch's row
            r0 = item.rows[0]
            start = p.starts[r0]
            packed[g, col : col + item.shared] = tokens[r0, start : start + item.shared]
            parent = int(next_segment[g])
            ids[g, col : col + item.shared] = parent
            next_segment[g] += 1
            shared_col, col = col, col + item.shared
        for r in item.rows:
            start, length = p.starts[r], p.lengths[r]
            branch = length - item.shared
            packed[g, col : col + branch] = tokens[r, start + item.shared : start + length]
            ids[g, col : col + branch] = next_segment[g] + TREE_SHIFT * parent
            next_segment[g] += 1
            t = np.arange(length - 1)
            if item.shared:
                where = np.where(
                    t < item.shared, shared_col + t, col + t - item.shared
                )  # targets before the branch read the shared piece
            else:
                where = col + t
            index[r, start : start + length - 1] = base + where
            col += branch
    if next_segment.max() >= TREE_SHIFT or (ids // TREE_SHIFT).max() >= 1 << 15:
        raise ValueError(f"prefix sharing: more than {TREE_SHIFT - 1} segments in a row")
    out = {key: v for key, v in arrays.items() if key not in ("tokens", "attention_mask")}
    out.update(
        {
            packing.PACKED_TOKENS: packed,
            packing.PACKED_SEGMENTS: ids.astype(np.int32),
            packing.UNPACK_INDEX: index,
        }
    )
    return out


def width_for(p_width: int, longest: int, budget: int) -> int:
    """The prefix rows' width: the padded width times the smallest power of two that holds
    the longest tree, at most the microbatch budget (a handful of shapes)."""
    width = p_width
    while width < longest and width * 2 <= max(budget, p_width):
        width *= 2
    return width
