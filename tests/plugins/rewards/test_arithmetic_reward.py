import numpy as np
import pytest

from rlax.core.types import Prompt
from rlax.plugins.rewards.arithmetic import ArithmeticReward

PROMPT = Prompt(id="40+2", text="40+2=", tokens=np.zeros(1, np.int32), answer="42")


@pytest.mark.parametrize(
    "text,score",
    [
        ("42", 1.0),
        (" 42 ", 1.0),
        ("042", 1.0),
        ("+42", 1.0),
        ("43", 0.0),
        ("4", 0.0),
        ("420", 0.0),
        ("42+1", 0.0),
        ("", 0.0),
        ("forty-two", 0.0),
        ("-42", 0.0),
    ],
)
def test_exact_integer_match(text, score):
    result = ArithmeticReward().score(PROMPT, text)
    assert result.score == score
    assert result.reason  # always says why
