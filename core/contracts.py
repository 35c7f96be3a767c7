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


class RolloutSource(Protocol):
    """Where the trainer's batches come from and where its weights go.

    The training loop (``core/trainer/loop.py``) holds one and never asks
    which: ``InlineRollouts`` (a sampler in the trainer's process) and
    ``RemoteRollouts`` (the parameter server's rollout queue), both in
    ``core/trainer/sources.py``. A source owns its data position: it says what
    a checkpoint records of it and resumes from it itself. With several
    trainer processes only process 0 calls ``next_batch``, ``done`` and
    ``position``; every process calls the others.
    """

    @property
    def curation(self) -> Sequence[Any]:
        """The trainer's own curation filters, run on every batch (state: ``curation_state``)."""
        ...

    def next_batch(self, version: int) -> tuple[list[Group | np.ndarray], dict[str, float]]:
        """The next batch, for the policy of weight ``version``, and the source's metrics.

        One entry per prompt: the scored :class:`Group` when curation kept it,
        or just its rewards (float32 ``[G]``) when a filter dropped it, so the
        reward metrics still see every sample.
        """
        ...

    def publish(self, params: Any, version: int) -> dict[str, float]:
        """Makes ``params`` the weights rollouts are generated with, as ``version``; its metrics."""
        ...

    def done(self) -> None:
        """The last batch is trained on and its weights published: acknowledge it."""
        ...

    def close(self) -> None:
        """Releases the source's connections (the run is over or stopping)."""
        ...

    def position(self) -> dict[str, Any]:
        """The data position a checkpoint records (JSON): what ``restore`` continues from."""
        ...

    def restore(self, position: dict[str, Any]) -> None:
        """Continues from a checkpoint's ``position``; called only when one was restored.

        Raises:
          SourceMismatch: another kind of source recorded ``position``.
        """
        ...

    def resume(self, params: Any, version: int) -> int:
        """Publishes the restored (or initial) ``params`` of ``version`` and serves from there.

        Returns:
          The version they were published as: ``version``, or a later one when
          versions already served must not be reused (they only grow).
        """
        ...

    def curation_state(self) -> list[dict[str, Any] | None]:
        """Each curation filter's state (None for a stateless one), for the checkpoint."""
        ...

    def load_curation_state(self, states: Sequence[dict[str, Any] | None]) -> None:
        """Puts back the filters' ``curation_state`` from a checkpoint."""
        ...
