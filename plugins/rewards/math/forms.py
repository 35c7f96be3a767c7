"""Spellings that mean one thing: infinity, redundant braces, mixed numbers, power towers,
degree marks, and matrices and vectors written as LaTeX environments or nested lists.

Policy (``tests/plugins/rewards/math_table.py`` holds the labelled rows):

- **Infinity** is ``\\infty`` however spelled: ``∞``, ``\\infin``, ``inf``,
  ``infinity``, ``Infinity``, ``oo`` (sympy's), each with its sign;
  ``-\\infty`` is never ``\\infty``.
- **Redundant braces** are dropped: ``{{12}}`` is 12 and ``{\\{1,2\\}}`` is
  the set ``\\{1,2\\}``; an escaped brace is a set, so ``\\{\\{1,2\\}\\}``
  (a set holding a set) is not ``\\{1,2\\}``.
- **Mixed numbers**: ``2 1/4`` and ``2\\frac{1}{4}`` are 9/4; ``-2 1/4`` is
  -9/4.
- **Power towers** of integers are evaluated exactly when the value has at
  most ``TOWER_BITS`` bits (``2^{2^{3}}`` is 256; ``2^2^3`` reads right to
  left, as a tower does); a larger one is refused as before.
- **Degree marks** (``30^\\circ``, ``30°``) after a number are the unit
  ``deg`` (``units.py`` converts it).
- **Matrices and vectors**: ``pmatrix``, ``bmatrix``, ``Bmatrix``,
  ``matrix``, ``smallmatrix`` and ``array`` environments and nested lists
  (``[[1,2],[3,4]]``) are matrices, equal when their shapes match and every
  entry is equal; a one-row or one-column matrix is a vector, equal to the
  tuple or list of its entries (``(1, 2)``). A ``vmatrix`` is a determinant,
  not a matrix.

Standard library only.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["TOWER_BITS", "as_vector", "canonical", "mark_degrees", "matrix"]

TOWER_BITS = 4096  # 2^4096 has 1,234 digits: computed at once; more is refused

_INFINITY = re.compile(
    r"(?<![A-Za-z\\])(?:\\infin(?:ity)?|infinity|inf|oo|∞)(?![A-Za-z])", re.IGNORECASE
)
_DEGREE = re.compile(r"(.*\d\}?)\s*(?:\^\s*\{?\s*\\circ\s*\}?|°)")
_MIXED = re.compile(r"(?P<sign>[-+])?\s*(?P<whole>\d+)\s+(?P<a>\d+)\s*/\s*(?P<b>\d+)")
_ENVIRONMENT = re.compile(
    r"\\begin\{(?P<kind>[pbB]?matrix|smallmatrix|array)\}(?:\{[^{}]*\})?(?P<body>.*)\\end\{(?P=kind)\}",
    re.DOTALL,
)


def _strip_braces(s: str) -> str:
    """Drops ``{...}`` around the whole answer (not ``\\{``), repeatedly."""
    while len(s) >= 2 and s[0] == "{" and s[-1] == "}":
        depth = 0
        for k, c in enumerate(s):
            if c == "{" and (k == 0 or s[k - 1] != "\\"):
                depth += 1
            elif c == "}" and s[k - 1] != "\\":
                depth -= 1
                if depth == 0 and k != len(s) - 1:
                    return s  # {a}^{b}: the first group closes early
        s = s[1:-1].strip()
    return s


def _tower(s: str, bits: list[int]) -> int | None:
    """An integer power tower's exact value, or None (not a tower, or too large)."""
    s = _strip_braces(s.strip())
    if re.fullmatch(r"\d+", s):
        return int(s)
    depth, cut = 0, -1
    for k, c in enumerate(s):  # the first ^ at depth 0: a^b^c is a^(b^c)
        depth += c in "{(" and 1 or (-1 if c in "})" else 0)
        if c == "^" and depth == 0:
            cut = k
            break
    if cut < 0:
        return None
    base = _tower(s[:cut].strip("() "), bits) if s[:cut].strip() else None
    top = _tower(s[cut + 1 :].strip().removeprefix("(").removesuffix(")"), bits)
    if base is None or top is None:
        return None
    if base > 1 and top * base.bit_length() > bits[0]:
        raise OverflowError("tower too large")
    return base**top


def mark_degrees(s: str) -> str:
    """``30^\\circ`` / ``30°`` (a whole answer) as ``30 deg``; anything else unchanged."""
    return _DEGREE.sub(r"\1 deg", s) if _DEGREE.fullmatch(s) else s


def canonical(s: str) -> str:
    """A normalized answer with the spellings above made one."""
    s = _strip_braces(s)
    s = _INFINITY.sub(r"\\infty", s)
    mixed = _MIXED.fullmatch(s)
    if mixed:
        exact = int(mixed["whole"]) + Fraction(int(mixed["a"]), int(mixed["b"]))
        s = f"{mixed['sign'] or ''}\\frac{{{exact.numerator}}}{{{exact.denominator}}}"
    if "^" in s and re.fullmatch(r"[\d\s^{}()]+", s):
        try:
            value = _tower(s, [TOWER_BITS])
        except OverflowError:
            return s  # refused later, as every huge power
        if value is not None:
            s = str(value)
    return s


def _split(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside brackets and braces."""
    parts: list[str] = []
    depth, start = 0, 0
    for k, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(separator, k):
            parts.append(text[start:k])
            start = k + len(separator)
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _bracketed(s: str) -> str | None:
    """The inside of ``[...]`` or ``(...)`` wrapping the whole of ``s``, else None."""
    if len(s) < 2 or (s[0], s[-1]) not in (("[", "]"), ("(", ")")):
        return None
    return s[1:-1] if len(_split(s[1:-1], "\x00")) == 1 else None


def matrix(s: str, *, vectors: bool = False) -> list[list[str]] | None:
    """Rows of entries of a LaTeX matrix environment or a nested list; with ``vectors``,
    also of a flat tuple or list (one row). None for anything else."""
    s = s.strip()
    env = _ENVIRONMENT.fullmatch(s)
    if env:
        lines = [r for r in re.split(r"\\\\", env["body"]) if r.strip()]
        cells = [[c.strip() for c in r.split("&")] for r in lines]
        return cells if cells and len({len(r) for r in cells}) == 1 else None
    inside = _bracketed(s)
    if inside is None:
        return None
    items: list[str] = _split(inside, ",")
    inner = [_bracketed(item) for item in items]
    if all(x is not None and s[0] == "[" and item[0] == "[" for x, item in zip(inner, items)):
        rows = [_split(x, ",") for x in inner if x is not None]
        return rows if len({len(r) for r in rows}) == 1 else None
    return [items] if vectors and all(items) else None


def as_vector(rows: list[list[str]]) -> list[str] | None:
    """The entries of a one-row or one-column matrix, else None."""
    if len(rows) == 1:
        return rows[0]
    if all(len(r) == 1 for r in rows):
        return [r[0] for r in rows]
    return None
