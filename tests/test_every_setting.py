"""Every knob, at its edges: each registered configurable's numeric and enumerated settings.

The walk covers every gin configurable ``rlax run`` registers (the core's, every
built-in plugin's) and the example plugins' (``examples/rlax-example-plugin`` and
``examples/rlax-example-algorithm``), and every parameter whose annotation is a
number (``int``/``float``, also inside ``Optional``, ``Annotated`` and sequences)
or an enumeration (``OneOf``/``Literal``). For each it binds

- each bound of its ``Range`` markers, and just past it;
- its default; NaN, +inf and -inf; a value of the wrong type;
- each value of its ``OneOf``, and one that is none of them,

and puts the binding through :func:`rlax.core.config.parse`, the code path ``rlax
run`` takes before any role starts (NaN cannot be written in gin: it is bound
with ``gin.bind_parameter`` and put through the same checks). A value past a
bound, a non-finite number, a wrong type or a value outside ``OneOf`` must be
refused with one ``ConfigError`` line that names the binding; a value within
must be accepted -- unless a rule between settings refuses it, in one line that
names the configurable (e.g. dual-clip's c = 1 + 1e-6 is not above 1 + clip_eps).
The vocabulary's docs (docs/plugin_hooks.md) say what a value within does.
A handful of cases also go through the real command line, as a process: exit
status 2, one ``rlax: error:`` line, no traceback, nothing left behind.

The test prints how many (configurable, parameter, value) cases it tried.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import pathlib
import sys
import time
import types
import typing
from collections.abc import Iterator
from typing import Any

import gin
import pytest
from cli_runs import rlax_process

from rlax.core import config, gin_state
from rlax.core.config import checks
from rlax.core.config.bindings import Origins, hints
from rlax.core.constraints import OneOf, Range, constraints_of
from rlax.core.errors import ConfigError
from rlax.core.plugins import PluginManager, build_plugin_manager

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = {
    ROOT / "examples" / "rlax-example-plugin": "rlax_example_plugin.shouting",
    ROOT / "examples" / "rlax-example-algorithm": "rlax_example_algorithm.lite_ppo",
}
NAN = float("nan")


@pytest.fixture(scope="module")
def plugins() -> Iterator[PluginManager]:
    for folder in EXAMPLES:
        sys.path.insert(0, str(folder))
    try:
        modules = [importlib.import_module(name) for name in EXAMPLES.values()]
        pm = build_plugin_manager(autoload=False, extra=modules)
        config.register_core_configurables()
        yield pm
    finally:
        for folder in EXAMPLES:
            sys.path.remove(str(folder))
        gin.clear_config()


# -------------------------------------------------------------------------
# What a parameter is
# -------------------------------------------------------------------------


def _strip(annotation: Any) -> Any:
    return (
        typing.get_args(annotation)[0]
        if typing.get_origin(annotation) is typing.Annotated
        else annotation
    )


def _members(annotation: Any) -> list[Any]:
    """The union's members (None left out), each without its Annotated wrapper."""
    annotation = _strip(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [_strip(a) for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def number_type(annotation: Any) -> type | None:
    """``int`` or ``float`` if the parameter takes a plain number (``float`` wins a union)."""
    found = {m for m in _members(annotation) if m in (int, float)}
    return float if float in found else int if found else None


def item_annotation(annotation: Any) -> Any | None:
    """The item type of a sequence parameter (``Sequence[X]``, ``tuple[X, ...]``), else None."""
    for member in _members(annotation):
        origin, args = typing.get_origin(member), typing.get_args(member)
        if (
            origin in (list, tuple, typing.Sequence, __import__("collections").abc.Sequence)
            and args
        ):
            if origin is tuple and args[-1] is not Ellipsis:
                return None  # a fixed tuple: walked position by position
            return args[0]
    return None


def fixed_tuple(annotation: Any) -> tuple[Any, ...] | None:
    for member in _members(annotation):
        if typing.get_origin(member) is tuple:
            args = typing.get_args(member)
            if args and args[-1] is not Ellipsis:
                return args
    return None


def enumeration(annotation: Any) -> tuple[Any, ...] | None:
    for member in [annotation, *typing.get_args(annotation)]:
        if typing.get_origin(member) is typing.Literal:
            return typing.get_args(member)
    marks = [c for c in constraints_of(annotation) if isinstance(c, OneOf)]
    return marks[0].values if marks else None


# -------------------------------------------------------------------------
# The cases of one parameter
# -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    selector: str
    arg: str
    value: Any
    valid: bool  # by the constraint's own arithmetic, not by asking the checker
    why: str


def _past(bound: float, kind: type, direction: int) -> float:
    step = 1 if kind is int else max(1e-6, abs(bound) * 1e-6)
    return kind(bound + direction * step) if kind is int else bound + direction * step


def number_values(annotation: Any, kind: type, default: Any) -> list[tuple[Any, bool, str]]:
    """(value, valid, why) for a number parameter."""
    values: list[tuple[Any, bool, str]] = []
    for mark in (c for c in constraints_of(annotation) if isinstance(c, Range)):
        for bound, inclusive, direction in (
            (mark.ge, True, -1),
            (mark.gt, False, -1),
            (mark.le, True, 1),
            (mark.lt, False, 1),
        ):
            if bound is None:
                continue
            if kind is int and not float(bound).is_integer():
                continue
            edge = kind(bound)
            values.append((edge, inclusive, f"the bound {mark}"))
            values.append((_past(bound, kind, direction), False, f"past the bound {mark}"))
            if not inclusive:
                values.append((_past(bound, kind, -direction), True, f"just inside {mark}"))
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        values.append((default, True, "the default"))
    values += [(math.inf, False, "+inf"), (-math.inf, False, "-inf"), (NAN, False, "NaN")]
    values.append(("x", False, "a string for a number"))
    return values


def enum_values(options: tuple[Any, ...]) -> list[tuple[Any, bool, str]]:
    wrong = 3 if all(isinstance(o, str) for o in options) else "x"
    return [(o, True, "one of its values") for o in options] + [
        ("none-of-these", False, "none of its values"),
        (wrong, False, "the wrong type"),
    ]


def cases_of(selector: str, arg: str, annotation: Any, default: Any) -> list[Case]:
    found: list[tuple[Any, bool, str]] = []
    if (options := enumeration(annotation)) is not None:
        found = enum_values(options)
    elif (kind := number_type(annotation)) is not None:
        found = number_values(annotation, kind, default)
    elif (item := item_annotation(annotation)) is not None and (
        enumeration(item) is not None or number_type(item) is not None
    ):
        found = [([v], ok, f"an item: {why}") for v, ok, why in cases_of_item(item)]
    elif (positions := fixed_tuple(annotation)) is not None and isinstance(default, tuple):
        for i, position in enumerate(positions):
            for v, ok, why in cases_of_item(position):
                value = list(default)
                value[i] = v
                found.append((tuple(value), ok, f"position {i}: {why}"))
    return [Case(selector, arg, v, ok, why) for v, ok, why in found]


def cases_of_item(annotation: Any) -> list[tuple[Any, bool, str]]:
    if (options := enumeration(annotation)) is not None:
        return enum_values(options)
    kind = number_type(annotation)
    return number_values(annotation, kind, None) if kind is not None else []


def registered(pm: PluginManager) -> list[str]:
    """What ``rlax run`` registers: the core's (rlax.*, optax.*, preemption.*) and every
    plugin kind's components (not what other tests of this process register)."""
    modules = {"rlax", "optax", "preemption", *pm.kinds}
    return sorted(s for s in gin_state.registered_selectors() if s.split(".")[0] in modules)


def every_case(pm: PluginManager) -> list[Case]:
    cases = []
    for selector in registered(pm):
        fn = gin_state.configurable_of(selector)
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        defaults = {p.name: p.default for p in signature.parameters.values()}
        for arg, annotation in hints(selector).items():
            if arg == "return":
                continue
            cases += cases_of(selector, arg, annotation, defaults.get(arg))
    return cases


# -------------------------------------------------------------------------
# Putting a case through the parse
# -------------------------------------------------------------------------


def _literal(value: Any) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "1e999" if value > 0 else "-1e999"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(map(_literal, value))
        return (
            f"[{inner}]"
            if isinstance(value, list)
            else f"({inner}{',' if len(value) == 1 else ''})"
        )
    return repr(value)


def outcome(case: Case, pm: PluginManager) -> str | None:
    """None if the value is accepted; the one-line error otherwise."""
    try:
        if isinstance(case.value, float) and math.isnan(case.value):
            gin.clear_config()
            gin.bind_parameter(("", case.selector, case.arg), case.value)
            origins = Origins()
            checks.check_types(origins, pm)
            checks.check_constraints(origins)
        else:
            binding = f"{case.selector}.{case.arg}={_literal(case.value)}"
            # A settings object counts only through the parameter that takes it.
            taker = config.SETTINGS_TAKEN_BY.get(case.selector)
            config.parse(
                [], [binding, *([f"{taker}=@{case.selector}()"] if taker else [])], plugins=pm
            )
    except ConfigError as err:
        return str(err)
    finally:
        gin.clear_config()
    return None


def test_every_numeric_and_enumerated_setting_is_accepted_or_refused_in_one_line(plugins):
    cases = every_case(plugins)
    wrong = []
    for case in cases:
        error = outcome(case, plugins)
        name = f"{case.selector}.{case.arg}"
        if error is not None and ("\n" in error or case.selector not in error):
            wrong.append(f"{name} = {case.value!r} ({case.why}): not one line naming it: {error}")
        elif not case.valid and error is None:
            wrong.append(f"{name} = {case.value!r} ({case.why}): accepted")
        elif not case.valid and name not in error:
            wrong.append(
                f"{name} = {case.value!r} ({case.why}): the error does not name it: {error}"
            )
    configurables = {c.selector for c in cases}
    parameters = {(c.selector, c.arg) for c in cases}
    print(
        f"\n{len(cases)} (configurable, parameter, value) cases over {len(parameters)} parameters "
        f"of {len(configurables)} configurables ({sum(not c.valid for c in cases)} of the values "
        "past a bound, not finite, of the wrong type or none of the valid ones)"
    )
    assert wrong == [], "\n".join(wrong)
    assert {
        "samplers.jax",
        "optax.adam",
        "rlax.train",
        "rewards.shouting",
        "algorithms.lite_ppo",
    } <= configurables


def test_every_number_a_built_in_takes_has_a_constraint_or_is_any_finite_number(plugins):
    """A numeric setting without a marker takes any finite number: these are the ones,
    each because every finite value means something (a seed, a score, a weight)."""
    any_number = {
        "seed",
        "score",
        "partial_score",
        "correct_score",
        "wrong_score",
        "pass_threshold",
        "weights",
        "lo",  # rewards.judge's score range: any finite ends, lo < hi (its rule)
        "hi",
    }
    unmarked = set()
    for selector in registered(plugins):
        for arg, annotation in hints(selector).items():
            item = item_annotation(annotation)
            numeric = number_type(annotation) or (item is not None and number_type(item))
            skipped = arg in any_number or arg == "return"
            if numeric and not constraints_of(annotation) and not skipped:
                unmarked.add(f"{selector}.{arg}")
    assert sorted(unmarked) == [], "\n".join(sorted(unmarked))


# -------------------------------------------------------------------------
# A handful through the real command line
# -------------------------------------------------------------------------

THROUGH_THE_CLI = [
    ("samplers.jax.top_k=-1", "samplers.jax.top_k: must be >= 0 (0: off), got -1"),
    (
        "rlax.trainer_settings.remat='all'",
        "rlax.trainer_settings.remat: one of none, block, block_dots, got 'all'",
    ),
    (
        "algorithms.grpo.clip_eps=1e999",
        "algorithms.grpo.clip_eps: must be a finite number, got inf",
    ),
    (
        "rlax.worker.reward_timeout_s='soon'",
        "rlax.worker.reward_timeout_s: expected float, got str",
    ),
]


@pytest.mark.serial  # it bounds wall-clock time (tests/test_suite_rules.py)
@pytest.mark.parametrize(("binding", "expected"), THROUGH_THE_CLI)
def test_a_handful_through_the_command_line_exit_2_in_one_line(binding, expected, tmp_path):
    start = time.monotonic()
    result = rlax_process("run", "--gin", "quickstart", f"--gin.{binding}", cwd=tmp_path)
    seconds = time.monotonic() - start

    assert result.returncode == 2
    assert result.stderr == f"rlax: error: --gin.{binding}: {expected}\n"
    assert "Traceback" not in result.stdout
    assert list(tmp_path.iterdir()) == []
    assert seconds < 60
