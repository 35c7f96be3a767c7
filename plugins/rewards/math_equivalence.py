"""Deciding whether two math answers are the same.

Three stages, cheapest first:

1. **Numbers**, compared exactly as rationals (``fractions.Fraction``):
   integers, decimals, thousands separators (``1,000``, ``1\\,000``,
   ``1{,}000``, ``1 000``), e-notation (``1.5e3``, ``1.5\\times10^{3}``),
   fractions (``3/4``, ``\\frac{3}{4}``, ``\\dfrac34``), mixed numbers
   (``2\\frac{1}{4}``), percentages (``12.5\\%`` equals both ``12.5`` and
   ``0.125``), currency signs and trailing unit words (``18 dollars``).
2. **Words**: an answer containing a word (two or more letters that are not a
   LaTeX command or a function name) is compared as text, case-insensitively.
   It never reaches sympy, which would read ``grown`` as the product
   ``g*r*o*w*n`` and call it equal to ``wrong``.
3. **Symbolic**: everything else (``\\sqrt{2}/2``, ``\\pi``, intervals,
   tuples, expressions) goes to math-verify, under a deadline and only after
   refusing inputs whose integer arithmetic could run away in C (power
   towers, huge exponents or factorials), which no Python-level alarm can stop.

The deadline is a ``SIGALRM`` timer when called on the main thread (as in a
:class:`rlax.core.worker.reward_pool.RewardPool` worker); the hard guarantee is the
pool's, which kills a worker that overruns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import signal
import threading
from collections.abc import Iterator
from fractions import Fraction

from rlax.plugins.rewards.math_extraction import unify_characters

__all__ = [
    "Refused",
    "Verdict",
    "VerifierTimeout",
    "deadline",
    "equivalent",
    "normalize",
    "parse_number",
]

MAX_CHARS = 400  # longer answers are refused, not parsed
MAX_EXPONENT = 400  # 10**400 is cheap; 10**(10**8) is not


class VerifierTimeout(Exception):
    """The symbolic comparison ran past its deadline."""


class Refused(ValueError):
    """An answer too large to evaluate safely (a huge exponent or a very long text)."""


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
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=\S)")


def normalize(answer: str) -> str:
    """Canonical spelling of an answer: one LaTeX dialect, no decoration."""
    s = unify_characters(answer).strip()
    s = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", s).strip()
    for _ in range(3):  # nested \text{\textbf{...}}
        s = _TEXT.sub(r" \1 ", s)
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = s.replace("{,}", ",").replace("\\%", "%")
    s = _REMOVE.sub("", s)
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    s = _ASSIGNMENT.sub("", s)
    return s


# ---------------------------------------------------------------------------
# Stage 1: numbers
# ---------------------------------------------------------------------------

_SEP = r"(?:,|\\,|\\ | )"
_DECIMAL = rf"(?:\d{{1,3}}(?:{_SEP}\d{{3}})+|\d+)(?:\.\d*)?|\.\d+"
_EXPONENT = r"(?:[eE]([-+]?\d+)|\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{?\s*([-+]?\d+)\s*\}?)"
_PLAIN = re.compile(rf"(?P<sign>[-+])?\s*(?P<num>{_DECIMAL}){_EXPONENT}?")
_FRAC = re.compile(
    rf"(?P<sign>[-+])?\s*(?P<whole>\d+)?\s*\\frac\s*"
    rf"(?:\{{\s*(?P<a>{_DECIMAL})\s*\}}|(?P<a1>\d))\s*(?:\{{\s*(?P<b>{_DECIMAL})\s*\}}|(?P<b1>\d))"
)
_SLASH = re.compile(rf"(?P<sign>[-+])?\s*(?P<a>{_DECIMAL})\s*/\s*(?P<b>{_DECIMAL})")
_UNIT = re.compile(r"[A-Za-z .]*")
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


def parse_number(answer: str) -> tuple[Fraction, bool] | None:
    """``(value, is_percentage)`` if a normalized answer is one number, else None.

    A trailing word (a unit) is allowed after the number.

    Raises:
      Refused: an exponent past ``MAX_EXPONENT``.
    """
    s = answer.strip()
    percent = s.endswith("%")
    s = s.rstrip("%").strip()
    if s.lower() in _WORDS:
        return Fraction(_WORDS[s.lower()]), percent
    for pattern in (_FRAC, _SLASH, _PLAIN):
        match = pattern.match(s)
        if match is None or not _UNIT.fullmatch(s[match.end() :]):
            continue
        rest = s[match.end() :].strip()
        if rest and (percent or not re.search(r"[A-Za-z]{2}", rest)):
            continue  # "5 x" is an expression, "5 apples" a number with a unit
        value = _value(pattern, match)
        if value is None:
            continue
        return (-value if match["sign"] == "-" else value), percent
    return None


def _value(pattern: re.Pattern[str], match: re.Match[str]) -> Fraction | None:
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


def _compare_numbers(pred: tuple[Fraction, bool], gold: tuple[Fraction, bool]) -> bool:
    (p, p_percent), (g, g_percent) = pred, gold
    candidates = {p, p / 100} if p_percent and not g_percent else {p}
    targets = {g, g / 100} if g_percent and not p_percent else {g}
    return bool(candidates & targets)


# ---------------------------------------------------------------------------
# Stage 2: words
# ---------------------------------------------------------------------------

_FUNCTIONS = {
    "sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp", "sqrt", "pi", "arcsin",
    "arccos", "arctan", "sinh", "cosh", "tanh", "max", "min", "gcd", "lcm", "mod", "inf",
}  # fmt: skip


def has_words(answer: str) -> bool:
    """True if ``answer`` holds a word that is not LaTeX or a function name."""
    # Three letters or more: "xy" is more often a product than a word.
    words = re.findall(r"(?<![\\A-Za-z])[A-Za-z]{3,}", answer)
    return any(w.lower() not in _FUNCTIONS for w in words)


def _text_key(answer: str) -> str:
    s = re.sub(r"\s+", " ", answer.lower()).strip(" .")
    return re.sub(r"^\(([a-z])\)$", r"\1", s)


# ---------------------------------------------------------------------------
# Stage 3: symbolic
# ---------------------------------------------------------------------------

_TOWER = re.compile(r"\^\s*\{[^{}]*\^|\^\s*\{?\s*\d{4,}|\d{4,}\s*!|\\binom\s*\{\s*\d{4,}")


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raises :class:`VerifierTimeout` in the block after ``seconds`` (main thread only).

    Off the main thread, or while another ``SIGALRM`` timer is running, the
    block runs unbounded; the caller's process pool is then the limit.
    """
    usable = (
        threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    )
    if not usable:
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise VerifierTimeout(f"symbolic comparison took longer than {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _symbolic(pred: str, gold: str) -> bool:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": ours is on
    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    gold_parsed = parse(f"${gold}$", extraction_config=configs, parsing_timeout=None)
    pred_parsed = parse(f"${pred}$", extraction_config=configs, parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


# ---------------------------------------------------------------------------
# The decision
# ---------------------------------------------------------------------------


def equivalent(pred: str, gold: str, *, timeout_s: float = 5.0, symbolic: bool = True) -> Verdict:
    """Whether answer ``pred`` means the same as ``gold``.

    Args:
      pred: the extracted prediction (LaTeX or plain).
      gold: the reference answer.
      timeout_s: deadline of the symbolic stage (see :func:`deadline`).
      symbolic: use math-verify for answers that are neither numbers nor words.

    Returns:
      The verdict and the stage that decided it.
    """
    if len(pred) > MAX_CHARS:
        return Verdict(False, f"refused: prediction longer than {MAX_CHARS} characters")
    p, g = normalize(pred), normalize(gold)
    if not p:
        return Verdict(False, "empty prediction")
    if p == g:
        return Verdict(True, "identical")
    try:
        p_num, g_num = parse_number(p), parse_number(g)
    except Refused as exc:
        return Verdict(False, str(exc))
    if p_num is not None and g_num is not None:
        return Verdict(_compare_numbers(p_num, g_num), "numbers")
    if has_words(p) or has_words(g):
        return Verdict(_text_key(p) == _text_key(g), "text")
    if not symbolic:
        return Verdict(False, "not equal as numbers or text (symbolic stage off)")
    if _TOWER.search(p):
        return Verdict(False, "refused: exponent tower or huge power/factorial")
    try:
        with deadline(timeout_s):
            return Verdict(_symbolic(p, g), "symbolic")
    except VerifierTimeout as exc:
        return Verdict(False, f"timeout: {exc}")
