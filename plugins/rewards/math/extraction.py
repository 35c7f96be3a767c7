"""Finding the final answer in a model's math solution.

In order of precedence, the answer is: the argument of the *last* ``\\boxed{...}``
or ``\\fbox{...}`` (braces may nest), else what follows the last GSM8K marker
``#### ``, else what follows the last "the answer is" / "final answer:" or a
multiple-choice letter after a later "Answer:" (``Answer: (B)``), else (when
allowed, and only when the text has none of these markers) the last number
in the text, or its last formula (``$...$``) if that comes later.
Earlier candidates are ignored on purpose: a solution that boxes several
values is judged by the last, the one it settled on, rather than by the set
of all of them.

Every step is linear in the length of the text (one pass over its braces,
one over its ``$`` delimiters), so a 100 k-character completion made of
unclosed ``\\boxed{`` costs milliseconds, not seconds.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["Extraction", "extract_answer", "find_boxed", "unify_characters"]

# Full-width ASCII (U+FF01..U+FF5E) -> ASCII, and the look-alikes models emit.
_CHARACTERS: dict[int, int | str] = {code: code - 0xFEE0 for code in range(0xFF01, 0xFF5F)}
_CHARACTERS.update(
    {
        0x3000: " ",  # ideographic space
        0x2212: "-",  # minus sign
        0x2013: "-",  # en dash
        0x00D7: r"\times ",
        0x22C5: r"\cdot ",
        0x2009: r"\,",  # thin space (a thousands separator)
        0x202F: r"\,",  # narrow no-break space
        0x00A0: " ",
        0x3002: ".",  # ideographic full stop
    }
)

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*(\{|[^\s{])")
_BRACE = re.compile(r"(?<!\\)[{}]")
_GSM8K = re.compile(r"####[ \t]*")  # the answer is on its line
_ANSWER_IS = re.compile(r"(?:final\s+answer|the\s+answer)\s*(?:is|:|=)\s*:?\s*", re.IGNORECASE)
_LINE = re.compile(r"[^\n]*")
_LABEL = re.compile(r"(?<![A-Za-z])answer\s*:\s*", re.IGNORECASE)
_DECORATION = re.compile(r"\*\*|\$|\\text(?:bf)?\s*\{\s*(\(?[A-Z]\)?)\s*\}")
# An option's label, which the option's text may follow: (B), [B] or B) ...; or a
# capital letter alone on its line: B, B.
_OPTION = re.compile(r"\s*(?:\(([A-Z])\)|\[([A-Z])\]|([A-Z])\))(?:\s.*)?|\s*([A-Z])\.?\s*")
_SENTENCE_END = re.compile(r"\.\s")
NUMBER = (
    r"[-+]?(?:(?:\d{1,3}(?:(?:,|\\,)\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:[eE][-+]?\d+)?(?:/\d+)?(?:\\?%)?"
)
# A repeating decimal (0.\overline{3}, 0.(3), 0.\dot{3}) and a base subscript (12_8)
# belong to their number: the last number of "x = 0.(3)" is not 3, nor 12 of "12_8".
_REPEATING = (
    r"[-+]?\d*\.\d*(?:\\(?:overline|bar)\s*(?:\{\d+\}|\d)|\(\d+\)"
    r"|\\dot\s*\{?\d\}?(?:\d*\\dot\s*\{?\d\}?)?)"
)
_LAST_NUMBER = re.compile(
    rf"(?<![\w.])(?:[-+]?\\[dt]?frac\s*\{{\s*\d+\s*\}}\s*\{{\s*\d+\s*\}}|{_REPEATING}"
    rf"|{NUMBER}(?:_\{{?\d{{1,2}}\}}?)?)"
)
_DELIMITER = re.compile(r"(?<!\\)(?:\$\$|\$)|\\\(|\\\)|\\\[|\\\]")  # not \$: a dollar sign
_CLOSER = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}


@dataclasses.dataclass(frozen=True)
class Extraction:
    """An answer found in a text and how it was found.

    Attributes:
      answer: the answer as written (LaTeX or plain), stripped.
      method: ``"boxed"``, ``"gsm8k"``, ``"answer_is"``, ``"choice"``,
        ``"last_number"`` or ``"last_formula"``.
    """

    answer: str
    method: str


def unify_characters(text: str) -> str:
    """Maps full-width digits and letters, unicode minus and thin spaces to ASCII/LaTeX."""
    return text.translate(_CHARACTERS)


def _closing_braces(text: str) -> dict[int, int]:
    """``{index of an unescaped "{": index of its matching "}"}``, in one pass.

    One stack over the whole text, so finding every box costs O(n) however
    many ``\\boxed{`` it holds (scanning forward from each of them is
    quadratic when they do not close).
    """
    closing: dict[int, int] = {}
    opened: list[int] = []
    for match in _BRACE.finditer(text):
        if match.group() == "{":
            opened.append(match.start())
        elif opened:
            closing[opened.pop()] = match.start()
    return closing


def _boxes(text: str) -> tuple[list[str], bool]:
    """The complete ``\\boxed`` / ``\\fbox`` arguments in order, and whether any box opens."""
    closing: dict[int, int] | None = None
    found, opened = [], False
    for match in _BOXED.finditer(text):
        opened = True
        if match.group(1) != "{":  # \boxed 5: a single token
            found.append(match.group(1))
            continue
        if closing is None:
            closing = _closing_braces(text)
        end = closing.get(match.start(1))
        if end is not None:  # else unbalanced: a truncated completion
            found.append(text[match.start(1) + 1 : end])
    return found, opened


def find_boxed(text: str) -> list[str]:
    """Every complete ``\\boxed{...}`` / ``\\fbox{...}`` argument, in order (nesting kept)."""
    return _boxes(text)[0]


def _clean(answer: str) -> str:
    answer = answer.strip()
    if answer.count("$") >= 2:  # str.strip, not a regex: a run of "$" costs O(n)
        answer = answer.strip("$").strip()
    return answer.rstrip(" .。").strip()


def _last(marker: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The last match of ``marker`` in ``text``, or None.

    Markers are found on their own, not with the answer: "the answer is 4. No,
    the answer is 9." holds two markers, and the answer follows the second.
    """
    last = None
    for last in marker.finditer(text):
        pass
    return last


def _answer_after(marker: re.Match[str], text: str) -> str:
    """What follows ``marker`` to the end of its line (or sentence), cleaned."""
    line = _LINE.match(text, marker.end())
    answer = line.group() if line is not None else ""
    end = _SENTENCE_END.search(answer)
    return _clean(answer[: end.start()] if end is not None else answer)


def _option(line: str) -> str | None:
    """The option letter a line states (``(B)``, ``[B]``, ``B) 42``, ``**B**``), or None.

    Only a capital letter that is a label or stands alone: ``A pair of 3`` or
    ``I think 4`` is prose, not option A or I.
    """
    match = _OPTION.fullmatch(_DECORATION.sub(lambda m: m[1] or "", line))
    return None if match is None else next(g for g in match.groups() if g)


def _choice_after(text: str, after: int) -> str | None:
    """The option letter of the last "Answer:" that begins at ``after`` or later, or None."""
    last = _last(_LABEL, text)
    if last is None or last.start() < after:
        return None
    line = _LINE.match(text, last.end())
    return _option(line.group() if line is not None else "")


def _last_math_span(text: str) -> tuple[str, int] | None:
    """The content of the last closed ``$..$``, ``$$..$$``, ``\\(..\\)`` or ``\\[..\\]``, and its end.

    One pass over the delimiters (a lazy ``\\$(.+?)\\$`` regex rescans the
    rest of the text from every unclosed ``$``).
    """
    last, open_at, closer = None, -1, ""
    for match in _DELIMITER.finditer(text):
        token = match.group()
        if open_at < 0 and token in _CLOSER:
            open_at, closer = match.end(), _CLOSER[token]
        elif open_at >= 0 and token == closer:
            last, open_at = (text[open_at : match.start()], match.end()), -1
    return last


def _fallback(text: str) -> Extraction | None:
    """The last number, or the last displayed formula if it comes after it.

    ``So $x=\\frac{1}{2}$.`` answers ``\\frac{1}{2}``, not 2: a number inside
    a formula is judged as part of it (the right side of its last ``=``).
    """
    numbers = list(_LAST_NUMBER.finditer(text))
    span = _last_math_span(text)
    if span is not None and (not numbers or numbers[-1].start() < span[1]):
        formula = span[0].rsplit("=", 1)[-1].strip()
        if formula:
            return Extraction(formula, "last_formula")
    if numbers:
        return Extraction(numbers[-1].group().strip(), "last_number")
    return None


def extract_answer(text: str, *, fallback_last_number: bool = True) -> Extraction | None:
    """The final answer of a solution, or None if it states none.

    An explicit answer (a box, ``####``, "the answer is") that is empty or
    never closes (``\\boxed{\\frac{1}{}``, a truncated completion) is no
    answer: the last-number fallback is only for texts with no marker at all,
    never a second chance for one whose stated answer is missing.

    Args:
      text: the model's completion (or a reference solution).
      fallback_last_number: when no marker is found, take the last number
        (or the last formula, if it comes after the last number).

    Returns:
      The answer and the method that found it.
    """
    text = unify_characters(text)
    boxed, box_opened = _boxes(text)
    if boxed:
        return Extraction(boxed[-1].strip(), "boxed")
    marked = box_opened
    gsm8k = _last(_GSM8K, text)
    if gsm8k is not None:
        marked = True
        if answer := _answer_after(gsm8k, text):
            return Extraction(answer, "gsm8k")
    stated = _last(_ANSWER_IS, text)
    choice = _choice_after(text, stated.end() if stated is not None else 0)
    if choice is not None:  # an "Answer:" line after the last "the answer is"
        return Extraction(choice, "choice")
    if stated is not None:
        marked = True
        if answer := _answer_after(stated, text):
            return Extraction(_option(answer) or answer, "answer_is")
    if fallback_last_number and not marked:
        return _fallback(text)
    return None
