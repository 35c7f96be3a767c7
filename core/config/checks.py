"""Checks of the bound values of a gin config, before any work starts.

:func:`rlax.core.config.parse` runs them after reading the files and bindings
and before gin locks the config; each raises one :class:`ConfigError` that
names the binding, where it was written (``FILE:LINE`` or
``--gin.NAME=VALUE``), what was expected and what was given:

- :func:`check_required`: a ``%gin.REQUIRED`` value left unset;
- :func:`check_types`: a bound literal its parameter's annotation refuses
  (macros followed to the literal; a name where a plugin component is expected
  gets the reference to write and the kind's valid names);
- :func:`check_constraints`: a bound literal that breaks a constraint its
  parameter declares (:mod:`rlax.core.constraints`: ``Annotated[int, AtLeast(1)]``),
  or a number that is not finite;
- :func:`check_values`: a component's own checks of its settings taken
  together (a validator raising :class:`BadSetting`: those of ``rlax.core.config``
  and those a configurable carries, :func:`rlax.core.constraints.checked_by`);
- :func:`check_settings_used`: a settings object's parameters bound while the
  role's parameter that takes it is not bound to it (the values would be ignored);

References (``@rewards.math()``) are not evaluated here: what they build is
checked by its own parameters' bindings.
"""

from __future__ import annotations

import collections.abc
import inspect
import os
import pathlib
import re
import types
import typing
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from rlax.core import gin_state
from rlax.core.config.bindings import (
    MACRO,
    Origin,
    Origins,
    bound_values,
    follow,
    hints,
    is_reference,
    show,
)
from rlax.core.constraints import CHECK_ATTRIBUTE, Built, refusal
from rlax.core.errors import BadSetting, ConfigError
from rlax.core.plugins import CONTRACTS

if TYPE_CHECKING:
    from rlax.core.plugins import PluginManager

__all__ = [
    "arguments",
    "check_constraints",
    "check_required",
    "check_types",
    "check_values",
    "declared_validators",
]


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


def _conforms(value: Any, annotation: Any) -> bool:
    """Whether the literal ``value`` can be passed where ``annotation`` is expected."""
    if annotation is Any or annotation is inspect.Parameter.empty or is_reference(value):
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
    if origin in (
        list,
        collections.abc.Sequence,
        collections.abc.Iterable,
        collections.abc.Collection,
        set,
        frozenset,
        collections.abc.Set,
    ):
        return isinstance(value, (list, tuple)) and all(
            _conforms(v, args[0]) for v in value if args
        )
    if origin in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    if origin is collections.abc.Callable or annotation is collections.abc.Callable:
        return callable(value)
    if isinstance(annotation, type):
        if getattr(annotation, "_is_protocol", False):
            return not isinstance(value, (str, int, float, bool, list, tuple, dict))
        return isinstance(value, annotation)
    return True  # a TypeVar, a forward reference we could not resolve, ...


def _is_required(value: Any) -> bool:
    return (
        is_reference(value)
        and value.selector == "gin.constant"
        and value.scopes == ["gin.REQUIRED"]
    )


def check_required(origins: Origins) -> None:
    """Raises ConfigError naming the first ``%gin.REQUIRED`` value left unset, and where."""
    for scope, selector, params in gin_state.all_bindings():
        for arg, value in params.items():
            if not _is_required(value):
                continue
            name = scope if selector == MACRO else f"{selector}.{arg}"
            origin = origins.get(scope, selector, arg)
            raise ConfigError(
                f"{name} is required{f' ({origin})' if origin else ''} and not set: "
                f"set it in a gin file or with --gin.{name}=..."
            )


def check_types(origins: Origins, plugins: PluginManager | None = None) -> None:
    """Raises ConfigError for the first bound literal that its parameter's annotation refuses.

    The message reads ``WHERE: NAME = VALUE: expected TYPE, got TYPE``, where
    WHERE is the file and line (or ``--gin.`` binding) that wrote the value;
    for a name given where a component of a plugin kind is expected (a
    Protocol of :data:`rlax.core.plugins.CONTRACTS`), it goes on with the
    reference to write and the kind's names in ``plugins``.
    """
    for bound in bound_values(origins):
        annotation = hints(bound.selector).get(bound.arg, Any)
        if _conforms(bound.value, annotation):
            continue
        written = bound.origin is not None and bound.origin.binding is not None
        where = f"{bound.origin}: " if bound.origin else ""
        value = "" if written else f" = {show(bound.value)}"
        via = f" (via %{bound.macro[0]})" if bound.macro else ""
        raise ConfigError(
            f"{where}{bound.name}{via}{value}: expected {_describe(annotation)}, "
            f"got {type(bound.value).__name__}{_reference_hint(annotation, bound.value, plugins)}"
        )


def check_constraints(origins: Origins) -> None:
    """Raises ConfigError for the first bound literal that its parameter's constraints refuse.

    The message reads ``WHERE: NAME: WHY``, e.g. ``--gin.samplers.jax.top_p=1.5:
    samplers.jax.top_p: must be in (0, 1], got 1.5`` (:func:`rlax.core.constraints.refusal`).
    """
    for bound in bound_values(origins):
        if is_reference(bound.value):
            continue
        why = refusal(bound.value, hints(bound.selector).get(bound.arg, Any))
        if why is None:
            continue
        where = f"{bound.origin}: " if bound.origin else ""
        via = f" (via %{bound.macro[0]})" if bound.macro else ""
        raise ConfigError(f"{where}{bound.name}{via}: {why}")


def _protocol_names(annotation: Any) -> set[str]:
    """The names of the Protocols in ``annotation`` (``Sequence[OnlineFilter]``: OnlineFilter)."""
    if isinstance(annotation, type) and getattr(annotation, "_is_protocol", False):
        return {annotation.__name__}
    return set().union(*map(_protocol_names, typing.get_args(annotation)))


def _reference_hint(annotation: Any, value: Any, plugins: PluginManager | None) -> str:
    """``; build one by reference, e.g. @critics.head() (valid critics: head, separate)``
    for a name where a plugin kind's component is expected; otherwise ``""``."""
    names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    protocols = _protocol_names(annotation)
    kind = next((k for k, c in CONTRACTS.items() if protocols & set(c)), None)
    if plugins is None or kind is None or not names or not isinstance(names[0], str):
        return ""
    valid = plugins.names(kind)
    example = names[0] if names[0] in valid else valid[0] if valid else "NAME"
    return (
        f"; build one by reference, e.g. @{kind}.{example}() "
        f"(valid {kind}: {', '.join(valid) or '(none registered)'})"
    )


def arguments(
    selector: str, origins: Origins, scope: str = "", references: Collection[str] = ()
) -> dict[str, tuple[Any, Origin | None]]:
    """The literal arguments the configurable ``selector`` will get: ``{name: (value, origin)}``.

    Bound literals (macros followed) and the signature's defaults (origin
    None). A parameter bound to a reference is left out, since what it builds
    is not known before it is called -- unless it is named in ``references``:
    then it is a :class:`~rlax.core.constraints.Built` (the configurable and
    its factory, not built).
    """
    fn = gin_state.configurable_of(selector)
    found: dict[str, tuple[Any, Origin | None]] = {}
    if fn is not None:
        for p in inspect.signature(fn).parameters.values():
            if p.default is not inspect.Parameter.empty:
                found[p.name] = (p.default, None)
    for bound in bound_values(origins):
        if bound.selector == selector and bound.scope == scope:
            if is_reference(bound.value) and bound.arg in references:
                built = bound.value.configurable
                found[bound.arg] = (Built(built.selector, built.wrapped), bound.origin)
            elif is_reference(bound.value):
                found.pop(bound.arg, None)
            else:
                found[bound.arg] = (bound.value, bound.origin)
    return found


def check_values(origins: Origins, validators: dict[str, Callable[..., None]]) -> None:
    """Calls ``validators[selector](**literal arguments)`` for each bound configurable.

    A validator takes the parameters it checks by keyword (and ``**_``) and
    raises :class:`BadSetting` naming the parameter at fault; the message is
    prefixed with where that parameter's value was written (or, if it kept its
    default, where another of the configurable's values was).
    """
    bound = gin_state.bound_selectors()
    for selector, validate in validators.items():
        if selector not in bound:
            continue
        args = arguments(selector, origins, references=_named(validate))
        try:
            validate(**{name: value for name, (value, _) in args.items()})
        except BadSetting as err:
            # The parameter at fault's binding; if it kept its default, one that was bound.
            origin = args.get(err.parameter, (None, None))[1] or next(
                (o for _, o in args.values() if o is not None), None
            )
            where = f"{origin}: " if origin else ""
            raise ConfigError(f"{where}{selector}.{err.parameter}: {err}") from err


def _named(validate: Callable[..., None]) -> frozenset[str]:
    """The parameters a rule names in its signature (those it may get as ``Built``)."""
    named = inspect.signature(validate).parameters.values()
    return frozenset(p.name for p in named if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def declared_validators() -> dict[str, Callable[..., None]]:
    """``{selector: validator}`` of the bound configurables that carry one (``checked_by``)."""
    found = {}
    for selector in gin_state.bound_selectors():
        check = getattr(gin_state.configurable_of(selector), CHECK_ATTRIBUTE, None)
        if check is not None:
            found[selector] = check
    return found


def _shown(value: Any) -> str:
    return f"%{'/'.join(value.scopes)}" if _is_macro(value) else show(value)


def _is_macro(value: Any) -> bool:
    return is_reference(value) and value.selector == MACRO


def _same(a: Any, b: Any) -> bool:
    if is_reference(a) or is_reference(b):
        return (
            is_reference(a)
            and is_reference(b)
            and (a.scoped_selector, a.evaluate) == (b.scoped_selector, b.evaluate)
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def check_settings_used(
    origins: Origins, taken_by: Mapping[str, str], wired: Collection[str] = ()
) -> None:
    """ConfigError for a binding of a settings object that nothing would build.

    ``taken_by`` maps a settings configurable to the parameter that takes it,
    e.g. ``{"rlax.watch": "rlax.train.watch"}``: ``rlax.watch.eval_every = 5``
    counts only if ``rlax.train.watch = @rlax.watch()`` is bound too. ``wired``: the
    settings configs/base/roles.gin binds so (the message says to include it).
    """
    for settings, parameter in taken_by.items():
        # A scoped binding (sampler/rlax.mesh.data) is its own reference's, taken where that is.
        first = next(
            (b for b in bound_values(origins) if b.selector == settings and not b.scope), None
        )
        if first is None:
            continue
        role, _, arg = parameter.rpartition(".")
        value = follow(gin_state.bindings_of(role).get(arg), origins, None)[0]
        if is_reference(value) and value.selector == settings:
            continue
        where = f"{first.origin}: " if first.origin else ""
        how = " (configs/base/roles.gin does: include it)" if settings in wired else ""
        raise ConfigError(
            f"{where}{first.name} is bound, but {parameter} is not @{settings}(), so it would "
            f"be ignored; bind {parameter} = @{settings}(){how}"
        )
