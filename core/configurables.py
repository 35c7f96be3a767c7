"""gin configurables: a factory registered under ``<module>.<name>``, replaceable.

gin keeps one registry per process. :func:`register_configurables` therefore
replaces an entry whose factory changed, so a new plugin manager built in the
same process (tests build many) takes over its kinds cleanly. It sits below
everything that registers (the plugin manager, the gin front in
``rlax.core.config``) and reads gin's registry only through :mod:`rlax.core.gin_state`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gin

from rlax.core import gin_state

__all__ = ["configurables", "register_configurables"]


def register_configurables(
    module: str, factories: Mapping[str, Callable[..., Any]], *, exclusive: bool = False
) -> None:
    """Makes each factory the gin configurable ``<module>.<name>``; idempotent.

    An entry already registered under that selector is kept if it wraps the
    same factory and replaced otherwise. Registration works even after the
    config was finalized (locked): it adds names, it binds no values.

    Args:
      module: the gin module, e.g. ``"rewards"`` or ``"optax"``.
      factories: configurable name -> class or function.
      exclusive: also drop every other configurable of ``module``, so the
        module holds exactly ``factories`` (used for the plugin kinds).
    """
    with gin.unlock_config():
        if exclusive:
            for selector in gin_state.registered_selectors():
                owner, _, name = selector.rpartition(".")
                if owner == module and name not in factories:
                    gin_state.unregister(selector)
        for name, factory in factories.items():
            selector = f"{module}.{name}"
            current = gin_state.configurable_of(selector)
            if current is factory:
                continue
            gin_state.unregister(selector)
            gin.external_configurable(factory, name=name, module=module)


def configurables(module: str) -> dict[str, Callable[..., Any]]:
    """The gin-wrapped callables of ``module`` by name (bindings applied on call).

    For a plugin kind: the components of the plugin manager loaded last.
    """
    found = {}
    for selector in gin_state.registered_selectors():
        owner, _, name = selector.rpartition(".")
        if owner == module:
            found[name] = gin.get_configurable(selector)
    return found
