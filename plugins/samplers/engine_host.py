"""The slot engine's host side: the rows, the tiers, and who goes in which slot.

:class:`Table` knows which row is in which slot, which rows are paused, and
each slot's tier (:class:`Ring`). The
engine (:mod:`.engine`) asks it, between decode calls, where pending rows
start (a free slot of the smallest tier their prefix fits, or of a larger
one: an idle slot helps no one) and where the rows that outgrew their window
go: a free slot of a larger tier, else a swap with the shortest row of a
larger tier that fits the smaller window with ``margin`` columns to spare;
a row with neither pauses in its slot until one turns up.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:  # the layout is the host's; its windows go to the decode programs
    import jax


#: The smallest partial window of the default tiers; each next one doubles.
FIRST_WINDOW = 128


@dataclasses.dataclass
class Row:
    """One sample on the host: where it belongs and what it generated so far."""

    request: int
    sample: int
    prompt: np.ndarray
    limit: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    floors: list[float] = dataclasses.field(default_factory=list)  # kept sets (sampling.py)
    # A mixture-of-experts row's record (routing replay): int16 [len(prefix), L, k], each
    # token's experts, -1 for the token not fed yet (the last); None: a dense model.
    routes: np.ndarray | None = None

    @property
    def prefix(self) -> np.ndarray:
        """Prompt and tokens so far; its last token is fed, the rest prefilled."""
        return np.concatenate([self.prompt, np.asarray(self.tokens, np.int32)])

    def share_key(self, share: bool) -> tuple:
        """Rows with the same key use one prefill: the fresh samples of one prompt."""
        return (self.request,) if share and not self.tokens else (self.request, self.sample)


class Ring(NamedTuple):
    """The static layout: each tier's slots and window; the last window is S."""

    tiers: tuple[tuple[int, int, int], ...]  # (first slot, end slot, window)

    def windows(self) -> jax.Array:
        """Each slot's window, [R] int32."""
        import jax.numpy as jnp

        return jnp.concatenate([jnp.full((b - a,), w, jnp.int32) for a, b, w in self.tiers])


def make_ring(
    slots: int, columns: int, tiers: Sequence[Sequence[int]] = (), longest_prompt: int = 0
) -> Ring:
    """The layout for ``slots`` rows of ``columns`` ring columns (see the engine's ``tiers``).

    The default's smallest window is ``FIRST_WINDOW`` or twice the longest prompt,
    whichever is larger: a tier that no prompt fits with room to grow is no use.
    """
    if not tiers:
        windows: list[int] = []
        w = max(FIRST_WINDOW, 2 * longest_prompt)
        while 2 * w <= columns and len(windows) + 1 < slots:
            windows.append(w)
            w *= 2
        weights = [1 / math.sqrt(x) for x in [*windows, columns]]
        rows = [max(1, int(slots * x / sum(weights))) for x in weights]
        rows[0] += slots - sum(rows)
        tiers = [*zip(rows, [*windows, 0])]
    pairs = [(int(r), int(w) or columns) for r, w in tiers]
    if (
        sum(r for r, _ in pairs) != slots
        or any(r < 1 for r, _ in pairs)
        or pairs[-1][1] != columns
        or any(not 1 < w < columns for _, w in pairs[:-1])
        or [w for _, w in pairs] != sorted({w for _, w in pairs})
    ):
        raise ValueError(
            f"engine sampler: tiers {list(tiers)} must be (rows >= 1, window) pairs with rows "
            f"adding up to slots={slots}, windows increasing below the ring's {columns} "
            "columns, and the last window 0 (the whole ring)"
        )
    bounds, start = [], 0
    for r, w in pairs:
        bounds.append((start, start + r, w))
        start += r
    return Ring(tiers=tuple(bounds))


class Table:
    """Which row is in which slot, which are paused, and each slot's tier."""

    def __init__(self, ring: Ring):
        self.ring = ring
        self.rows: list[Row | None] = [None] * ring.tiers[-1][1]
        self.paused: dict[int, int] = {}  # slot -> the step it paused at

    def busy(self) -> bool:
        return any(r is not None for r in self.rows)

    def running(self) -> list[tuple[int, Row]]:
        return [(s, r) for s, r in enumerate(self.rows) if r is not None]

    def tier(self, slot: int) -> tuple[int, int, int]:
        return next(t for t in self.ring.tiers if t[0] <= slot < t[1])

    def free_slot(self, needed: int, above: int = -1) -> int | None:
        """A free slot of the smallest tier with window >= ``needed`` past slot ``above``'s
        tier (any tier for -1), or None."""
        for a, b, w in self.ring.tiers:
            if w < needed or b <= above:
                continue
            for slot in range(a, b):
                if self.rows[slot] is None:
                    return slot
        return None

    def plan_moves(
        self, used: np.ndarray, active: np.ndarray, windows: np.ndarray, step: int, margin: int
    ) -> list[tuple[int, int, int]]:
        """Moves ``[(source, target, end)]`` for the rows that outgrew their window (and
        the paused ones), oldest first, ``end`` the step after the row's last column; the
        rows with nowhere to go are paused."""
        outgrown = [s for s, _ in self.running() if active[s] and used[s] + 1 > windows[s]]
        moves: list[tuple[int, int, int]] = []
        moving: set[int] = set()
        for slot in sorted(self.paused) + outgrown:
            target = self.free_slot(int(used[slot]) + 1, above=slot)
            if target is None:
                target = self._swap_partner(slot, used, windows, margin, moving)
            if target is None:
                self.paused.setdefault(slot, step)
                continue
            end = self.paused.pop(slot, step)
            if self.rows[target] is not None:  # a swap: the shorter row comes down
                moves.append((target, slot, step))
            moves.append((slot, target, end))
            moving |= {slot, target}
            self.rows[target], self.rows[slot] = self.rows[slot], self.rows[target]
        return moves

    def _swap_partner(self, slot, used, windows, margin, moving) -> int | None:
        """The running slot of a larger tier whose row is shortest and fits ``slot``'s window."""
        end = self.tier(slot)[1]
        fits = [
            s
            for s, _ in self.running()
            if s >= end
            and s not in moving
            and s not in self.paused
            and used[s] + margin <= windows[slot]
            and windows[s] > used[slot]
        ]
        return min(fits, key=lambda s: used[s], default=None)
