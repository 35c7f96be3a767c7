"""Laws of the rules of issue 54 (``math/units.py``, ``math/forms.py``), one class each.

Each law is checked over many generated cases, like the fractions and bases
of ``test_math_notation.py``: a quantity equals its exact conversion into
every unit of its dimension and nothing of another dimension; every spelling
of infinity equals every other; a matrix equals itself in every notation and
nothing with one entry changed or transposed; a mixed number is its
fraction; a bounded tower is its exact value; braces change nothing.
"""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest

from rlax.plugins.rewards.math.equivalence import equivalent
from rlax.plugins.rewards.math.units import _KNOWN

RNG = random.Random(54)


def same(a: str, b: str) -> bool:
    verdict = equivalent(a, b, timeout_s=10.0)
    assert verdict.equal == equivalent(b, a, timeout_s=10.0).equal, (a, b)  # symmetric
    return verdict.equal


def spelled(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else rf"\frac{{{x.numerator}}}{{{x.denominator}}}"


UNITS = [u for u in _KNOWN if len(u) > 1 and _KNOWN[u][0] != "angle"]


@pytest.mark.parametrize("dimension", ["length", "time", "mass"])
def test_a_quantity_equals_its_exact_conversion_and_nothing_else(dimension):
    units = [u for u in UNITS if _KNOWN[u][0] == dimension]
    for a, b in itertools.combinations(units, 2):
        x = Fraction(RNG.randint(1, 999), RNG.choice([1, 2, 4, 5]))
        converted = x * _KNOWN[a][1] / _KNOWN[b][1]
        assert same(f"{spelled(x)} {a}", f"{spelled(converted)} {b}"), (x, a, b)
        if _KNOWN[a][1] != _KNOWN[b][1]:  # the number alone, in the other unit: wrong
            assert not same(f"{spelled(x)} {a}", f"{spelled(x)} {b}"), (x, a, b)


def test_quantities_of_different_dimensions_are_never_equal():
    for a, b in itertools.product(UNITS, UNITS):
        if _KNOWN[a][0] != _KNOWN[b][0]:
            factor = _KNOWN[a][1] / _KNOWN[b][1]
            assert not same(f"7 {a}", f"{spelled(7 * factor)} {b}"), (a, b)


def test_unknown_units_are_text_and_a_bare_number_takes_the_quantity_s_number():
    for word in ("apples", "widgets", "marbles"):
        assert same(f"12 {word}", f"12 {word[:-1]}") and not same(f"12 {word}", "12 coins")
        assert same("12", f"12 {word}") and not same("13", f"12 {word}")
    for unit in ("km", "hours", "kg"):
        assert same("12", f"12 {unit}") and not same("12000", f"12 {unit}")


@pytest.mark.parametrize("degrees", range(15, 721, 15))
def test_degrees_are_their_multiple_of_pi(degrees):
    k = Fraction(degrees, 180)
    radians = (
        rf"\frac{{{k.numerator}\pi}}{{{k.denominator}}}"
        if k.denominator > 1
        else rf"{k.numerator}\pi"
    )
    radians = (
        radians.replace("{1\\pi}", "{\\pi}").replace("1\\pi", "\\pi")
        if k.numerator == 1
        else radians
    )
    assert same(rf"{degrees}^\circ", radians)
    assert not same(rf"{degrees + 15}^\circ", radians)


SPELLINGS = [r"\infty", "∞", "infinity", "Infinity", "inf", "oo", r"\infin", r"+\infty"]


def test_every_spelling_of_infinity_is_every_other_and_the_sign_counts():
    for a, b in itertools.combinations(SPELLINGS, 2):
        assert same(a, b), (a, b)
    for a in SPELLINGS[:-1]:
        assert same(f"-{a}", r"-\infty") and not same(f"-{a}", r"\infty"), a


def notations(rows: list[list[int]]) -> list[str]:
    body = r"\\".join("&".join(map(str, r)) for r in rows)
    return [rf"\begin{{{env}}}{body}\end{{{env}}}" for env in ("pmatrix", "bmatrix", "matrix")] + [
        "[" + ",".join("[" + ",".join(map(str, r)) + "]" for r in rows) + "]"
    ]


@pytest.mark.parametrize("shape", [(2, 2), (2, 3), (3, 1), (1, 4)])
def test_a_matrix_is_itself_in_every_notation_and_not_with_an_entry_changed(shape):
    rows = [[RNG.randint(-9, 9) for _ in range(shape[1])] for _ in range(shape[0])]
    for a, b in itertools.combinations(notations(rows), 2):
        assert same(a, b), (a, b)
    changed = [r[:] for r in rows]
    changed[-1][-1] += 1
    assert not same(notations(rows)[0], notations(changed)[3])
    if shape[0] > 1 and shape[1] > 1:
        transposed = [list(c) for c in zip(*rows, strict=True)]
        if transposed != rows:
            assert not same(notations(rows)[0], notations(transposed)[3])
    if 1 in shape:  # a vector: the tuple of its entries
        entries = [x for r in rows for x in r]
        assert same(notations(rows)[0], "(" + ", ".join(map(str, entries)) + ")")


def test_a_mixed_number_is_its_fraction():
    for _ in range(40):
        whole, b = RNG.randint(1, 50), RNG.randint(2, 12)
        a = RNG.randint(1, b - 1)
        value = whole + Fraction(a, b)
        assert same(f"{whole} {a}/{b}", spelled(value)) and same(
            rf"{whole}\frac{{{a}}}{{{b}}}", spelled(value)
        )
        assert same(f"-{whole} {a}/{b}", "-" + spelled(value))
        assert not same(f"{whole} {a}/{b}", spelled(whole * Fraction(a, b)))


def test_a_bounded_tower_is_its_value_and_braces_group_its_base():
    for a, b, c in itertools.product(range(2, 5), range(1, 4), range(1, 4)):
        assert same(f"{a}^{{{b}^{{{c}}}}}", str(a ** (b**c))), (a, b, c)
        assert same(f"{{{a}^{{{b}}}}}^{{{c}}}", str((a**b) ** c)), (a, b, c)
    assert not same("9^{9^{9}}", "0") and not same("2^{2^{20}}", "2")  # refused, not computed


def test_braces_change_nothing_but_an_escaped_brace_is_a_set():
    for answer in ("12", r"\frac{1}{2}", r"\{1,2\}", "x+1", "(1, 2)"):
        for k in range(1, 5):
            assert same("{" * k + answer + "}" * k, answer), (k, answer)
    assert not same(r"\{\{1,2\}\}", r"\{1,2\}")


def test_issue_54_s_labelled_rows_cover_every_class_with_near_misses():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from math_table import TABLE, UNITS_AND_FORMS
    finally:
        sys.path.pop(0)
    assert len(UNITS_AND_FORMS) >= 40 and set(UNITS_AND_FORMS) <= set(TABLE)
    assert sum(not ok for _, _, ok in UNITS_AND_FORMS) >= 15
    text = " ".join(c + g for c, g, _ in UNITS_AND_FORMS)
    for mark in ("km", "hours", "kg", r"\circ", r"\pi", "infty", "matrix", "[[", "1/4", "^{2^"):
        assert mark in text, mark
