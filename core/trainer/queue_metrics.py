"""What a batch taken from the parameter server's queue reports beside its groups.

:func:`staleness_metrics` checks the staleness rule on the batch's groups and
counts them by age; :class:`QueueMetrics` reads the queue's ``Stat`` (its depth,
the workers' idle fraction, the reward errors) and turns the workers' summed
seconds into the seconds since the last batch. Both are the metrics of
:meth:`rlax.core.trainer.sources.RemoteRollouts.next_batch`.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from rlax.core.trainer.filling import Entry
from rlax.core.types import Group


def staleness_metrics(
    entries: Sequence[Entry], version: int, max_staleness: int
) -> dict[str, float]:
    """``staleness_<age>``: how many groups of the batch for ``version`` are that many
    versions old; raises if one is older than ``max_staleness`` (or from the future)."""
    ages = collections.Counter(version - g.policy_version for g in entries if isinstance(g, Group))
    if any(age > max_staleness or age < 0 for age in ages):
        raise RuntimeError(f"staleness rule violated: ages {dict(ages)} with max {max_staleness}")
    return {f"staleness_{age}": float(n) for age, n in sorted(ages.items())}


class QueueMetrics:
    """The queue's and its workers' metrics, one call per batch (it remembers the last call's
    summed worker seconds)."""

    def __init__(self) -> None:
        self._worker_s: dict[str, float] = {}  # the last Stat's summed worker seconds

    def __call__(self, q: Any) -> dict[str, float]:
        """The metrics of the queue's ``Stat`` ``q``."""
        total = q.worker_idle_s + q.worker_busy_s
        info = {
            "queue_depth": float(q.queued),
            "worker_idle_fraction": q.worker_idle_s / total if total else 0.0,
            "reward_errors": float(q.reward_errors),
            "reward_timeouts": float(q.reward_timeouts),
            # Versions the workers' weight-load check refused, summed (rlax.core.rollout.probe).
            "probe_refused": float(q.probe_refused),
        }
        # The workers' sampling and scoring seconds since the last batch, summed over
        # workers (so more than the step's wall time with several); a restarted worker
        # starts its count again, which never makes these negative.
        for name, total in (("generate", q.worker_generate_s), ("score", q.worker_score_s)):
            info[f"worker_{name}_s"] = max(0.0, total - self._worker_s.get(name, 0.0))
            self._worker_s[name] = total
        return info
