"""The linear answer extraction agrees with the obvious quadratic one."""

from __future__ import annotations

import random

from rlax.plugins.rewards.math.extraction import Extraction, extract_answer, find_boxed

TOKENS = [r"\boxed{", r"\fbox{", "{", "}", r"\{", r"\}", "x", "1", " ", "$", r"\boxed 7"]


def boxed_by_forward_scan(text: str) -> list[str]:
    """The reference: from each box, count braces forward until they balance."""
    found = []
    for start in range(len(text)):
        for name in (r"\boxed", r"\fbox"):
            if not text.startswith(name, start):
                continue
            i = start + len(name)
            while i < len(text) and text[i].isspace():
                i += 1
            if i < len(text) and text[i] != "{":
                found.append(text[i])
                continue
            depth = 0
            for j in range(i, len(text)):
                escaped = text[j - 1] == "\\"
                if text[j] == "{" and not escaped:
                    depth += 1
                elif text[j] == "}" and not escaped:
                    depth -= 1
                    if depth == 0:
                        found.append(text[i + 1 : j])
                        break
    return found


def test_find_boxed_equals_the_forward_scan_on_random_texts():
    rng = random.Random(0)
    texts = ["".join(rng.choices(TOKENS, k=rng.randint(0, 30))) for _ in range(2000)]
    for text in texts:
        assert find_boxed(text) == boxed_by_forward_scan(text), text


def test_an_answer_marker_without_an_answer_is_no_answer():
    assert extract_answer(r"\boxed{\frac{1}{} so 1") is None
    assert extract_answer("#### \nthe total is 5") is None
    assert extract_answer("the total is 5").answer == "5"  # no marker: the last number
    assert extract_answer("the total is 5", fallback_last_number=False) is None


def test_the_last_formula_is_judged_whole_when_it_comes_last():
    assert extract_answer(r"So $x=\frac{1}{2}$.").answer == r"\frac{1}{2}"
    assert extract_answer(r"So $x=\frac{1}{2}$.").method == "last_formula"
    assert extract_answer(r"With $n=3$ we get 6 ways").answer == "6"
    assert extract_answer(r"Total: $\$18$").answer == r"\$18"


def test_a_choice_is_a_capital_letter_on_the_last_answer_line():
    choice = Extraction("B", "choice")
    assert extract_answer("Answer: (B)") == choice
    assert extract_answer("So it is A, I think.\nAnswer: B.") == choice
    assert extract_answer("**Answer:** [B]") == choice
    assert extract_answer("Answer: (B) 42") == choice  # the label, then the option's text
    assert extract_answer("Answer: (A)\nNo.\nAnswer: B") == choice
    assert extract_answer("The answer is 5.\nAnswer: B") == choice  # the later marker
    assert extract_answer("Answer: B\nThe answer is C.") == Extraction("C", "answer_is")
    assert extract_answer("Final answer: B") == Extraction("B", "answer_is")
    assert extract_answer("The answer is (A) 12") == Extraction("A", "answer_is")
    assert extract_answer(r"\boxed{C} Answer: B") == Extraction("C", "boxed")
    assert extract_answer("#### 5\nAnswer: B") == Extraction("5", "gsm8k")


def test_a_capital_letter_in_prose_is_no_choice():
    assert extract_answer("Answer: A pair costs 5") == Extraction("5", "last_number")
    assert extract_answer("Answer: B, since 2 + 2 = 4") == Extraction("4", "last_number")
    assert extract_answer("A is the correct option.") is None
    assert extract_answer("Answer: b") is None
    assert extract_answer("Answer: I think so") is None
    assert extract_answer("Answer: B", fallback_last_number=False) == Extraction("B", "choice")


def test_the_last_number_keeps_its_repeating_block_and_its_base():
    assert extract_answer("so x = 0.(3)").answer == "0.(3)"
    assert extract_answer(r"so x = 0.1\overline{6}").answer == r"0.1\overline{6}"
    assert extract_answer(r"so x = 0.\dot{1}4285\dot{7}").answer == r"0.\dot{1}4285\dot{7}"
    assert extract_answer("the number is 12_8").answer == "12_8"
    assert extract_answer("the number is 12_{8}.").answer == "12_{8}"
    assert extract_answer("3 apples (and 4 pears)").answer == "4"  # no decimal point: no block
