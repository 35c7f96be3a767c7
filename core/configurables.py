"""gin configurables: a factory registered under ``<module>.<name>``, replaceable.

gin keeps one registry per process. :func:`register_configurables` therefore
replaces an entry whose factory changed, so a new plugin manager built in the
same process (tests build many) takes over its kinds cleanly. It sits below
everything that registers (the plugin manager, the gin front in
``rlax.core.config``) and imports nothing of rlax.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gin

__all__ = ["configurables", "gin_registry", "register_configurables"]


def gin_registry() -> Any:
    """gin's process-global registry of configurables (a ``SelectorMap``)."""
    registry = getattr(gin.config, "_REGISTRY", None)
    if not all(hasattr(registry, attr) for attr in ("pop", "get", "items")):
        raise RuntimeError(
            "gin.config._REGISTRY is not the SelectorMap rlax expects (pop/get/items); "
            "this gin-config version is unsupported for re-registering configurables"
        )
    return registry


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
    registry = gin_registry()
    with gin.unlock_config():
        if exclusive:
            for selector, info in list(registry.items()):
                if info.module == module and info.name not in factories:
                    registry.pop(selector)
        for name, factory in factories.items():
            current = registry.get(f"{module}.{name}")
            if current is not None and current.wrapped is factory:
                continue
            if current is not None:
                registry.pop(f"{module}.{name}")
            gin.external_configurable(factory, name=name, module=module)


def configurables(module: str) -> dict[str, Callable[..., Any]]:
    """The gin-wrapped callables of ``module`` by name (bindings applied on call).

    For a plugin kind: the components of the plugin manager loaded last.
    """
    return {
        info.name: gin.get_configurable(selector)
        for selector, info in list(gin_registry().items())
        if info.module == module
    }
