"""gin configurables: a factory registered under ``<module>.<name>``, replaceable.

gin keeps one registry per process. :func:`register_configurables` therefore
replaces an entry whose factory changed, so a new plugin manager built in the
same process (tests build many) takes over its kinds cleanly. What rlax
registered is recorded here (:func:`configurables` answers from that record,
not from gin's registry), and :func:`kept` puts the record, gin's registry and
gin's bindings back as they were after a block that built a plugin manager of
its own (the test suite runs every test in one: a docs example that registers
one weight lane must not leave a later test with that lane alone).

It sits below everything that registers (the plugin manager, the gin front in
``rlax.core.config``) and touches gin's registry only through :mod:`rlax.core.gin_state`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import gin

from rlax.core import gin_state

__all__ = ["configurables", "kept", "register_configurables", "selector_of"]

#: ``{gin module: {name: factory}}``: what :func:`register_configurables` registered.
_registered: dict[str, dict[str, Callable[..., Any]]] = {}


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
      exclusive: also drop every other configurable registered here under
        ``module``, so the module holds exactly ``factories`` (used for the plugin kinds).
    """
    record = _registered.setdefault(module, {})
    with gin.unlock_config():
        if exclusive:
            for name in [n for n in record if n not in factories]:
                gin_state.unregister(f"{module}.{name}")
                del record[name]
        for name, factory in factories.items():
            if record.get(name) is factory:
                continue
            gin_state.unregister(f"{module}.{name}")
            gin.external_configurable(factory, name=name, module=module)
            record[name] = factory
    if not record:
        del _registered[module]


def configurables(module: str) -> dict[str, Callable[..., Any]]:
    """The gin-wrapped callables registered under ``module`` by name (bindings applied on call).

    For a plugin kind: the components of the plugin manager loaded last (``{}``
    if none was loaded, or it had none of the kind).
    """
    return {name: gin.get_configurable(f"{module}.{name}") for name in _registered.get(module, {})}


def selector_of(component: Any) -> str | None:
    """The gin name (``rewards.math``) whose factory is ``component``'s class (None: none)."""
    for module, factories in _registered.items():
        for name, factory in factories.items():
            if isinstance(factory, type) and type(component) is factory:
                return f"{module}.{name}"
    return None


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Puts the registrations and gin's bindings back as they were before the block.

    Whatever the block registered (a plugin manager it built, say) is
    dropped, what it replaced comes back, and gin's bindings (parsed,
    finalized or not) are restored (:func:`rlax.core.gin_state.kept_bindings`).
    """
    saved = {module: dict(factories) for module, factories in _registered.items()}
    with gin_state.kept_bindings():
        try:
            yield
        finally:
            for module in [*_registered, *(m for m in saved if m not in _registered)]:
                register_configurables(module, saved.get(module, {}), exclusive=True)
