"""The worker's rule between its settings and the run's sampler.

``rlax.worker.reload_in_flight`` needs a Resumable sampler: checked with the whole run
specification before any role starts (:mod:`rlax.core.spec.rules`), and by the worker
itself for a run built by other means (:func:`check_reload_in_flight`).
"""

from __future__ import annotations

from rlax.core.contracts import Resumable
from rlax.core.errors import ConfigError

__all__ = ["check_reload_in_flight"]


def _not_resumable(name: str) -> str:
    return (
        f"{name} is not Resumable (no generate_groups), so it loads weights between batches "
        "only; set it to False"
    )


def check_reload_in_flight(sampler: object, reload_in_flight: bool) -> None:
    """ConfigError if in-flight reloads are asked of a sampler that cannot do them."""
    if reload_in_flight and not isinstance(sampler, Resumable):
        raise ConfigError(f"rlax.worker.reload_in_flight: {_not_resumable(type(sampler).__name__)}")
