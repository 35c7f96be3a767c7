"""Finding the final answer in a model's math solution.

In order of precedence, the answer is: the argument of the *last* ``\\boxed{...}``
or ``\\fbox{...}`` (braces may nest), else what follows the last GSM8K marker
``#### ``, else what follows the last "the answer is" / "final answer:", else
(when allowed) the last number in the text. Earlier candidates are ignored on
purpose: a solution that boxes several values is judged by the last, the one
it settled on, rather than by the set of all of them.
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
_GSM8K = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(
    r"(?:final\s+answer|the\s+answer)\s*(?:is|:|=)\s*:?\s*([^\n]*)", re.IGNORECASE
)
NUMBER = (
    r"[-+]?(?:(?:\d{1,3}(?:(?:,|\\,)\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:[eE][-+]?\d+)?(?:/\d+)?(?:\\?%)?"
)
_LAST_NUMBER = re.compile(rf"(?<![\w.]){NUMBER}")


@dataclasses.dataclass(frozen=True)
class Extraction:
    """An answer found in a text and how it was found.

    Attributes:
      answer: the answer as written (LaTeX or plain), stripped.
      method: ``"boxed"``, ``"gsm8k"``, ``"answer_is"`` or ``"last_number"``.
    """

    answer: str
    method: str


def unify_characters(text: str) -> str:
    """Maps full-width digits and letters, unicode minus and thin spaces to ASCII/LaTeX."""
    return text.translate(_CHARACTERS)


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening at ``text[start] == "{"`` and its end."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif text[i] == "}" and text[i - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None  # unbalanced: a truncated completion


def find_boxed(text: str) -> list[str]:
    """Every complete ``\\boxed{...}`` / ``\\fbox{...}`` argument, in order (nesting kept)."""
    found = []
    for match in _BOXED.finditer(text):
        if match.group(1) == "{":
            group = _braced(text, match.start(1))
            if group is not None:
                found.append(group[0])
        else:  # \boxed 5: a single token
            found.append(match.group(1))
    return found


def _clean(answer: str) -> str:
    answer = answer.strip()
    answer = re.sub(r"^\$+|\$+$", "", answer).strip() if answer.count("$") >= 2 else answer
    return answer.rstrip(" .。").strip()


def extract_answer(text: str, *, fallback_last_number: bool = True) -> Extraction | None:
    """The final answer of a solution, or None if it states none.

    Args:
      text: the model's completion (or a reference solution).
      fallback_last_number: when no marker is found, take the last number.

    Returns:
      The answer and the method that found it.
    """
    text = unify_characters(text)
    boxed = find_boxed(text)
    if boxed:
        return Extraction(boxed[-1].strip(), "boxed")
    for method, pattern in (("gsm8k", _GSM8K), ("answer_is", _ANSWER_IS)):
        matches = [m.group(1) for m in pattern.finditer(text)]
        if matches and _clean(matches[-1]):
            return Extraction(_clean(matches[-1]), method)
    if fallback_last_number:
        numbers = _LAST_NUMBER.findall(text)
        if numbers:
            return Extraction(numbers[-1].strip(), "last_number")
    return None
