"""DAPO's soft overlong punishment, alone and added to a base reward."""

from __future__ import annotations

import numpy as np
import pytest

from rlax.core.plugins import build_plugin_manager
from rlax.core.types import Prompt, RewardResult
from rlax.plugins.rewards.arithmetic import ArithmeticReward
from rlax.plugins.rewards.overlong import OverlongPenalty, overlong_penalty

PROMPT = Prompt("p", "12+30=", np.array([1], np.int32), 42)


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, 0.0), (12, 0.0), (13, -0.25), (14, -0.5), (16, -1.0), (17, -1.0), (100, -1.0)],
)
def test_penalty_by_hand(length, expected):
    # L_max = 16, L_cache = 4: free up to 12, then -(|y| - 12) / 4, then -1 beyond 16.
    assert overlong_penalty(length, 16, 4) == pytest.approx(expected)


def test_alone_the_score_is_the_penalty():
    reward = OverlongPenalty(max_length=4, cache_length=2)
    result = reward.score(PROMPT, "123")
    assert isinstance(result, RewardResult)
    assert result.score == pytest.approx(-0.5) and "length 3" in result.reason


def test_added_to_a_base_reward():
    reward = OverlongPenalty(max_length=4, cache_length=1, base=ArithmeticReward())
    assert reward.score(PROMPT, "42").score == 1.0  # correct, short: untouched
    assert reward.score(PROMPT, "41").score == 0.0
    cut = reward.score(PROMPT, "4242")  # 4 characters: the budget ran out
    assert cut.score == -1.0 and cut.reason.startswith("wrong")


def test_a_plain_float_base_reward_works_too():
    class Half:
        def score(self, prompt, text):
            return 0.5

    assert (
        OverlongPenalty(max_length=2, cache_length=2, base=Half()).score(PROMPT, "ab").score == -0.5
    )


@pytest.mark.parametrize(("max_length", "cache_length"), [(4, 0), (4, 5)])
def test_invalid_settings(max_length, cache_length):
    with pytest.raises(ValueError, match="overlong"):
        OverlongPenalty(max_length=max_length, cache_length=cache_length)


def test_registered_through_its_entry_point():
    assert build_plugin_manager().get("rewards", "overlong").factory is OverlongPenalty
