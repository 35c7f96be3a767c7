"""DAPO's dynamic sampling as an online curation filter.

A group whose completions all got the same reward has zero group-relative
advantage, so it adds no gradient and only shrinks the effective batch.
DAPO drops such groups and *keeps sampling until the batch is full*:

.. math::

   \\text{keep group } i \\iff 0 < |\\{j : o_{i,j}\\ \\text{correct}\\}| < G
   \\quad(\\text{here: } \\max_j R_{i,j} - \\min_j R_{i,j} > \\text{tolerance})

The filter does the first half, ``online(groups)``, a pure function that
workers and the trainer can both run. The second half belongs to whoever
assembles the batch: the filter declares ``extra_rounds``, the number of
additional sampling rounds the loop may spend per update to replace what it
dropped, and :func:`rlax.core.trainer.filling.fill_batch` is the loop's side of
that contract (take rounds until ``prompts_per_step`` groups survive or the
extra rounds are spent; surplus groups are not trained on, as in the
paper's implementation, rather than kept for a later, off-policy update).
With ``extra_rounds = 0`` this is exactly ``curation.zero_variance``.

Reference: Yu et al., 2025, DAPO, https://arxiv.org/abs/2503.14476 (eq. 11 and
section 3.2, "Dynamic Sampling").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import numpy as np

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, NonNegative
from rlax.core.types import Group


class DynamicSampling:
    """Drops groups with all-equal rewards and asks the loop to sample replacements.

    Args:
      extra_rounds: how many more sampling rounds per update the loop may
        spend to fill the batch (DAPO's cap on generation rounds, minus one).
      tolerance: a group is kept if max(reward) - min(reward) exceeds it.
    """

    def __init__(
        self,
        *,
        extra_rounds: Annotated[int, AtLeast(0)] = 3,
        tolerance: Annotated[float, NonNegative] = 0.0,
    ):
        if extra_rounds < 0 or tolerance < 0:
            raise ValueError(
                "dynamic_sampling: need extra_rounds >= 0 and tolerance >= 0, "
                f"got extra_rounds={extra_rounds}, tolerance={tolerance}"
            )
        self.extra_rounds = extra_rounds
        self.tolerance = tolerance

    def online(self, groups: Sequence[Group]) -> list[Group]:
        """The groups whose rewards are not all equal, in their order."""
        return [g for g in groups if np.ptp(g.rewards) > self.tolerance]


@hookimpl
def rlax_register_curation_filters():
    return {"dynamic_sampling": DynamicSampling}
