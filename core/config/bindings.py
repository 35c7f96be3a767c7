"""Where each gin binding came from, the literals behind its macros, and paths in gin files.

:func:`rlax.core.config.parse` records the origin of every binding it reads
(``FILE:LINE``, or ``--gin.NAME=VALUE`` for a command-line binding) in a
:class:`Origins`; then, before gin locks the config:

- :func:`resolve_paths` turns each relative path written in a gin file into a
  path relative to that file's folder, for the parameters annotated
  :data:`~rlax.core.types.ConfigPath` (a path given on the command line stays
  relative to the working directory, as a shell user expects);
- :mod:`rlax.core.config.checks` checks the bound values, naming where each
  was written.

:func:`bound_values` walks the bindings with each literal found through its
macros; :func:`hints` reads a configurable's annotations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
import os
import pathlib
import re
import typing
from collections.abc import Iterator
from typing import Any

import gin

from rlax.core import gin_state
from rlax.core.types import PATH_MARK

__all__ = [
    "MACRO",
    "Bound",
    "Origin",
    "Origins",
    "bound_values",
    "closest_names",
    "follow",
    "hints",
    "is_reference",
    "parameter_names",
    "recording",
    "resolve_paths",
    "show",
]

MACRO = "gin.macro"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")  # pypi:DIST, hf:..., not a drive letter


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a binding was written: a file and line, or a command-line binding."""

    file: str | None = None
    line: int = 0
    binding: str | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.file else f"--gin.{self.binding}"


class Origins:
    """``(scope, selector, parameter) -> Origin`` for the bindings parsed so far; the last wins."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str, str], Origin] = {}

    def record(self, scope: str, selector: str, arg: str, origin: Origin) -> None:
        try:
            key = gin.config.ParsedBindingKey.parse((scope, selector, arg))
        except (ValueError, KeyError):  # unknown: gin reports it with its own location
            return
        self._by_key[(key.scope, key.complete_selector, key.arg_name)] = origin

    def get(self, scope: str, selector: str, arg: str) -> Origin | None:
        return self._by_key.get((scope, selector, arg))


@contextlib.contextmanager
def recording(origins: Origins, binding: str | None = None) -> Iterator[None]:
    """Records the origin of each binding gin makes while parsing, in gin's own order.

    ``binding``: the command-line binding being parsed (gin gives it no file).
    """

    def seen(binding_key: tuple[str, str, str], file: str | None, line: int) -> None:
        if file:  # a file, one included by a binding too
            origin = Origin(file=file, line=line)
        else:
            origin = Origin(binding=binding or "?")
        scope, selector, arg = binding_key  # the parser binds (scope, selector, arg)
        origins.record(scope, selector, arg, origin)

    with gin_state.watching_bindings(seen):
        yield


def closest_names(name: str, valid: list[str]) -> str:
    """``"; did you mean 'steps'? valid: a, b, ..."`` for an unknown parameter ``name``."""
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"{hint} (valid: {', '.join(sorted(valid))})"


# -------------------------------------------------------------------------
# Walking the bindings
# -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Bound:
    """One bound parameter, with its literal value (macros followed) and where that was written."""

    selector: str
    scope: str
    arg: str
    value: Any
    origin: Origin | None
    macro: tuple[str, str] | None  # the config key of the macro that holds the literal

    @property
    def name(self) -> str:
        return "/".join(filter(None, (self.scope, f"{self.selector}.{self.arg}")))


def follow(value: Any, origins: Origins, origin: Origin | None, macro=None, depth: int = 0):
    """``(literal, its origin, its macro key)``: a macro reference is replaced by its value."""
    ref = value
    if isinstance(ref, gin.config.ConfigurableReference) and ref.selector == MACRO and depth < 32:
        name = "/".join(ref.scopes)
        bound = gin_state.bindings_of(MACRO, name)
        if "value" in bound:
            return follow(
                bound["value"], origins, origins.get(name, MACRO, "value"), (name, MACRO), depth + 1
            )
    return value, origin, macro


def bound_values(origins: Origins) -> Iterator[Bound]:
    for scope, selector, params in gin_state.all_bindings():
        if selector == MACRO:
            continue
        for arg, value in params.items():
            literal, origin, macro = follow(value, origins, origins.get(scope, selector, arg))
            yield Bound(selector, scope, arg, literal, origin, macro)


def hints(selector: str) -> dict[str, Any]:
    """The parameter annotations of the configurable ``selector`` ({} if they cannot be read)."""
    fn = gin_state.configurable_of(selector)
    if fn is None:
        return {}
    if not inspect.isclass(fn) or dataclasses.is_dataclass(fn):
        return _annotations(fn)
    found: dict[str, Any] = {}
    for cls in fn.__mro__:  # a subclass's ``**kwargs`` go on to its bases' parameters
        init = cls.__dict__.get("__init__")
        if init is None or cls is object:
            continue
        found = {**_annotations(init), **found}
        if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            break
    return found


def _annotations(fn: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except (NameError, TypeError):  # a forward reference or annotation it cannot resolve
        return {}


# -------------------------------------------------------------------------
# Paths relative to the file that names them
# -------------------------------------------------------------------------


def _is_path(annotation: Any) -> bool:
    if typing.get_origin(annotation) is typing.Annotated:
        return PATH_MARK in annotation.__metadata__ or _is_path(typing.get_args(annotation)[0])
    return any(_is_path(a) for a in typing.get_args(annotation))


def _relative_to(path: Any, origin: Origin | None, command_line: bool = False) -> Any:
    if isinstance(path, (list, tuple)):
        return type(path)(_relative_to(p, origin, command_line) for p in path)
    file = origin.file if origin is not None else None
    if not isinstance(path, str) or not path or not (file is not None or command_line):
        return path
    if os.path.isabs(path) or _SCHEME.match(path):
        return path
    folder = pathlib.Path(file).resolve().parent if file is not None else pathlib.Path.cwd()
    return os.path.normpath(folder / path)


def resolve_paths(origins: Origins, *, command_line: bool = False) -> None:
    """Rebinds each relative :data:`ConfigPath` written in a gin file against that file's folder
    (``command_line``: and each given as a ``--gin.`` binding against the working directory,
    so the config can be written out and read from anywhere).

    The literal is rebound where it was written: in its macro if it came
    through one, so every parameter that uses the macro gets the same path.
    """
    for bound in list(bound_values(origins)):
        if not _is_path(hints(bound.selector).get(bound.arg)):
            continue
        resolved = _relative_to(bound.value, bound.origin, command_line)
        if resolved == bound.value:
            continue
        if bound.macro is not None:
            gin.bind_parameter((bound.macro[0], MACRO, "value"), resolved)
        else:
            gin.bind_parameter((bound.scope, bound.selector, bound.arg), resolved)


def is_reference(value: Any) -> bool:
    return isinstance(value, gin.config.ConfigurableReference)


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parameter_names(selector: str) -> list[str]:
    """The keyword parameters of the configurable ``selector`` (for 'did you mean')."""
    fn = gin_state.matching_configurable(selector)
    if fn is None:
        return []
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
