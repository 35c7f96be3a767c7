"""Online filter: drop groups whose completions all got the same reward.

Such a group has zero group-relative advantage everywhere, so it only dilutes
the batch (DAPO's dynamic sampling keeps sampling to replace them; that is the
algorithm suite's job, this filter is the reusable half).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import numpy as np

from rlax.core import hookimpl
from rlax.core.constraints import NonNegative
from rlax.core.types import Group


class ZeroVarianceFilter:
    """Keeps a group only if max(reward) - min(reward) > ``tolerance``."""

    def __init__(self, *, tolerance: Annotated[float, NonNegative] = 0.0):
        if tolerance < 0:
            raise ValueError(f"zero_variance: tolerance must be >= 0, got {tolerance}")
        self.tolerance = tolerance

    def online(self, groups: Sequence[Group]) -> list[Group]:
        return [g for g in groups if np.ptp(g.rewards) > self.tolerance]


@hookimpl
def rlax_register_curation_filters():
    return {"zero_variance": ZeroVarianceFilter}
