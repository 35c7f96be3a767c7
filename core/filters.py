"""The curation filters' contract (``rlax_register_curation_filters``): capabilities.

A filter has one or more of these capabilities; the core asks which with
``isinstance`` (the Protocols are runtime-checkable), never with ``hasattr``.
:mod:`rlax.core.contracts` re-exports them; their members are documented here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rlax.core.types import Curated, Group, Prompt

__all__ = ["Curriculum", "OfflineFilter", "OnlineFilter", "Refilling", "Stateful"]


@runtime_checkable
class OnlineFilter(Protocol):
    """A filter of scored groups, run by the workers and the trainer each round."""

    def online(self, groups: Sequence[Group]) -> list[Group]:
        """The groups it keeps, the same objects, in order (a dropped group's
        rewards still count in the step's metrics)."""


@runtime_checkable
class OfflineFilter(Protocol):
    """A filter of a whole dataset before training, run by ``rlax curate``."""

    def offline(self, prompts: Sequence[Prompt]) -> Curated:
        """The prompts it keeps, in order, in ``.kept``; the others in
        ``.dropped``, each a :class:`~rlax.core.types.Dropped` with its reason."""


@runtime_checkable
class Curriculum(Protocol):
    """A prompt curriculum, run by the parameter server (and the inline trainer)."""

    def admit(self, prompts: Sequence[Prompt]) -> list[Prompt]:
        """The prompts that may be served now (called before leasing or sampling them)."""

    def observe(self, prompt_id: str, rewards: np.ndarray) -> bool:
        """Records one scored attempt, float32 rewards [G] (also of a group a
        filter dropped); False if the prompt was already retired."""


@runtime_checkable
class Refilling(Protocol):
    """An online filter that wants the groups it drops replaced (DAPO's dynamic sampling)."""

    @property
    def extra_rounds(self) -> int:
        """How many more rounds of sampling per update may replace dropped
        groups (:func:`rlax.core.trainer.filling.fill_batch`); the loop takes
        the largest over its filters."""


@runtime_checkable
class Stateful(Protocol):
    """A filter with state a checkpoint must keep (a curriculum's history)."""

    def state_dict(self) -> dict[str, Any]:
        """Its state as JSON-serialisable values, saved with each checkpoint."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what ``state_dict`` returned, on resume."""
