"""format, length and the weighted composite."""

from __future__ import annotations

import numpy as np
import pytest

from rlax.core.types import Prompt
from rlax.plugins.rewards.composite import CompositeReward
from rlax.plugins.rewards.format import FormatReward
from rlax.plugins.rewards.length import LengthReward, length_penalty
from rlax.plugins.rewards.math.verifier import MathReward

P = Prompt(id="q", text="q", tokens=np.zeros(1, np.int32), answer="4")


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("<think>2+2</think><answer>4</answer>", 1.0),
        ("  <think>2+2</think>\n\n<answer>4</answer>\n", 1.0),
        ("<answer>4</answer><think>2+2</think>", 0.5),  # out of order: partial
        ("Sure! <think>2+2</think><answer>4</answer>", 0.5),  # text outside: partial
        ("<think></think><answer>4</answer>", 0.5),  # empty reasoning is not reasoning
        ("<think>2+2</think>", 0.0),
        ("<think>2+2<answer>4</answer>", 0.0),
        ("4", 0.0),
    ],
)
def test_format_layout(text, score):
    assert FormatReward(partial_score=0.5).score(P, text).score == score


def test_format_custom_pattern_and_validation():
    boxed = FormatReward(pattern=r".*\\boxed\{.+\}\s*")
    assert boxed.score(P, r"so \boxed{4}").score == 1.0
    assert boxed.score(P, "so 4").score == 0.0
    with pytest.raises(ValueError, match="tag"):
        FormatReward(answer_tag="a>b")


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, -1.0), (5, -0.5), (10, 0.0), (15, 0.0), (20, 0.0), (25, -0.5), (30, -1.0), (99, -1.0)],
)
def test_length_penalty_by_hand(length, expected):
    assert length_penalty(length, 10, 20, 10) == pytest.approx(expected)


def test_length_reward_counts_words_or_chars():
    words = LengthReward(min_length=2, max_length=3, width=2, unit="words")
    assert words.score(P, "one").score == pytest.approx(-0.5)
    assert words.score(P, "one two three").score == 0.0
    assert LengthReward(max_length=3, width=2).score(P, "abcd").score == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="unit"):
        LengthReward(max_length=3, unit="tokens")


def test_composite_is_the_weighted_sum_and_explains_itself():
    reward = CompositeReward(
        rewards=[MathReward(), FormatReward(), LengthReward(max_length=30, width=10)],
        weights=[1.0, 0.2, 0.5],
        names=["math", "format", "length"],
    )
    good = "<think>2+2</think><answer>\\boxed{4}</answer>"  # 43 chars: 13 over
    result = reward.score(P, good)
    assert result.score == pytest.approx(1.0 + 0.2 * 1.0 + 0.5 * -1.0)
    assert result.reason.startswith("1*math=1 (correct") and "0.2*format=1" in result.reason
    wrong = reward.score(P, "<think>hm</think><answer>5</answer>")  # 35 chars: -0.5
    assert wrong.score == pytest.approx(0.0 + 0.2 - 0.25)
    with pytest.raises(ValueError, match="2 rewards, 1 weights"):
        CompositeReward(rewards=[MathReward(), FormatReward()], weights=[1.0])
