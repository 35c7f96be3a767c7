"""Repeating decimals, base subscripts, choice letters and the imaginary unit, by law."""

from __future__ import annotations

import random
import string
from fractions import Fraction

import pytest

from rlax.plugins.rewards.math.equivalence import equivalent, imaginary_unit
from rlax.plugins.rewards.math.numbers import (
    MAX_EXPONENT,
    Refused,
    numeral_base,
    parse_number,
    subscripted_number,
)

DIGITS = string.digits + string.ascii_uppercase


def expansion(numerator: int, denominator: int) -> tuple[int, str, str]:
    """``(whole, digits before the block, repeating block)`` by long division.

    The reference: remainders are remembered, and the block starts where one
    comes back (a terminating decimal repeats its zero).
    """
    whole, remainder = divmod(numerator, denominator)
    seen: dict[int, int] = {}
    digits = []
    while remainder not in seen:
        seen[remainder] = len(digits)
        digit, remainder = divmod(remainder * 10, denominator)
        digits.append(str(digit))
    start = seen[remainder]
    return whole, "".join(digits[:start]), "".join(digits[start:])


def numeral(n: int, base: int) -> str:
    """``n`` written in ``base`` by repeated division (the reference)."""
    out = ""
    while True:
        n, digit = divmod(n, base)
        out = DIGITS[digit] + out
        if n == 0:
            return out


@pytest.mark.parametrize("denominator", range(2, 50))
def test_every_repeating_decimal_is_its_fraction_in_every_notation(denominator):
    for numerator in range(1, 3 * denominator):
        whole, fixed, block = expansion(numerator, denominator)
        value = Fraction(numerator, denominator)
        head = f"{whole}.{fixed}"
        spellings = [rf"{head}\overline{{{block}}}", rf"{head}\bar{{{block}}}", f"{head}({block})"]
        if len(block) == 1:
            spellings += [rf"{head}\dot{{{block}}}", rf"{head}\overline{block}"]
        else:
            spellings.append(rf"{head}\dot{{{block[0]}}}{block[1:-1]}\dot{{{block[-1]}}}")
        for spelling in spellings:
            assert parse_number(spelling) == (value, False), spelling
            assert parse_number("-" + spelling) == (-value, False), spelling


def test_repeating_decimals_computed_by_hand():
    assert parse_number(r"0.\overline{3}") == (Fraction(1, 3), False)
    assert parse_number(r"0.1\overline{6}") == (Fraction(1, 6), False)  # (16 - 1) / 90
    assert parse_number(r"2.\overline{5}") == (Fraction(23, 9), False)
    assert parse_number(r"0.\overline{9}") == (Fraction(1), False)  # 9/9
    assert parse_number(r"0.\dot{1}\dot{2}") == (Fraction(12, 99), False)
    assert parse_number(r"0.\overline{3}%") == (Fraction(1, 3), True)
    assert parse_number("0.333") == (Fraction(333, 1000), False)  # a truncation stays one


def test_a_repeating_block_longer_than_the_exponent_cap_is_refused():
    assert parse_number(r"0.\overline{" + "3" * MAX_EXPONENT + "}") == (Fraction(1, 3), False)
    with pytest.raises(Refused):
        parse_number(r"0.\overline{" + "3" * (MAX_EXPONENT + 1) + "}")


def test_every_numeral_with_a_subscript_is_its_value_in_that_base():
    rng = random.Random(0)
    for base in range(2, 37):
        for n in [0, 1, base - 1, base, *(rng.randrange(10**6) for _ in range(20))]:
            digits = numeral(n, base)
            assert parse_number(f"{digits}_{{{base}}}") == (Fraction(n), False)
            assert parse_number(f"{digits}_{base}") == (Fraction(n), False)
            assert parse_number(f"-{digits}_{{{base}}}") == (Fraction(-n), False)
            assert numeral_base(f"{digits}_{{{base}}}") == base
            assert parse_number(digits, digits_base=base) == (Fraction(n), False)


def test_base_numerals_computed_by_hand():
    assert parse_number("12_8") == (Fraction(10), False)  # 1*8 + 2
    assert parse_number("1010_2") == (Fraction(10), False)
    assert parse_number("1A_{16}") == (Fraction(26), False)
    assert parse_number("12", digits_base=8) == (Fraction(10), False)
    assert parse_number("12.5", digits_base=8) is None  # only a whole numeral
    assert numeral_base("12") is None and numeral_base("19_8") is None


def test_a_digit_its_base_lacks_is_refused_and_a_name_with_an_index_is_no_numeral():
    for wrong in ("19_8", "12_1", "12_{40}", "2_2"):
        with pytest.raises(Refused):
            parse_number(wrong)
    with pytest.raises(Refused):
        parse_number("9", digits_base=8)
    assert parse_number("P_{12}") is None  # P is 25: a name, for the other stages
    with pytest.raises(Refused):
        parse_number("1" * (MAX_EXPONENT + 1) + "_2")


def test_a_subscripted_number_is_found_anywhere():
    assert subscripted_number("12_8+1") and subscripted_number("3 _{2}")
    assert not subscripted_number("x_1") and not subscripted_number(r"\log_2 8")


def test_the_imaginary_unit_is_only_an_i_that_stands_alone():
    assert imaginary_unit("i^2") == "{I}^2"
    assert imaginary_unit("3+4i") == "3+4{I}"
    assert imaginary_unit(r"e^{i\pi}") == r"e^{{I}\pi}"
    for real in (r"\sin(x)", r"\pi", r"\infty", "x_i", "a_{i}", r"\sum_{i=1}^{3} i", r"\lim"):
        assert imaginary_unit(real) == real


@pytest.mark.parametrize("symbolic", [True, False])
def test_choice_letters_are_compared_as_labels(symbolic):
    for pred, gold, equal in [
        ("(B)", "B", True),
        ("B", "[B]", True),
        ("b", "(B)", True),
        ("B)", "B", True),
        ("(C)", "B", False),
        ("2", "(B)", False),
        ("(B)", "2", False),
        ("B", "b+1", False),
    ]:
        verdict = equivalent(pred, gold, symbolic=symbolic)
        assert verdict.equal == equal and verdict.reason == "choice", (pred, gold, verdict)
