"""Filling a batch despite online curation: DAPO's "keep sampling until the batch is full".

An online curation filter may drop groups (``curation.dynamic_sampling``
drops those whose rewards are all equal). A filter that wants the dropped
groups replaced declares ``extra_rounds`` (it is
:class:`rlax.core.contracts.Refilling`): how many more rounds of sampling the
loop may spend per update. :func:`fill_batch` is the loop's side of that
contract, independent of where rounds come from (a sampler in the trainer's
process, or the parameter server's rollout queue).

An *entry* is what a round yields per prompt: the scored :class:`Group` when
curation kept it, or a :class:`DroppedGroup` (just its rewards) when a filter
dropped it, so that reward and pass-rate metrics still see every sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlax.core.contracts import OnlineFilter, Refilling
from rlax.core.types import DroppedGroup, Group

Entry = Group | DroppedGroup


def extra_rounds(curation: Sequence[OnlineFilter]) -> int:
    """The most extra sampling rounds any of the online filters asks for (0 if none does).

    Only a :class:`~rlax.core.contracts.Refilling` filter asks for any; the
    others only filter.
    """
    return max((int(f.extra_rounds) for f in curation if isinstance(f, Refilling)), default=0)


def fill_batch(
    take_round: Callable[[int], list[Entry]], *, target: int, extra_rounds: int
) -> tuple[list[Entry], dict[str, float]]:
    """Takes rounds of ``target`` entries until ``target`` groups are kept or the cap is hit.

    Args:
      take_round: samples (or takes from the queue) ``n`` prompts' entries; it
        may return fewer once ``target`` groups are kept (a queue is a stream,
        so the remote source stops there instead of taking surplus).
      target: groups per update (the loop's prompts per step).
      extra_rounds: rounds allowed after the first; 0 takes exactly one round.

    Returns:
      Every entry taken, in order, with the groups beyond the first ``target``
      replaced by their rewards (seen by the metrics, not trained on), and
      the step's metrics: ``extra_rounds`` (rounds taken after the first),
      ``groups_filtered`` (groups curation dropped, over all rounds) and
      ``groups_surplus`` (kept groups beyond ``target``, not trained on).
    """
    if target < 1 or extra_rounds < 0:
        raise ValueError(
            f"fill_batch: need target >= 1 and extra_rounds >= 0, got {target}, {extra_rounds}"
        )
    entries: list[Entry] = []
    rounds = 0
    while True:
        entries.extend(take_round(target))
        rounds += 1
        kept = sum(isinstance(e, Group) for e in entries)
        if kept >= target or rounds > extra_rounds:
            break
    out: list[Entry] = []
    n = 0
    for e in entries:
        if isinstance(e, Group) and n >= target:
            out.append(e.dropped())
            continue
        n += isinstance(e, Group)
        out.append(e)
    info = {
        "extra_rounds": float(rounds - 1),
        "groups_filtered": float(len(entries) - kept),
        "groups_surplus": float(kept - n),
    }
    return out, info
