"""Where each gin binding came from, and checks of bound values before any work starts.

:func:`rlax.core.config.parse` records the origin of every binding it reads
(``FILE:LINE``, or ``--gin.NAME=VALUE`` for a command-line binding) in a
:class:`Origins`; then, before gin locks the config:

- :func:`resolve_paths` turns each relative path written in a gin file into a
  path relative to that file's folder, for the parameters annotated
  :data:`~rlax.core.types.ConfigPath` (a path given on the command line stays
  relative to the working directory, as a shell user expects);
- :func:`check_types` checks every bound literal against the annotation of the
  parameter it is bound to, following macros to the literal, and raises one
  :class:`ConfigError` naming the binding, where it was written, what was
  expected and what was given.

References (``@rewards.math()``) are not evaluated here: what they build is
checked by its own parameters' bindings.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import difflib
import inspect
import itertools
import os
import pathlib
import re
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import gin

from rlax.core.errors import BadSetting, ConfigError
from rlax.core.types import PATH_MARK

__all__ = [
    "Origin",
    "Origins",
    "arguments",
    "check_types",
    "check_values",
    "closest_names",
    "resolve_paths",
]

_MACRO = "gin.macro"
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

    gin's parser enters ``utils.try_with_location(location)`` around each
    ``bind_parameter`` call; both are looked up on their modules at call time,
    so wrapping them for the duration of a parse sees every binding (an
    ``include`` too) with the file and line it came from. ``binding``: the
    command-line binding being parsed (gin gives it no file).
    """
    utils, config = gin.utils, gin.config
    try_with_location, bind_parameter = utils.try_with_location, config.bind_parameter
    current: list[Any] = [None]

    @contextlib.contextmanager
    def located(location):
        current.append(location)
        try:
            with try_with_location(location):
                yield
        finally:
            current.pop()

    def bind(binding_key, value):
        bind_parameter(binding_key, value)
        location = current[-1]
        if location is not None and location.filename:  # a file, one included by a binding too
            origin = Origin(file=location.filename, line=location.line_num)
        else:
            origin = Origin(binding=binding or "?")
        origins.record(*binding_key, origin)

    utils.try_with_location, config.bind_parameter = located, bind
    try:
        yield
    finally:
        utils.try_with_location, config.bind_parameter = try_with_location, bind_parameter


def closest_names(name: str, valid: list[str]) -> str:
    """``"; did you mean 'steps'? valid: a, b, ..."`` for an unknown parameter ``name``."""
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"{hint} (valid: {', '.join(sorted(valid))})"


# -------------------------------------------------------------------------
# Walking the bindings
# -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Bound:
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


def _follow(value: Any, origins: Origins, origin: Origin | None, macro=None, depth: int = 0):
    """``(literal, its origin, its macro key)``: a macro reference is replaced by its value."""
    ref = value
    if isinstance(ref, gin.config.ConfigurableReference) and ref.selector == _MACRO and depth < 32:
        name = "/".join(ref.scopes)
        bound = gin.config._CONFIG.get((name, _MACRO), {})
        if "value" in bound:
            return _follow(bound["value"], origins, origins.get(name, _MACRO, "value"),
                           (name, _MACRO), depth + 1)  # fmt: skip
    return value, origin, macro


def _bindings(origins: Origins) -> Iterator[_Bound]:
    for (scope, selector), params in list(gin.config._CONFIG.items()):
        if selector == _MACRO:
            continue
        for arg, value in params.items():
            literal, origin, macro = _follow(value, origins, origins.get(scope, selector, arg))
            yield _Bound(selector, scope, arg, literal, origin, macro)


def _hints(selector: str) -> dict[str, Any]:
    """The parameter annotations of the configurable ``selector`` ({} if they cannot be read)."""
    info = gin.config._REGISTRY.get(selector)
    fn = getattr(info, "wrapped", None)
    if fn is None:
        return {}
    target = fn.__init__ if inspect.isclass(fn) and not dataclasses.is_dataclass(fn) else fn
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception:  # noqa: BLE001 -- an annotation that cannot be resolved is not checked
        return {}


# -------------------------------------------------------------------------
# Paths relative to the file that names them
# -------------------------------------------------------------------------


def _is_path(annotation: Any) -> bool:
    if typing.get_origin(annotation) is typing.Annotated:
        return PATH_MARK in annotation.__metadata__ or _is_path(typing.get_args(annotation)[0])
    return any(_is_path(a) for a in typing.get_args(annotation))


def _relative_to(path: Any, origin: Origin | None) -> Any:
    if isinstance(path, (list, tuple)):
        return type(path)(_relative_to(p, origin) for p in path)
    if not isinstance(path, str) or not path or origin is None or origin.file is None:
        return path
    if os.path.isabs(path) or _SCHEME.match(path):
        return path
    return os.path.normpath(pathlib.Path(origin.file).resolve().parent / path)


def resolve_paths(origins: Origins) -> None:
    """Rebinds each relative :data:`ConfigPath` written in a gin file against that file's folder.

    The literal is rebound where it was written: in its macro if it came
    through one, so every parameter that uses the macro gets the same path.
    """
    for bound in list(_bindings(origins)):
        if not _is_path(_hints(bound.selector).get(bound.arg)):
            continue
        resolved = _relative_to(bound.value, bound.origin)
        if resolved == bound.value:
            continue
        if bound.macro is not None:
            gin.bind_parameter((bound.macro[0], _MACRO, "value"), resolved)
        else:
            gin.bind_parameter((bound.scope, bound.selector, bound.arg), resolved)


# -------------------------------------------------------------------------
# Types
# -------------------------------------------------------------------------


_SCALARS = ("bool", "int", "float", "complex", "str", "None")


def _describe(annotation: Any) -> str:
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__name__
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _describe(args[0])
    if origin in (typing.Union, types.UnionType):
        names = list(dict.fromkeys(_describe(a) for a in args))
        scalars = [n for n in _SCALARS if n in names]  # a number type's array forms say little
        shown = scalars if scalars and len(scalars) < len(names) else names
        return ", ".join(shown[:-1]) + f" or {shown[-1]}" if len(shown) > 1 else shown[0]
    text = str(annotation).replace("typing.", "").replace("collections.abc.", "")
    return re.sub(r"\b[\w.]+\.(\w+)", r"\1", text)  # jax.jaxlib._jax.Array -> Array


def _is_reference(value: Any) -> bool:
    return isinstance(value, gin.config.ConfigurableReference)


def _conforms(value: Any, annotation: Any) -> bool:
    """Whether the literal ``value`` can be passed where ``annotation`` is expected."""
    if annotation is Any or annotation is inspect.Parameter.empty or _is_reference(value):
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _conforms(value, args[0])
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if annotation is None or annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if annotation in (pathlib.Path, os.PathLike) or origin is os.PathLike:
        return isinstance(value, (str, os.PathLike))
    if origin in (tuple,) and args:
        if not isinstance(value, (list, tuple)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return len(args) == len(value) and all(map(_conforms, value, args))
    if origin in (list, collections.abc.Sequence, collections.abc.Iterable,
                  collections.abc.Collection, set, frozenset, collections.abc.Set):  # fmt: skip
        return isinstance(value, (list, tuple)) and all(_conforms(v, args[0]) for v in value
                                                        if args)  # fmt: skip
    if origin in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    if origin is collections.abc.Callable or annotation is collections.abc.Callable:
        return callable(value)
    if isinstance(annotation, type):
        if getattr(annotation, "_is_protocol", False):
            return not isinstance(value, (str, int, float, bool, list, tuple, dict))
        return isinstance(value, annotation)
    return True  # a TypeVar, a forward reference we could not resolve, ...


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_required(value: Any) -> bool:
    return (
        _is_reference(value)
        and value.selector == "gin.constant"
        and value.scopes == ["gin.REQUIRED"]
    )


def check_required(origins: Origins) -> None:
    """Raises ConfigError naming the first ``%gin.REQUIRED`` value left unset, and where."""
    for (scope, selector), params in list(gin.config._CONFIG.items()):
        for arg, value in params.items():
            if not _is_required(value):
                continue
            name = scope if selector == _MACRO else f"{selector}.{arg}"
            origin = origins.get(scope, selector, arg)
            raise ConfigError(
                f"{name} is required{f' ({origin})' if origin else ''} and not set: "
                f"set it in a gin file or with --gin.{name}=..."
            )


def check_types(origins: Origins) -> None:
    """Raises ConfigError for the first bound literal that its parameter's annotation refuses.

    The message reads ``WHERE: NAME = VALUE: expected TYPE, got TYPE``, where
    WHERE is the file and line (or ``--gin.`` binding) that wrote the value.
    """
    for bound in _bindings(origins):
        annotation = _hints(bound.selector).get(bound.arg, Any)
        if _conforms(bound.value, annotation):
            continue
        written = bound.origin is not None and bound.origin.binding is not None
        where = f"{bound.origin}: " if bound.origin else ""
        value = "" if written else f" = {_show(bound.value)}"
        via = f" (via %{bound.macro[0]})" if bound.macro else ""
        raise ConfigError(
            f"{where}{bound.name}{via}{value}: expected {_describe(annotation)}, "
            f"got {type(bound.value).__name__}"
        )


def arguments(
    selector: str, origins: Origins, scope: str = ""
) -> dict[str, tuple[Any, Origin | None]]:
    """The literal arguments the configurable ``selector`` will get: ``{name: (value, origin)}``.

    Bound literals (macros followed) and the signature's defaults (origin
    None); a parameter bound to a reference is left out, since what it builds
    is not known before it is called.
    """
    info = gin.config._REGISTRY.get(selector)
    fn = getattr(info, "wrapped", None)
    found: dict[str, tuple[Any, Origin | None]] = {}
    if fn is not None:
        for p in inspect.signature(fn).parameters.values():
            if p.default is not inspect.Parameter.empty:
                found[p.name] = (p.default, None)
    for bound in _bindings(origins):
        if bound.selector == selector and bound.scope == scope:
            if _is_reference(bound.value):
                found.pop(bound.arg, None)
            else:
                found[bound.arg] = (bound.value, bound.origin)
    return found


def check_values(origins: Origins, validators: dict[str, Callable[..., None]]) -> None:
    """Calls ``validators[selector](**literal arguments)`` for each bound configurable.

    A validator takes the parameters it checks by keyword (and ``**_``) and
    raises :class:`BadSetting` naming the parameter at fault; the message is
    prefixed with where that parameter's value was written.
    """
    bound = {selector for (_, selector) in gin.config._CONFIG}
    for selector, validate in validators.items():
        if selector not in bound:
            continue
        args = arguments(selector, origins)
        try:
            validate(**{name: value for name, (value, _) in args.items()})
        except BadSetting as err:
            origin = args.get(err.parameter, (None, None))[1]
            where = f"{origin}: " if origin else ""
            raise ConfigError(f"{where}{selector}.{err.parameter}: {err}") from err


def _shown(value: Any) -> str:
    return f"%{'/'.join(value.scopes)}" if _is_macro(value) else _show(value)


def _is_macro(value: Any) -> bool:
    return _is_reference(value) and value.selector == _MACRO


def _same(a: Any, b: Any) -> bool:
    if _is_reference(a) or _is_reference(b):
        return (_is_reference(a) and _is_reference(b)
                and (a.scoped_selector, a.evaluate) == (b.scoped_selector, b.evaluate))  # fmt: skip
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def check_roles_agree(origins: Origins, shared: dict[str, Sequence[str]]) -> None:
    """Raises ConfigError if two roles are bound to different values of a shared setting.

    ``shared`` maps a parameter name to the configurables (roles) that must
    agree on it, e.g. ``{"reward": ("rlax.train", "rlax.worker")}``: the
    trainer evaluates with the reward the workers score with. Macros are
    followed before comparing; a role that does not bind the parameter is not
    compared.
    """
    config = gin.config._CONFIG
    for arg, roles in shared.items():
        bound = [(role, config[("", role)][arg]) for role in roles
                 if arg in config.get(("", role), {})]  # fmt: skip
        for (role_a, raw_a), (role_b, raw_b) in itertools.pairwise(bound):
            a = _follow(raw_a, origins, None)[0]
            b = _follow(raw_b, origins, None)[0]
            if _same(a, b):
                continue
            if _is_macro(raw_a) and not _is_macro(raw_b):  # report the odd one out first
                (role_a, raw_a, a), (role_b, raw_b, b) = (role_b, raw_b, b), (role_a, raw_a, a)
            where = origins.get("", role_a, arg) or role_a
            other = f"{_shown(raw_b)}, which is {_show(b)}" if _is_macro(raw_b) else _shown(raw_b)
            macro = next((r for r in (raw_b, raw_a) if _is_macro(r)), None)
            fix = (f"set {'/'.join(macro.scopes)} = ... once instead (every role reads it)"
                   if macro else "bind both to the same value")  # fmt: skip
            raise ConfigError(
                f"{where}: {role_a}.{arg} = {_shown(raw_a)} but {role_b}.{arg} = {other} "
                f"({origins.get('', role_b, arg) or 'its default'}): the roles would disagree; "
                f"{fix}"
            )


def parameter_names(selector: str) -> list[str]:
    """The keyword parameters of the configurable ``selector`` (for 'did you mean')."""
    info = gin.config._REGISTRY.get_match(selector)
    fn: Callable[..., Any] | None = getattr(info, "wrapped", None)
    if fn is None:
        return []
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
