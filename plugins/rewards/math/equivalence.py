"""Deciding whether two math answers are the same.

Both answers are first normalized and their spellings made one
(:mod:`rlax.plugins.rewards.math.forms`: infinity, redundant braces, mixed
numbers, bounded power towers, degree marks). After a multiple-choice letter
(``B``, ``(B)``, ``[B]``: compared as a letter, whatever the case of the
other side), matrices and vectors are compared entry by entry
(:mod:`~rlax.plugins.rewards.math.forms`) and quantities by exact
conversion, unknown units as text
(:mod:`rlax.plugins.rewards.math.units`); then three stages, cheapest first:

1. **Numbers** (:mod:`rlax.plugins.rewards.math.numbers`), compared exactly
   as rationals (``fractions.Fraction``): integers, decimals, thousands
   separators (``1,000``, ``1\\,000``, ``1{,}000``, ``1 000``), e-notation
   (``1.5e3``, ``1.5\\times10^{3}``), fractions (``3/4``, ``\\frac{3}{4}``,
   ``\\dfrac34``), mixed numbers (``2\\frac{1}{4}``), percentages
   (``12.5\\%`` equals both ``12.5`` and ``0.125``), powers (``10^{308}``
   equals ``1e308``), currency signs and trailing unit words
   (``18 dollars``), repeating decimals (``0.1\\overline{6}``, ``0.1(6)``,
   ``0.1\\dot{6}`` are 1/6) and numerals with a base subscript (``12_8`` is
   10), but not words that change the value (``5 thousand``, ``3 million``,
   ``5 pi``). A reference in base ``b`` reads the prediction's bare digits in
   base ``b`` (``12`` answers ``12_8``, ``10`` does not); a subscripted number
   anywhere else is never equal to anything but its own spelling.
2. **Words**: an answer containing a word (two or more letters that are not a
   LaTeX command or a function name) is compared as text, case-insensitively.
   It never reaches sympy, which would read ``grown`` as the product
   ``g*r*o*w*n`` and call it equal to ``wrong``.
3. **Symbolic**: everything else (``\\sqrt{2}/2``, ``\\pi``, intervals,
   tuples, expressions) goes to math-verify, ``i`` standing alone read as the
   imaginary unit (``i^2`` is -1); power towers, huge exponents and
   factorials are refused before it (the deadline would stop them, but only
   after the whole timeout).

The whole comparison runs under :func:`rlax.plugins.rewards.math.deadline.deadline`,
whose timeout is a ``BaseException`` that math-verify's ``except Exception``
cannot swallow; off the main thread the symbolic stage runs in a child
process killed at the deadline. The reward pool's kill is a second line, no
longer the only one.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re

from rlax.plugins.rewards.math.deadline import (
    VerifierTimeout,
    deadline,
    on_main_thread,
    run_in_child,
    within,
)
from rlax.plugins.rewards.math.extraction import unify_characters
from rlax.plugins.rewards.math.forms import as_vector, canonical, mark_degrees, matrix
from rlax.plugins.rewards.math.numbers import (
    Refused,
    compare_numbers,
    numeral_base,
    parse_number,
    subscripted_number,
)
from rlax.plugins.rewards.math.units import compare_quantities

__all__ = [
    "Verdict",
    "VerifierTimeout",
    "deadline",
    "equivalent",
    "load_math_verify",
    "normalize",
]

MAX_CHARS = 400  # longer answers are refused, not parsed


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether two answers are equivalent, and which stage decided."""

    equal: bool
    reason: str


# ---------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------

_REMOVE = re.compile(
    r"\\left|\\right|\\displaystyle|\\!|\\;|\\:|\\quad|\\qquad|\^\s*\{?\\circ\}?|°|\\\$|\$"
)
_TEXT = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
# A one-letter unit is a unit only in text mode right after a number: 12\text{ m}.
_TEXT_UNIT = re.compile(r"(\d)\s*(?:\\,|\\ |~)?\s*\\(?:text|mathrm|mbox)\s*\{\s*([A-Za-z])\s*\}")
# "2 or 3", "x=2 and x=3" list answers, like "2, 3" (the symbolic stage compares sets).
_CONJUNCTION = re.compile(r"(?<=[\w})\]])\s*,?\s+(?:or|and)\s+(?=[-\w\\({\[])", re.IGNORECASE)
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=\S)")


def normalize(answer: str) -> str:
    """Canonical spelling of an answer: one LaTeX dialect, no decoration."""
    s = unify_characters(answer).strip()
    s = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", s).strip()
    s = _TEXT_UNIT.sub(r"\1 \\unit{\2}", s)
    for _ in range(3):  # nested \text{\textbf{...}}
        s = _TEXT.sub(r" \1 ", s)
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = s.replace("{,}", ",").replace("\\%", "%")
    s = mark_degrees(s.strip())
    s = _REMOVE.sub("", s)
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    s = _CONJUNCTION.sub(", ", s)
    s = _ASSIGNMENT.sub("", s)
    return s


# ---------------------------------------------------------------------------
# Stage 2: words
# ---------------------------------------------------------------------------

_FUNCTIONS = {
    "sin",
    "cos",
    "tan",
    "cot",
    "sec",
    "csc",
    "log",
    "ln",
    "exp",
    "sqrt",
    "pi",
    "arcsin",
    "arccos",
    "arctan",
    "sinh",
    "cosh",
    "tanh",
    "max",
    "min",
    "gcd",
    "lcm",
    "mod",
    "inf",
}


_WORD = re.compile(r"(?<![\\A-Za-z0-9^_+\-*/=(\[{])[A-Za-z]{2,}(?![A-Za-z0-9^_+\-*/=)\]}])")


def has_words(answer: str) -> bool:
    """True if ``answer`` holds a word that is not LaTeX or a function name."""
    # Two letters or more: "no" and "on" are words, not the product n*o. Letters
    # touching a digit, an operator or a bracket are variables: 2ab, xy+1, \sqrt{ab}.
    words = _WORD.findall(answer)
    return any(w.lower() not in _FUNCTIONS for w in words)


_CHOICE = re.compile(r"\(\s*([A-Za-z])\s*\)|\[\s*([A-Za-z])\s*\]|([A-Za-z])\)?")


def _choice(answer: str) -> tuple[str, bool] | None:
    """``(letter, upper-case)`` if ``answer`` is one letter, bare or bracketed (``(B)``)."""
    match = _CHOICE.fullmatch(answer)
    if match is None:
        return None
    letter = match[1] or match[2] or match[3]
    return letter.upper(), letter.isupper()


def _choice_stage(p: str, g: str) -> Verdict | None:
    """Two multiple-choice letters, compared as letters; None unless one side is one.

    A capital letter alone (``B``, ``(B)``) is an option's label: the other
    side must be the same label, in either case, and nothing else (``2`` is
    not ``(B)``, and never reaches sympy, which reads ``(B)`` as the symbol b).
    """
    mine, theirs = _choice(p), _choice(g)
    if not ((mine is not None and mine[1]) or (theirs is not None and theirs[1])):
        return None
    return Verdict(mine is not None and theirs is not None and mine[0] == theirs[0], "choice")


def _text_key(answer: str) -> str:
    s = re.sub(r"\s+", " ", answer.lower()).strip(" .")
    return re.sub(r"^\(([a-z])\)$", r"\1", s)


# ---------------------------------------------------------------------------
# Stage 3: symbolic
# ---------------------------------------------------------------------------

# Refused at once (the deadline would stop them, after the whole timeout), on
# the text with its braces removed: "{9}^{{9}^{9}}" is "9^9^9".
_TOWER = re.compile(
    r"\^\s*\(?\s*[-+]?\d+\s*\)?\s*\^"  # 9^9^9, 10^(10)^10, (1+i)^(10^9): a tower
    r"|\^\s*\(?\s*[-+]?\d{4,}"  # 10^1000
    r"|\^\s*\(?\s*\d+\s*(?:\\cdot|\\times|\*)"  # 10^(999*999*999)
    r"|(?:\d{4,}|\^\s*\(?\s*\d+)\s*\)?\s*!"  # 99999!, (10^10)!
    # (x+y+z+1)^99: expanding a sum of variables to a power of 20 or more can run
    # for minutes inside one C-level call, where no alarm interrupts it.
    r"|\([^()]*[a-z][^()]*[-+][^()]*\)\s*\^\s*\(?\s*(?:[2-9]\d|\d{3,})"
    r"|\\binom[^!]*(?:\d{4,}|\^)"  # \binom{10^9}{...}
)


@functools.cache
def load_math_verify() -> tuple[object, object, list[object]]:
    """math-verify's ``parse``, ``verify`` and configs, imported and warmed once.

    Imported outside any deadline: an import interrupted half-way would leave
    a broken module behind for every later call.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": ours is on
    configs: list[object] = [LatexExtractionConfig(), ExprExtractionConfig()]
    warm = [parse(t, extraction_config=configs, parsing_timeout=None) for t in ("$1$", "$x+1$")]
    verify(*warm, timeout_seconds=None)  # the lazily built sympy and ANTLR parts
    return parse, verify, configs


def _symbolic(pred: str, gold: str) -> bool:
    parse, verify, configs = load_math_verify()
    gold_parsed = parse(f"${gold}$", extraction_config=configs, parsing_timeout=None)  # type: ignore[operator]
    pred_parsed = parse(f"${pred}$", extraction_config=configs, parsing_timeout=None)  # type: ignore[operator]
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))  # type: ignore[operator]


# i alone (not in a word, a command or a subscript) is the imaginary unit, as in
# every complex-number answer (3+4i); latex2sympy reads I as sympy.I, and {I}
# keeps its powers (it reads I^2 as I).
_IMAGINARY = re.compile(r"(?<![A-Za-z\\_])(?<!_\{)i(?![A-Za-z])")
_INDEXED = re.compile(r"\\(?:sum|prod)")  # i is an index there


def imaginary_unit(answer: str) -> str:
    """``answer`` with each ``i`` that stands alone written as sympy's imaginary unit."""
    return answer if _INDEXED.search(answer) else _IMAGINARY.sub("{I}", answer)


def _symbolic_stage(p: str, g: str, timeout_s: float) -> Verdict:
    """math-verify under the deadline: an alarm here, a killed child off the main thread."""
    if any(_TOWER.search(s.replace("{", "").replace("}", "")) for s in (p, g)):
        return Verdict(False, "refused: exponent tower or huge power/factorial")
    p, g = imaginary_unit(p), imaginary_unit(g)
    if on_main_thread():
        return Verdict(_symbolic(p, g), "symbolic")
    try:
        return Verdict(bool(run_in_child(_symbolic, (p, g), timeout_s)), "symbolic (child)")
    except VerifierTimeout as exc:
        return Verdict(False, f"timeout: comparison {exc}")
    except RuntimeError as exc:
        return Verdict(False, f"symbolic stage failed: {exc}")


# ---------------------------------------------------------------------------
# The decision
# ---------------------------------------------------------------------------


def equivalent(pred: str, gold: str, *, timeout_s: float = 5.0, symbolic: bool = True) -> Verdict:
    """Whether answer ``pred`` means the same as ``gold``, decided within ``timeout_s``.

    Args:
      pred: the extracted prediction (LaTeX or plain).
      gold: the reference answer.
      timeout_s: deadline of the whole comparison (see :func:`deadline`); past
        it the verdict is "not equal", with a reason starting "timeout".
      symbolic: use math-verify for answers that are neither numbers nor words.

    Returns:
      The verdict and the stage that decided it.
    """
    if len(pred) > MAX_CHARS:
        return Verdict(False, f"refused: prediction longer than {MAX_CHARS} characters")
    if symbolic and on_main_thread():
        load_math_verify()
    done, verdict = within(timeout_s, _decide, pred, gold, timeout_s, symbolic)
    return verdict if done else Verdict(False, f"timeout: comparison {verdict}")


def _matrix_stage(p: str, g: str, timeout_s: float, symbolic: bool) -> Verdict | None:
    """Matrices and vectors entry by entry (``forms.py``); None unless one side is one."""
    mine, theirs = matrix(p), matrix(g)
    if mine is None and theirs is None:
        return None
    mine, theirs = mine or matrix(p, vectors=True), theirs or matrix(g, vectors=True)
    if mine is None or theirs is None:
        return Verdict(False, "matrix: the other side is none")
    if (len(mine), len(mine[0])) != (len(theirs), len(theirs[0])):
        one, two = as_vector(mine), as_vector(theirs)
        if one is None or two is None or len(one) != len(two):
            return Verdict(False, "matrix: the shapes differ")
        mine, theirs = [one], [two]
    for row, other in zip(mine, theirs, strict=True):
        for x, y in zip(row, other, strict=True):
            if not _decide(x, y, timeout_s, symbolic).equal:
                return Verdict(False, "matrix: an entry differs")
    return Verdict(True, "matrix")


def _decide(pred: str, gold: str, timeout_s: float, symbolic: bool) -> Verdict:
    p, g = canonical(normalize(pred)), canonical(normalize(gold))
    if not p:
        return Verdict(False, "empty prediction")
    if p == g:
        return Verdict(True, "identical")
    choice = _choice_stage(p, g)
    if choice is not None:
        return choice
    grid = _matrix_stage(p, g, timeout_s, symbolic)
    if grid is not None:
        return grid
    same = compare_quantities(p, g)
    if same is not None:
        return Verdict(same, "quantities")
    try:
        p_num = parse_number(p, digits_base=numeral_base(g) or 10)
        g_num = parse_number(g)
    except Refused as exc:
        return Verdict(False, str(exc))
    if p_num is not None and g_num is not None:
        return Verdict(compare_numbers(p_num, g_num), "numbers")
    if any(subscripted_number(s) or numeral_base(s) for s in (p, g)):
        # sympy drops a number's subscript: 12_8 + 1 would equal 13.
        return Verdict(False, "refused: a number with a base subscript, not one numeral")
    if has_words(p) or has_words(g):
        return Verdict(_text_key(p) == _text_key(g), "text")
    if not symbolic:
        return Verdict(False, "not equal as numbers or text (symbolic stage off)")
    return _symbolic_stage(p, g, timeout_s)
