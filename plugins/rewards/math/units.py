"""Quantities: a number and its unit, equal to another only if it converts to it exactly.

Policy (``tests/plugins/rewards/math_table.py`` holds the labelled rows):

- **Known units convert exactly.** Length (m, km, cm, mm, in, ft, yd, mi),
  time (s, min, h, day, week), mass (g, kg, mg, lb, oz) and angle (degrees,
  radians) have exact rational factors (an inch is 2.54 cm, a pound
  0.45359237 kg, by definition); ``5 km`` is ``5000 m``, never ``5 m``; a
  unit may carry a power and a denominator (``cm^2``, ``km/h``). Different
  dimensions are never equal (``2 h`` is not ``2 kg``).
- **Unknown units are compared as text**: ``15 apples`` is ``15 apple``
  (a plural ``s`` dropped) but not ``15 oranges``.
- **A bare number against a quantity** answers it when it equals the
  quantity's number: the question named the unit (``45`` answers ``45^\\circ``
  and ``18 dollars``); a quantity answers a bare reference the same way.
- **Degrees and radians are one dimension**: ``30^\\circ`` is
  ``\\frac{\\pi}{6}`` (a multiple of pi with no unit is read as radians when
  the other side is in degrees), exactly: d degrees is d/180 of pi.
- Percentages stay with the numbers stage (``25\\%`` is 25 and 0.25).

Standard library only; ``equivalence.py`` calls :func:`compare_quantities`
before its numbers stage.
"""

from __future__ import annotations

import re
from fractions import Fraction

from rlax.plugins.rewards.math.numbers import _NOT_UNITS, Refused, parse_number

__all__ = ["Quantity", "compare_quantities", "quantity"]

# name -> (dimension, factor to the dimension's base unit)
_KNOWN: dict[str, tuple[str, Fraction]] = {}
for _names, _dimension, _factor in (
    ("m meter meters metre metres", "length", Fraction(1)),
    ("km kilometer kilometers kilometre kilometres", "length", Fraction(1000)),
    ("cm centimeter centimeters centimetre centimetres", "length", Fraction(1, 100)),
    ("mm millimeter millimeters millimetre millimetres", "length", Fraction(1, 1000)),
    ("in inch inches", "length", Fraction(254, 10000)),
    ("ft foot feet", "length", Fraction(3048, 10000)),
    ("yd yard yards", "length", Fraction(9144, 10000)),
    ("mi mile miles", "length", Fraction(1609344, 1000)),
    ("s sec secs second seconds", "time", Fraction(1)),
    ("min mins minute minutes", "time", Fraction(60)),
    ("h hr hrs hour hours", "time", Fraction(3600)),
    ("day days", "time", Fraction(86400)),
    ("week weeks", "time", Fraction(604800)),
    ("g gram grams", "mass", Fraction(1)),
    ("kg kilogram kilograms", "mass", Fraction(1000)),
    ("mg milligram milligrams", "mass", Fraction(1, 1000)),
    ("lb lbs pound pounds", "mass", Fraction(45359237, 100000)),
    ("oz ounce ounces", "mass", Fraction(45359237, 1600000)),
    ("deg degree degrees", "angle", Fraction(1)),
):
    for _name in _names.split():
        _KNOWN[_name] = (_dimension, _factor)
_RADIANS = {"rad", "rads", "radian", "radians"}

_ATOM = r"(?:\\unit\{[A-Za-z]\}|[A-Za-z]{2,}|°)"
_POWER = r"(?:\s*\^\s*\{?\s*[23]\s*\}?)?"
_PART = rf"{_ATOM}{_POWER}(?:\s*/\s*(?:\\unit\{{[A-Za-z]\}}|[A-Za-z]+){_POWER})?"
# a space before the unit: letters touching a number are variables (2ab)
_QUANTITY = re.compile(rf"(?P<number>.*?)(?:\s+|(?=\\unit))(?P<unit>{_PART})")
_PI = re.compile(
    r"(?P<sign>-)?\s*(?:\\frac\{(?P<a>\d*)\s*\\pi\}\{(?P<b>\d+)\}"
    r"|(?P<c>\d*)\s*\\pi\s*(?:/\s*(?P<d>\d+))?)\s*(?:rad|rads|radians?)?"
)

Quantity = tuple[Fraction, str, tuple[tuple[str, int], ...] | None, Fraction]
"""(number, unit text, dimensions ((name, power), ...) or None if unknown, factor)."""


def _unit(text: str) -> tuple[str, tuple[tuple[str, int], ...] | None, Fraction]:
    """``(key, dimensions or None, factor)`` of a unit expression."""
    text = re.sub(r"\\unit\{([A-Za-z])\}", r"\1", text).replace("°", "deg")
    parts = [p.strip() for p in text.split("/")]
    dims: dict[str, int] = {}
    factor, known = Fraction(1), True
    for sign, part in zip((1, -1), parts, strict=False):
        name, _, power = part.partition("^")
        name = name.strip().lower()
        exponent = int(power.strip(" {}") or 1) * sign
        if name in _RADIANS:
            name = "rad"
        if name not in _KNOWN:
            known = False
            continue
        dimension, unit_factor = _KNOWN[name]
        dims[dimension] = dims.get(dimension, 0) + exponent
        factor *= unit_factor**exponent
    key = re.sub(r"\s+", "", text.lower())
    key = "/".join(p[:-1] if p.endswith("s") and len(p) > 3 else p for p in key.split("/"))
    return key, (tuple(sorted(dims.items())) if known else None), factor


def quantity(answer: str) -> Quantity | None:
    """A normalized answer as ``(number, unit key, dimensions, factor)``, or None if it is
    not one number followed by a unit (a word that changes the value is no unit)."""
    match = _QUANTITY.fullmatch(answer.strip())
    if match is None or not match["number"]:
        return None
    words = re.findall(r"[A-Za-z]+", re.sub(r"\\unit\{[A-Za-z]\}", "", match["unit"]).lower())
    if any(w in _NOT_UNITS and w not in _KNOWN and w not in _RADIANS for w in words):
        return None
    try:
        number = parse_number(match["number"])
    except Refused:
        return None
    if number is None or number[1]:  # no number, or a percentage
        return None
    key, dims, factor = _unit(match["unit"])
    return number[0], key, dims, factor


def _pi_multiple(answer: str) -> Fraction | None:
    """k/n for an answer that is k pi / n (radians without a unit), else None."""
    match = _PI.fullmatch(answer.strip())
    if match is None:
        return None
    top = match["a"] if match["b"] else match["c"]
    value = Fraction(int(top or 1), int(match["b"] or match["d"] or 1))
    return -value if match["sign"] else value


def _degrees(q: Quantity) -> Fraction | None:
    """A quantity in degrees as its number of degrees, else None."""
    return q[0] if q[2] == (("angle", 1),) and q[1] in ("deg", "degree", "degrees") else None


def compare_quantities(pred: str, gold: str) -> bool | None:
    """Whether two normalized answers are the same quantity; None if the rules of
    quantities do not decide it (neither side has a unit: the numbers stage does)."""
    p, g = quantity(pred), quantity(gold)
    if p is None and g is None:
        return None
    if p is not None and g is not None:
        if p[2] is None or g[2] is None:  # an unknown unit: compared as text
            return p[0] == g[0] and p[1] == g[1]
        return p[2] == g[2] and p[0] * p[3] == g[0] * g[3]
    one, other = (p, gold) if p is not None else (g, pred)
    assert one is not None
    degrees, pi = _degrees(one), _pi_multiple(other)
    if degrees is not None and pi is not None:  # degrees against radians
        return degrees / 180 == pi
    if one[2] is None:
        return None  # an unknown unit against no unit: the numbers stage decides
    try:
        bare = parse_number(other)
    except Refused:
        return False
    if bare is None or bare[1]:
        return False if pi is not None or bare is not None else None
    return bare[0] == one[0]
