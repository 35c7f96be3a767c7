"""What a setting may be, written where the setting is declared.

A component's constructor (or a settings dataclass) annotates each parameter
with what its value must be::

    from typing import Annotated

    from rlax.core.constraints import AtLeast, OneOf, Positive, Range

    class MySampler:
        def __init__(
            self,
            *,
            max_new_tokens: Annotated[int, AtLeast(1)] = 8,
            temperature: Annotated[float, Positive] = 1.0,
            top_p: Annotated[float, Range(gt=0, le=1)] = 1.0,
            method: Annotated[str, OneOf("auto", "gumbel")] = "auto",
        ): ...

``rlax run`` (and ``eval``, ``curate``) checks every literal bound to every gin
configurable against these before any role starts
(:func:`rlax.core.config.checks.check_constraints`) and refuses the first that
breaks one in one line that names the binding and where it was written::

    rlax: error: --gin.samplers.jax.top_p=1.5: samplers.jax.top_p: must be in (0, 1], got 1.5

The vocabulary:

- :class:`Range` ``(ge=, gt=, le=, lt=, means="")``: a number within bounds;
  ``means`` says what a special value does (``"0: never"``).
- :func:`AtLeast` ``(n)``: ``Range(ge=n)``; :data:`Positive` (> 0),
  :data:`NonNegative` (>= 0), :data:`Probability` (in [0, 1]).
- :class:`OneOf` ``(*values)``: one of these values.
- :data:`ExistingPath`: a path that must exist when the configuration is read
  (``hf:...``, ``pypi:...`` and other ``scheme:`` references are left alone).

Two rules hold without a marker: a number bound to a numeric parameter must be
finite (NaN and infinities are refused), and the items of a sequence are held
to the item type's constraints (``Sequence[Annotated[int, AtLeast(1)]]``).
A rule between settings (``min_length <= max_length``) is a validator that
raises :class:`~rlax.core.errors.BadSetting`, attached with :func:`checked_by`.
Code that builds the component without gin checks the same markers with
:func:`check_arguments` (or :func:`check_fields` in a dataclass's
``__post_init__``).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

from rlax.core.errors import BadSetting

__all__ = [
    "CHECK_ATTRIBUTE",
    "AtLeast",
    "Built",
    "Constraint",
    "ExistingPath",
    "NonNegative",
    "OneOf",
    "Positive",
    "Probability",
    "Range",
    "check_arguments",
    "check_fields",
    "check_rules",
    "checked_by",
    "constrained",
    "constraints_of",
    "ordered",
    "refusal",
]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")  # pypi:DIST, hf:..., not a drive letter


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _show(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


class Constraint:
    """A marker for ``Annotated[...]``: :meth:`refuses` says why a value is not allowed."""

    def refuses(self, value: Any) -> str | None:
        """Why ``value`` is refused (``"must be >= 1, got 0"``), or None if it is allowed."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Range(Constraint):
    """A number within bounds: ``ge``/``gt`` below, ``le``/``lt`` above (None: unbounded).

    ``means`` says what a special value does, shown with the refusal:
    ``Range(ge=0, means="0: never")`` -> ``must be >= 0 (0: never), got -1``.
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    means: str = ""

    def __str__(self) -> str:
        low = (f"[{_show(self.ge)}" if self.ge is not None else None) or (
            f"({_show(self.gt)}" if self.gt is not None else None
        )
        high = (f"{_show(self.le)}]" if self.le is not None else None) or (
            f"{_show(self.lt)})" if self.lt is not None else None
        )
        if low and high:
            return f"in {low}, {high}"
        if low:
            return f"{'>=' if low[0] == '[' else '>'} {low[1:]}"
        if high:
            return f"{'<=' if high[-1] == ']' else '<'} {high[:-1]}"
        return "a number"

    def allows(self, value: float) -> bool:
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def refuses(self, value: Any) -> str | None:
        if not _is_number(value) or self.allows(value):
            return None
        means = f" ({self.means})" if self.means else ""
        return f"must be {self}{means}, got {value!r}"


def AtLeast(n: float, means: str = "") -> Range:
    """``Range(ge=n)``: e.g. ``Annotated[int, AtLeast(1)]``."""
    return Range(ge=n, means=means)


Positive = Range(gt=0)
NonNegative = Range(ge=0)
Probability = Range(ge=0, le=1)


class OneOf(Constraint):
    """One of the given values: ``Annotated[str, OneOf("auto", "gumbel", "greedy")]``."""

    def __init__(self, *values: Any):
        self.values = values

    def __repr__(self) -> str:
        return f"OneOf({', '.join(map(repr, self.values))})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OneOf) and other.values == self.values

    def __hash__(self) -> int:
        return hash(self.values)

    def refuses(self, value: Any) -> str | None:
        if not isinstance(value, (str, int, float, type(None))) or value in self.values:
            return None
        return f"one of {', '.join(map(str, self.values))}, got {value!r}"


class _ExistingPath(Constraint):
    def __repr__(self) -> str:
        return "ExistingPath"

    def refuses(self, value: Any) -> str | None:
        if not isinstance(value, (str, os.PathLike)) or not str(value) or os.path.exists(value):
            return None
        if isinstance(value, str) and _SCHEME.match(value):
            return None
        return f"no such file or directory: {os.fspath(value)}"


ExistingPath = _ExistingPath()


# -------------------------------------------------------------------------
# Checking a value against its annotation
# -------------------------------------------------------------------------


def _kind_fits(value: Any, annotation: Any) -> bool:
    """Whether ``value`` is of the kind ``annotation`` names, as far as constraints care."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _kind_fits(value, typing.get_args(annotation)[0])
    if annotation is type(None) or annotation is None:
        return value is None
    if annotation is float:
        return _is_number(value)
    if annotation in (int, str, bool):
        return isinstance(value, annotation) and (annotation is bool or not isinstance(value, bool))
    origin = typing.get_origin(annotation)
    if _is_sequence(origin):
        return isinstance(value, (list, tuple))
    target = origin if isinstance(origin, type) else annotation  # Callable[...]: Callable
    if isinstance(target, type):
        try:
            return isinstance(value, target)
        except TypeError:  # a Protocol that cannot be checked at run time
            return True
    return True


def refusal(value: Any, annotation: Any) -> str | None:
    """Why the literal ``value`` breaks a constraint of ``annotation``, or None.

    Follows ``Annotated``, unions (``X | None``: the members ``value`` is of)
    and sequences (each item; the message names the item's place).
    """
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        why = refusal(value, args[0])
        marks = (m for m in annotation.__metadata__ if isinstance(m, Constraint))
        return why or next(filter(None, (m.refuses(value) for m in marks)), None)
    if origin in (typing.Union, types.UnionType):
        fitting = [a for a in args if _kind_fits(value, a)]
        reasons = [refusal(value, a) for a in fitting]
        return None if not reasons or None in reasons else reasons[0]
    if annotation in (int, float) and _is_number(value) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    if isinstance(value, (list, tuple)) and args and _is_sequence(origin):
        items = args[:1] * len(value) if origin is not tuple or args[-1] is Ellipsis else args
        for i, (item, item_annotation) in enumerate(zip(value, items, strict=False)):
            if why := refusal(item, item_annotation):
                return f"item {i}: {why}"
    return None


def _is_sequence(origin: Any) -> bool:
    return origin in (tuple, list, collections.abc.Sequence, collections.abc.Collection)


def constraints_of(annotation: Any) -> list[Constraint]:
    """Every constraint marker inside ``annotation`` (unions, sequences and markers followed)."""
    found = []
    if typing.get_origin(annotation) is typing.Annotated:
        found = [m for m in annotation.__metadata__ if isinstance(m, Constraint)]
    return found + [c for a in typing.get_args(annotation) for c in constraints_of(a)]


def check_arguments(fn: Callable[..., Any], arguments: Mapping[str, Any], owner: str = "") -> None:
    """BadSetting for the first of ``arguments`` that ``fn``'s annotations refuse.

    For code that builds a component without gin (which checks before any role
    starts): ``check_arguments(MySampler.__init__, locals(), owner="my sampler")``;
    the message reads ``my sampler: top_p: must be in (0, 1], got 1.5``.
    """
    hints = typing.get_type_hints(fn, include_extras=True)
    for name, value in arguments.items():
        if name in hints and (why := refusal(value, hints[name])):
            raise BadSetting(name, f"{owner}: {name}: {why}" if owner else why)


def check_fields(settings: Any) -> None:
    """BadSetting for the first field of the dataclass ``settings`` its annotation refuses."""
    hints = typing.get_type_hints(type(settings), include_extras=True)
    for field in dataclasses.fields(settings):
        if why := refusal(getattr(settings, field.name), hints.get(field.name, Any)):
            raise BadSetting(field.name, why)


@dataclasses.dataclass(frozen=True)
class Built:
    """What a setting bound by reference (``@samplers.engine()``) will build, as a rule
    between settings sees it before anything is built: the configurable's ``selector``
    and its ``factory`` (the class or function gin will call).

    A rule gets one only for a parameter it names in its own signature (a rule taking
    ``**settings`` alone never does), so a rule between numbers never meets one.
    """

    selector: str
    factory: Any


# The attribute :func:`checked_by` sets on a configurable; ``rlax.core.config`` calls it.
CHECK_ATTRIBUTE = "__rlax_check_settings__"

T = TypeVar("T")


def checked_by(validator: Callable[..., None]) -> Callable[[T], T]:
    """Attaches a rule between settings to a configurable (a class or a function).

    ``validator`` takes the parameters it checks by keyword (and ``**_``), gets
    the bound literals and the defaults of the others before any role starts,
    and raises :class:`BadSetting` naming the parameter at fault::

        def _lengths(*, min_length: int = 0, max_length: int = 0, **_) -> None:
            if max_length and min_length > max_length:
                raise BadSetting("min_length", f"must be <= max_length ({max_length}), ...")

        @checked_by(_lengths)
        class LengthFilter: ...
    """

    def attach(target: T) -> T:
        check = staticmethod(validator) if isinstance(target, type) else validator
        setattr(target, CHECK_ATTRIBUTE, check)
        return target

    return attach


def check_rules(target: Any, owner: str, **values: Any) -> None:
    """Runs the rule between settings that :func:`checked_by` attached to ``target``.

    For code that builds ``target`` without gin (gin runs the rule before any
    role starts): the BadSetting names ``owner.parameter``, e.g.
    ``check_rules(DatasetTask, "tasks.dataset", template=template)``.
    """
    validator = getattr(target, CHECK_ATTRIBUTE, None)
    if validator is None:
        return
    try:
        validator(**values)
    except BadSetting as err:
        raise BadSetting(err.parameter, f"{owner}.{err.parameter}: {err}") from None


def ordered(low: str, high: str, *, zero_is_unbounded: bool = False) -> Callable[..., None]:
    """A rule between two settings: ``low <= high`` (``checked_by(ordered("min_rate", "max_rate"))``).

    ``zero_is_unbounded``: ``high = 0`` means no upper end, and always passes. A
    setting that is not given (no default, not bound) is not compared.
    """

    def check(**settings: Any) -> None:
        a: Any = settings.get(low)
        b: Any = settings.get(high)
        if not (_is_number(a) and _is_number(b)) or (zero_is_unbounded and b == 0):
            return
        if a > b:
            unbounded = " or 0 (no limit)" if zero_is_unbounded else ""
            raise BadSetting(high, f"must be >= {low} ({a!r}){unbounded}, got {b!r}")

    check.__doc__ = f"BadSetting unless {low} <= {high}."
    return check


def constrained(
    fn: Callable[..., Any], check: Callable[..., None] | None = None, **marks: Constraint
) -> Callable[..., Any]:
    """``fn`` (a library's function, registered as a gin configurable) with constraints added.

    The parameters, defaults and behaviour stay ``fn``'s; ``marks`` add a
    constraint to a parameter's annotation and ``check`` is a rule between
    settings (:func:`checked_by`)::

        register_configurables("optax", {"adam": constrained(optax.adam, learning_rate=Positive)})
    """

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except (NameError, TypeError):  # an annotation that cannot be resolved: marks alone
        hints = {}
    call.__annotations__ = {
        **hints,
        **{name: Annotated[hints.get(name, Any), mark] for name, mark in marks.items()},
    }
    return checked_by(check)(call) if check is not None else call
