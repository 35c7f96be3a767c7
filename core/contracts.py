"""What the core calls on each kind of component: one Protocol per contract.

A plugin implements these; the core's signatures are typed with them. Each
member is documented once, here, and ``docs/plugin_hooks.md`` lists the same
members (``tests/test_contracts.py`` checks that the two agree).
Shapes follow the legend in :mod:`rlax.core.types`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

from rlax.core.types import Completion, Group, Prompt, RewardResult

# -------------------------------------------------------------------------
# Algorithms (rlax_register_algorithms)
# -------------------------------------------------------------------------


class Algorithm(Protocol):
    """What the trainer needs of an algorithm plugin.

    An algorithm with ``needs_critic`` also names its critic's architecture
    in ``value_model`` (``"head"`` or ``"separate"``).
    """

    needs_reference: bool
    needs_critic: bool

    def advantages(self, rewards: np.ndarray) -> np.ndarray: ...

    def loss(
        self, new_logprobs: jax.Array, batch: dict[str, jax.Array]
    ) -> tuple[jax.Array, dict]: ...


# -------------------------------------------------------------------------
# Samplers (rlax_register_samplers)
# -------------------------------------------------------------------------


class Sampler(Protocol):
    version: int

    def generate(
        self, prompts: Sequence[Prompt], n: int, *, seed: int
    ) -> list[tuple[Completion, ...]]: ...


# -------------------------------------------------------------------------
# Rewards (rlax_register_rewards)
# -------------------------------------------------------------------------


class Reward(Protocol):
    def score(self, prompt: Prompt, completion_text: str) -> float | RewardResult: ...


# -------------------------------------------------------------------------
# Tasks (rlax_register_tasks)
# -------------------------------------------------------------------------


# -------------------------------------------------------------------------
# Curation filters (rlax_register_curation_filters)
# -------------------------------------------------------------------------
# A filter has one or more of these capabilities; the core asks which with
# ``isinstance`` (the Protocols are runtime-checkable), never with ``hasattr``.


@runtime_checkable
class OnlineFilter(Protocol):
    def online(self, groups: Sequence[Group]) -> list[Group]: ...


@runtime_checkable
class Curriculum(Protocol):
    def admit(self, prompts: Sequence[Prompt]) -> list[Prompt]: ...

    def observe(self, prompt_id: str, rewards: np.ndarray) -> bool: ...


@runtime_checkable
class Refilling(Protocol):
    extra_rounds: int


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


# -------------------------------------------------------------------------
# Rollout sources (the trainer's; not a plugin kind)
# -------------------------------------------------------------------------
