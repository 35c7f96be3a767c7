"""gin's private state, read (and, where gin has no public way, changed) in one place.

gin-config keeps its bindings (``gin.config._CONFIG``), its registry of
configurables (``_REGISTRY``) and its file readers (``_FILE_READERS``) in
process-global private variables, and its public API cannot list them. This
module is the only one in rlax that touches them (``tests/test_architecture.py``
holds that), each use a small named function, so a new gin-config version is
checked here (:func:`_registry`) and nowhere else. Everything else uses gin's
public API (``gin.bind_parameter``, ``gin.query_parameter``, ``gin.get_configurable``).

It sits in the base layer, beside :mod:`rlax.core.configurables`, which
registers through it, and imports nothing of rlax.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import IO, Any

import gin

__all__ = [
    "all_bindings",
    "bindings_of",
    "bound_selectors",
    "configurable_of",
    "file_readers",
    "first_file_reader",
    "is_registered",
    "kept_bindings",
    "matching_configurable",
    "registered_selectors",
    "unregister",
    "watching_bindings",
]

FileReader = tuple[
    Callable[[str], contextlib.AbstractContextManager[IO[str]]], Callable[[str], bool]
]


def _registry() -> Any:
    """gin's registry of configurables (a ``SelectorMap``), checked to be one."""
    registry = getattr(gin.config, "_REGISTRY", None)
    if not all(hasattr(registry, attr) for attr in ("pop", "get", "get_match", "items")):
        raise RuntimeError(
            "gin.config._REGISTRY is not the SelectorMap rlax expects "
            "(pop/get/get_match/items); unsupported gin-config version"
        )
    return registry


def _config() -> dict[tuple[str, str], dict[str, Any]]:
    config = getattr(gin.config, "_CONFIG", None)
    if not isinstance(config, dict):
        raise RuntimeError(  # noqa: TRY004 -- a gin version problem, not a caller's type error
            "gin.config._CONFIG is not a dict; unsupported gin-config version"
        )
    return config


# -------------------------------------------------------------------------
# Bindings
# -------------------------------------------------------------------------


def all_bindings() -> list[tuple[str, str, dict[str, Any]]]:
    """Every binding now: ``(scope, selector, {parameter: value})``, in gin's order.

    A snapshot (changing gin afterwards leaves it as it was); values as gin
    holds them, references and macros (selector ``gin.macro``) not evaluated.
    """
    return [(scope, selector, dict(params)) for (scope, selector), params in _config().items()]


def bindings_of(selector: str, scope: str = "") -> dict[str, Any]:
    """The values bound to the full ``selector`` in exactly ``scope`` (not inherited).

    ``{}`` if none. References and macros are not evaluated (unlike
    ``gin.get_bindings``, which also takes the current scope and the enclosing ones).
    """
    return dict(_config().get((scope, selector), {}))


def bound_selectors() -> list[str]:
    """The selectors with at least one binding, in any scope, once each in gin's order
    (macros: ``gin.macro``)."""
    return list(dict.fromkeys(selector for _, selector in _config()))


@contextlib.contextmanager
def watching_bindings(
    seen: Callable[[tuple[str, str, str], str | None, int], None],
) -> Iterator[None]:
    """Calls ``seen((scope, selector, parameter), file, line)`` after each binding gin makes
    in the block, with the file and line gin's parser was at (``None, 0``: no file).

    gin's parser enters ``gin.utils.try_with_location(location)`` around each
    ``gin.config.bind_parameter`` call and looks both up on their modules at
    call time, so replacing them for the block sees every binding, an
    ``include``'s too. gin has no public hook for this.
    """
    utils, config = gin.utils, gin.config
    try_with_location, bind_parameter = utils.try_with_location, config.bind_parameter
    current: list[Any] = [None]

    @contextlib.contextmanager
    def located(location: Any) -> Iterator[None]:
        current.append(location)
        try:
            with try_with_location(location):
                yield
        finally:
            current.pop()

    def bind(binding_key: tuple[str, str, str], value: Any) -> None:
        bind_parameter(binding_key, value)
        location = current[-1]
        file = getattr(location, "filename", None) or None
        seen(binding_key, file, getattr(location, "line_num", 0) if file else 0)

    utils.try_with_location, config.bind_parameter = located, bind
    try:
        yield
    finally:
        utils.try_with_location, config.bind_parameter = try_with_location, bind_parameter


@contextlib.contextmanager
def kept_bindings() -> Iterator[None]:
    """Puts gin's bindings back as they were before the block: the values, the imports,
    the operative config, the singletons built and whether the config was locked.

    (So a block may parse, finalize or clear the config; the registry of
    configurables is :func:`rlax.core.configurables.kept`'s.)
    """
    config = gin.config
    nested = (_config(), config._OPERATIVE_CONFIG)  # {key: {parameter: value}}, bound in place
    flat = (config._IMPORTS, config._SINGLETONS)
    saved_nested = [{key: dict(params) for key, params in part.items()} for part in nested]
    saved_flat = [copy.copy(part) for part in flat]
    locked = gin.config_is_locked()
    try:
        yield
    finally:
        for part, before in zip((*nested, *flat), (*saved_nested, *saved_flat), strict=True):
            part.clear()
            part.update(before)
        config._set_config_is_locked(locked)


# -------------------------------------------------------------------------
# The registry of configurables
# -------------------------------------------------------------------------


def is_registered(selector: str) -> bool:
    """Whether a configurable is registered under the full ``selector``."""
    return _registry().get(selector) is not None


def configurable_of(selector: str) -> Callable[..., Any] | None:
    """The function or class registered under the full ``selector``, unwrapped (None: none)."""
    return getattr(_registry().get(selector), "wrapped", None)


def matching_configurable(selector: str) -> Callable[..., Any] | None:
    """As :func:`configurable_of` for a partial selector (``grpo`` for ``algorithms.grpo``).

    None if none matches; gin's ``ValueError`` if several do.
    """
    return getattr(_registry().get_match(selector), "wrapped", None)


def registered_selectors() -> list[str]:
    """The full selectors of every configurable registered in this process."""
    return [selector for selector, _ in list(_registry().items())]


def unregister(selector: str) -> None:
    """Drops the configurable ``selector`` from gin's registry (gin has no public way).

    Its bindings stay. A no-op if it is not registered.
    """
    registry = _registry()
    if registry.get(selector) is not None:
        registry.pop(selector)


# -------------------------------------------------------------------------
# File readers
# -------------------------------------------------------------------------


def file_readers() -> list[FileReader]:
    """gin's file readers, in the order it tries them (a copy)."""
    return list(_file_readers())


def _file_readers() -> list[FileReader]:
    readers = getattr(gin.config, "_FILE_READERS", None)
    if not isinstance(readers, list):
        raise RuntimeError(  # noqa: TRY004 -- a gin version problem, not a caller's type error
            "gin.config._FILE_READERS is not a list; unsupported gin-config version"
        )
    return readers


@contextlib.contextmanager
def first_file_reader(reader: FileReader) -> Iterator[None]:
    """Puts ``reader`` (``(open, can_open)``) first while in the block; then removes it.

    ``gin.register_file_reader`` only appends, for good; the order matters to
    resolve an include against the including file's folder first.
    """
    readers = _file_readers()
    readers.insert(0, reader)
    try:
        yield
    finally:
        readers.remove(reader)
