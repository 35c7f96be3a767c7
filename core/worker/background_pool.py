"""A worker's reward pool that boots in the background.

A :class:`~rlax.core.rollout.reward_pool.RewardPool` starts its verifier processes (each a
fresh interpreter that imports the reward) and waits until every one is ready: seconds,
which a worker coming back from a preemption spent before it even pulled its weights
(docs/preemption.md, "What a preemption costs"). :class:`BackgroundPool` boots the same
pool in a thread, so the processes start while the worker sets its model up, pulls the
weights, leases prompts and generates; the first score waits for them if they are not
ready yet. A pool that fails to start raises at that first score (or at ``close``'s caller
never: closing a pool that never started does nothing).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from rlax.core.rollout.reward_pool import PoolScores, RewardPool
from rlax.core.types import Prompt

__all__ = ["BackgroundPool"]


class BackgroundPool(RewardPool):
    """A :class:`RewardPool` (same arguments) whose processes boot in a thread.

    Args:
      reward: the reward to run in the pool's processes.
      **settings: RewardPool's ``workers``, ``timeout_s``, ... .
    """

    def __init__(self, reward: Any, **settings: Any):
        self._failed: BaseException | None = None
        self._boot = threading.Thread(
            target=self._start, args=(reward, settings), name="reward-pool-boot", daemon=True
        )
        self._boot.start()

    def _start(self, reward: Any, settings: dict[str, Any]) -> None:
        try:
            super().__init__(reward, **settings)
        except BaseException as err:  # noqa: BLE001 -- raised where the pool is first used
            self._failed = err

    def ready(self) -> None:
        """Waits until the pool's processes are ready; raises what stopped them, if anything."""
        self._boot.join()
        if self._failed is not None:
            raise self._failed

    @property
    def workers(self) -> int:
        self.ready()
        return super().workers

    def score(self, prompts: Sequence[Prompt], texts: Sequence[str]) -> PoolScores:
        self.ready()
        return super().score(prompts, texts)

    def close(self) -> None:
        self._boot.join()
        if self._failed is None:
            super().close()
