"""Stage 1 of deciding whether two math answers are the same: numbers, exactly.

:func:`parse_number` reads a normalized answer
(:func:`rlax.plugins.rewards.math.equivalence.normalize`) as one rational
number (``fractions.Fraction``): an integer, a decimal with or without
thousands separators, e-notation, a fraction or mixed number, a power, a
percentage, a number word, a repeating decimal (``0.\\overline{3}``,
``0.(3)``, ``0.\\dot{3}``), a numeral with a base subscript (``12_8``), with
a trailing unit word or none; a word that changes the value is never taken
for a unit. :func:`compare_numbers` compares two, a percentage equal to both
its number and its hundredth. An exponent too large to evaluate is
:class:`Refused`, never computed, and so is a numeral with a digit its base
does not have (``19_8``).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = [
    "MAX_EXPONENT",
    "Refused",
    "compare_numbers",
    "numeral_base",
    "parse_number",
    "subscripted_number",
]

MAX_EXPONENT = 400  # 10**400 is cheap; 10**(10**8) is not


class Refused(ValueError):
    """An answer too large to evaluate safely (a huge exponent or a very long text)."""


_SEP = r"(?:,|\\,|\\ | )"
_DECIMAL = rf"(?:\d{{1,3}}(?:{_SEP}\d{{3}})+|\d+)(?:\.\d*)?|\.\d+"
_EXPONENT = r"(?:[eE]([-+]?\d+)|\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{?\s*([-+]?\d+)\s*\}?)"
_PLAIN = re.compile(rf"(?P<sign>[-+])?\s*(?P<num>{_DECIMAL}){_EXPONENT}?")
_FRAC = re.compile(
    rf"(?P<sign>[-+])?\s*(?P<whole>\d+)?\s*\\frac\s*"
    rf"(?:\{{\s*(?P<a>{_DECIMAL})\s*\}}|(?P<a1>\d))\s*(?:\{{\s*(?P<b>{_DECIMAL})\s*\}}|(?P<b1>\d))"
)
_SLASH = re.compile(rf"(?P<sign>[-+])?\s*(?P<a>{_DECIMAL})\s*/\s*(?P<b>{_DECIMAL})")
_UNIT = re.compile(r"(?:[A-Za-z]+\.?(?:\s*\^\s*\{?[23]\}?)?(?:/[A-Za-z]+)?\s*)+")
# The repeating block of a decimal: \overline{16} or \bar{16}, (16), or a dot over
# its one digit (\dot{6}) or over its first and last (\dot{1}4\dot{2} is 142 repeated).
_REPEATING = re.compile(
    r"(?P<sign>[-+])?\s*(?P<whole>\d*)\.(?P<fixed>\d*)\s*(?:"
    r"\\(?:overline|bar)\s*(?:\{\s*(?P<bar>\d+)\s*\}|(?P<bar1>\d))"
    r"|\((?P<paren>\d+)\)"
    r"|\\dot\s*(?:\{(?P<first>\d)\}|(?P<first1>\d))"
    r"(?:(?P<middle>\d*)\\dot\s*(?:\{(?P<last>\d)\}|(?P<last1>\d)))?)"
)
# A numeral and its base: 12_8, 12_{8}, 1A_{16}, -1010_2 (the base in decimal, 2..36).
_BASE = re.compile(
    r"(?P<sign>[-+])?\s*(?P<digits>[0-9A-Z]+)\s*_\s*(?:\{\s*(?P<b>\d{1,2})\s*\}|(?P<b1>\d{1,2}))"
)
_BARE = re.compile(r"(?P<sign>[-+])?\s*(?P<digits>[0-9A-Z]+)")  # a numeral, its base implied
_SUBSCRIPTED = re.compile(r"\d\s*_")
_POWER = re.compile(
    r"(?P<sign>[-+])?\s*(?P<base>\d+)\s*\^\s*(?:\{\s*(?P<e>[-+]?\d+)\s*\}|(?P<e1>\d))"
)
# Words after a number that change its value or join another answer: never a unit.
_NOT_UNITS = {
    "hundred",
    "hundreds",
    "thousand",
    "thousands",
    "million",
    "millions",
    "billion",
    "billions",
    "trillion",
    "trillions",
    "dozen",
    "dozens",
    "score",
    "gross",
    "half",
    "halves",
    "third",
    "thirds",
    "quarter",
    "quarters",
    "fourth",
    "fourths",
    "fifth",
    "fifths",
    "tenth",
    "tenths",
    "hundredth",
    "hundredths",
    "thousandth",
    "thousandths",
    "bn",
    "mn",
    "pi",
    "squared",
    "cubed",
    "times",
    "over",
    "plus",
    "minus",
    "and",
    "or",
    "to",
    "by",
    "sqrt",
    "root",
    "roots",
    "power",
    "factorial",
    "percent",
    "per",
    "cent",
    "not",
    "no",
    "degrees",
    "radians",
}
_WORDS = {
    word: i
    for i, word in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
}


def _decimal(text: str) -> Fraction:
    return Fraction(re.sub(_SEP, "", text).rstrip(".") or "0")


def parse_number(answer: str, *, digits_base: int = 10) -> tuple[Fraction, bool] | None:
    """``(value, is_percentage)`` if a normalized answer is one number, else None.

    Trailing words are allowed when they are a unit or name what is counted
    (``18 dollars``, ``5 cm^2``, ``15 apples``), never when they change the
    value or join another answer (``5 thousand``, ``3 million``, ``5 pi``,
    ``2 or 3``, see ``_NOT_UNITS``) or are one letter (``5 x`` is a product).

    Args:
      answer: a normalized answer.
      digits_base: the base of a numeral written without a subscript. A
        reference in base ``b`` (``12_8``) asks for an answer in base ``b``:
        :func:`numeral_base` of the reference is passed here for the
        prediction, whose bare digits (``12``) are then read in that base.
        With any base but 10, only a whole numeral is a number.

    Raises:
      Refused: an exponent past ``MAX_EXPONENT``, a numeral of more than
        ``MAX_EXPONENT`` digits, or a digit its base does not have.
    """
    s = answer.strip()
    based = _BASE.fullmatch(s)
    if based is not None:
        value = _in_base(based["digits"], int(based["b"] or based["b1"]))
        return None if value is None else (-value if based["sign"] == "-" else value, False)
    if digits_base != 10:
        bare = _BARE.fullmatch(s)
        if bare is None:
            return None
        value = _in_base(bare["digits"], digits_base, required=True)
        return None if value is None else (-value if bare["sign"] == "-" else value, False)
    if s.lower().endswith(" percent"):
        s = s[: -len("percent")].strip() + "%"
    percent = s.endswith("%")
    s = s.rstrip("%").strip()
    if s.lower() in _WORDS:
        return Fraction(_WORDS[s.lower()]), percent
    for pattern in (_REPEATING, _FRAC, _SLASH, _POWER, _PLAIN):
        match = pattern.match(s)
        if match is None or not _is_unit(s[match.end() :], percent):
            continue
        value = _value(pattern, match)
        if value is None:
            continue
        return (-value if match["sign"] == "-" else value), percent
    return None


def numeral_base(answer: str) -> int | None:
    """The base of an answer that is one numeral of its subscript's base (``12_8``: 8), else None."""
    match = _BASE.fullmatch(answer.strip())
    if match is None or len(match["digits"]) > MAX_EXPONENT:
        return None
    base = int(match["b"] or match["b1"])
    return base if _is_numeral(match["digits"], base) else None


def _is_numeral(digits: str, base: int) -> bool:
    return 2 <= base <= 36 and all(int(d, 36) < base for d in digits)


def subscripted_number(answer: str) -> bool:
    """Whether a digit in ``answer`` carries a subscript (``12_8``, ``3_{2}+1``)."""
    return _SUBSCRIPTED.search(answer) is not None


def _in_base(digits: str, base: int, *, required: bool = False) -> Fraction | None:
    """The numeral ``digits`` read in ``base`` (2..36; ``A``..``Z`` are 10..35).

    Place-value notation, as in Knuth, *The Art of Computer Programming*
    vol. 2, section 4.1: ``12_8`` is 1*8 + 2 = 10. Refused when it is no
    numeral of that base but was written as one (a decimal digit, or
    ``required``); letters alone that are no numeral (``P_{12}``, a name with
    an index) are None, for the other stages.
    """
    if len(digits) > MAX_EXPONENT:
        raise Refused(f"refused: a numeral of more than {MAX_EXPONENT} digits")
    if _is_numeral(digits, base):
        return Fraction(int(digits, base))
    if required or any(d.isdigit() for d in digits):
        raise Refused(f"refused: {digits[:20]} is no numeral in base {base}")
    return None


def _is_unit(rest: str, percent: bool) -> bool:
    """Whether ``rest``, the text after a number, leaves its value as it is."""
    rest = re.sub(r"\\unit\{[A-Za-z]\}", "unit", rest)
    rest = re.sub(r"\\[ ,;]|~", " ", rest).strip()  # LaTeX spaces before a unit
    if not rest:
        return True
    if percent or not _UNIT.fullmatch(rest):
        return False
    words = re.findall(r"(/?)([A-Za-z]+)", rest.lower())
    # One letter is a variable ("5 x"), except as a denominator ("km/h").
    return not any((len(w) == 1 and not per) or w in _NOT_UNITS for per, w in words)


def _power(match: re.Match[str]) -> Fraction | None:
    base, exponent = int(match["base"]), int(match["e"] or match["e1"])
    if base == 0 and exponent < 0:
        return None  # 0^-1 is no number
    if base > 1 and abs(exponent) * math.log10(base) > MAX_EXPONENT:
        raise Refused(f"refused: {base}^{exponent} beyond 10^+-{MAX_EXPONENT}")
    return Fraction(base) ** exponent


def _repeating(match: re.Match[str]) -> Fraction:
    """A decimal whose block repeats forever: ``0.1\\overline{6}`` is 1/6.

    With ``a`` digits before the block ``R`` of ``r`` digits after the point,
    ``0.A(R) = (AR - A) / (10^a (10^r - 1))``, the usual conversion of a
    recurring decimal to a fraction (Hardy & Wright, *An Introduction to the
    Theory of Numbers*, ch. IX). ``0.\\overline{9}`` is 1.
    """
    fixed = match["fixed"]
    block = match["bar"] or match["bar1"] or match["paren"]
    if block is None:  # dots: over one digit, or over the first and last of the block
        first, last = match["first"] or match["first1"], match["last"] or match["last1"]
        block = first if last is None else first + (match["middle"] or "") + last
    if len(fixed) + len(block) > MAX_EXPONENT:
        raise Refused(f"refused: a repeating decimal of more than {MAX_EXPONENT} digits")
    repeated = Fraction(int(fixed + block) - int(fixed or "0"))
    return int(match["whole"] or "0") + repeated / (10 ** len(fixed) * (10 ** len(block) - 1))


def _value(pattern: re.Pattern[str], match: re.Match[str]) -> Fraction | None:
    if pattern is _REPEATING:
        return _repeating(match)
    if pattern is _POWER:
        return _power(match)
    if pattern is _PLAIN:
        exponent = match.group(3) or match.group(4)
        if exponent is not None and abs(int(exponent)) > MAX_EXPONENT:
            raise Refused(f"refused: exponent {exponent} beyond +-{MAX_EXPONENT}")
        return _decimal(match["num"]) * Fraction(10) ** int(exponent or 0)
    if pattern is _FRAC:
        numerator = _decimal(match["a"] or match["a1"])
        denominator = _decimal(match["b"] or match["b1"])
        whole = Fraction(match["whole"] or 0)
    else:
        numerator, denominator, whole = _decimal(match["a"]), _decimal(match["b"]), Fraction(0)
    if denominator == 0:
        return None
    return whole + numerator / denominator


def compare_numbers(pred: tuple[Fraction, bool], gold: tuple[Fraction, bool]) -> bool:
    """Whether two answers :func:`parse_number` read are the same number; a percentage
    against a plain number also matches as its hundredth (``12.5%`` is ``0.125``)."""
    (p, p_percent), (g, g_percent) = pred, gold
    candidates = {p, p / 100} if p_percent and not g_percent else {p}
    targets = {g, g / 100} if g_percent and not p_percent else {g}
    return bool(candidates & targets)
