"""What a role's call does with a component that refuses its settings as gin builds it.

gin builds the components a role's bindings name (``rlax.run.reward =
@rewards.format()``) before the role's own code runs. A component that refuses
what it was given there (a ``ValueError`` from its constructor: a template
without a column, a pattern that is not a regular expression) fails the same
way on every try, so it is a configuration error, not a crash: the process
exits with status 2 and one line, and a supervisor restarts nothing. An error
raised once the role's own code runs keeps its type (and its traceback).
"""

from __future__ import annotations

import functools
import inspect
import traceback
from collections.abc import Callable
from typing import Any

from rlax.core.errors import ConfigError

__all__ = ["BUILD_REFUSALS", "refusing_components"]

# What a constructor raises when it refuses its settings or the data they name.
BUILD_REFUSALS: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    LookupError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
)


def refusing_components(role: Callable[..., Any]) -> Callable[..., Any]:
    """``role`` (a gin configurable: a function, or a class whose own code is its
    ``__init__``), whose components' refusals are ConfigErrors.

    A :data:`BUILD_REFUSALS` error raised while gin builds ``role``'s arguments
    (no frame of ``role``'s own code in its traceback) becomes a ConfigError
    whose one line names the component: ``tasks.dataset: template 'x' uses no
    column``.
    """
    target: Any = inspect.unwrap(role)  # a class: its own code is its __init__
    own = inspect.getattr_static(target, "__init__") if isinstance(target, type) else target
    code = getattr(inspect.unwrap(own), "__code__", None)

    @functools.wraps(role)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return role(*args, **kwargs)
        except BUILD_REFUSALS as exc:
            if isinstance(exc, ConfigError) or _ran(code, exc):
                raise
            raise ConfigError(_one_line(exc)) from exc

    return call


def _ran(code: Any, exc: BaseException) -> bool:
    return code is not None and any(
        frame.f_code is code for frame, _ in traceback.walk_tb(exc.__traceback__)
    )


def _one_line(exc: BaseException) -> str:
    """The refusal's first line, prefixed with the component gin was building unless it
    names it already."""
    first = str(exc).split("\n")[0].strip() or type(exc).__name__
    if isinstance(exc, KeyError) and first[:1] in "'\"":  # a missing key: the key, quoted
        first = f"no {first}"
    name = _innermost_selector(exc)
    if not name or first.startswith((name, name.rsplit(".", 1)[-1])):
        return first
    return f"{name}: {first}"


def _innermost_selector(exc: BaseException) -> str:
    """The selector of the innermost configurable gin was calling (its wrapper's frame)."""
    selector = ""
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_name == "gin_wrapper" and isinstance(
            found := frame.f_locals.get("selector"), str
        ):
            selector = found
    return selector
