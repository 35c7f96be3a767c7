"""The worker's rules between its settings and the components they build.

``rlax.worker.reload_in_flight`` needs a Resumable sampler: refused before any
role starts when the sampler is bound by reference (:func:`reload_needs_resumable`,
a ``checked_by`` rule that sees the sampler's class), and by the worker once it
is built (:func:`check_reload_in_flight`, for any other way of building one).
"""

from __future__ import annotations

from typing import Any

from rlax.core.constraints import Built
from rlax.core.contracts import Resumable
from rlax.core.errors import BadSetting, ConfigError

__all__ = ["check_reload_in_flight", "reload_needs_resumable"]


def reload_needs_resumable(*, sampler: Any = None, reload_in_flight: Any = False, **_: Any) -> None:
    """BadSetting before any role starts: in-flight reloads of a sampler bound by reference
    (``Built``) whose class cannot do them (the rule :func:`check_reload_in_flight` holds
    once it is built)."""
    factory = sampler.factory if isinstance(sampler, Built) else None
    if reload_in_flight is True and isinstance(factory, type) and not _resumable(factory):
        raise BadSetting("reload_in_flight", _not_resumable(factory.__name__))


def _resumable(cls: type) -> bool:
    return callable(getattr(cls, "generate_groups", None))  # Resumable's one member


def _not_resumable(name: str) -> str:
    return (
        f"{name} is not Resumable (no generate_groups), so it loads weights between batches "
        "only; set it to False"
    )


def check_reload_in_flight(sampler: object, reload_in_flight: bool) -> None:
    """ConfigError if in-flight reloads are asked of a sampler that cannot do them."""
    if reload_in_flight and not isinstance(sampler, Resumable):
        raise ConfigError(f"rlax.worker.reload_in_flight: {_not_resumable(type(sampler).__name__)}")
