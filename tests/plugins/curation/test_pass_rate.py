"""Pass-rate curation with a stand-in policy of known pass rates, and the online curriculum."""

from __future__ import annotations

import numpy as np
import pytest

from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.curation.pass_rate import PassRateCurriculum, PassRateFilter
from rlax.plugins.rewards.math.verifier import MathReward


class StandInPolicy:
    """Answers prompt ``id`` correctly in exactly ``rates[id] * n`` of its ``n`` completions."""

    def __init__(self, rates: dict[str, float]) -> None:
        self.rates = rates
        self.calls: list[tuple[int, int]] = []

    def generate(self, prompts, n, *, seed):
        self.calls.append((len(prompts), n))
        out = []
        for p in prompts:
            right = round(self.rates[p.id] * n)
            texts = [f"#### {p.answer}"] * right + ["#### -1"] * (n - right)
            out.append(
                tuple(
                    Completion(np.zeros(1, np.int32), np.zeros(1, np.float32), t, "stop", 0)
                    for t in texts
                )
            )
        return out


RATES = {"never": 0.0, "rarely": 0.125, "half": 0.5, "often": 0.875, "always": 1.0}
PROMPTS = [Prompt(pid, pid, np.zeros(1, np.int32), str(i + 1)) for i, pid in enumerate(RATES)]


def test_keeps_prompts_whose_pass_rate_lies_in_the_range():
    policy = StandInPolicy(RATES)
    filt = PassRateFilter(reward=MathReward(), policy=policy, samples=8, batch_prompts=2)
    result = filt.offline(PROMPTS)
    assert [p.id for p in result.kept] == ["rarely", "half", "often"]
    reasons = {d.prompt.id: d.reason for d in result.dropped}
    assert reasons == {
        "never": "pass rate 0/8 below 0.05 (never solved)",
        "always": "pass rate 8/8 above 0.95 (always solved)",
    }
    assert filt.rates == RATES  # measured exactly what the stand-in does
    assert policy.calls == [(2, 8), (2, 8), (1, 8)]  # batches of 2 prompts, k = 8 each


def test_range_bounds_are_inclusive_and_scoring_can_use_the_reward_pool():
    filt = PassRateFilter(
        reward=MathReward(),
        policy=StandInPolicy(RATES),
        samples=8,
        min_rate=0.5,
        max_rate=1.0,
        reward_workers=2,
    )
    assert [p.id for p in filt.offline(PROMPTS).kept] == ["half", "often", "always"]


def test_bad_range_is_rejected():
    with pytest.raises(ValueError, match="min_rate <= max_rate"):
        PassRateFilter(reward=MathReward(), policy=None, min_rate=0.9, max_rate=0.1)


def group(pid: str, rewards) -> Group:
    prompt = Prompt(pid, pid, np.zeros(1, np.int32), "1")
    comp = Completion(np.zeros(1, np.int32), np.zeros(1, np.float32), "", "stop", 0)
    return Group(prompt, (comp,) * len(rewards), np.asarray(rewards, np.float32))


def test_curriculum_retires_prompts_solved_in_every_recent_attempt():
    cur = PassRateCurriculum(window=3)
    solved, mixed = [1, 1, 1, 1], [1, 0, 1, 1]
    attempts = [
        [group("a", solved), group("b", solved)],
        [group("a", solved), group("b", mixed)],
        [group("a", solved), group("b", solved)],  # a: 3 in a row -> retired after this
        [group("a", solved), group("b", solved)],
        [group("a", solved), group("b", solved)],  # b: solved, solved, solved -> retired
    ]
    kept = [[g.prompt.id for g in cur.online(groups)] for groups in attempts]
    assert kept == [["a", "b"], ["a", "b"], ["a", "b"], ["b"], ["b"]]
    assert cur.retired == {"a", "b"}
    assert cur.admit(PROMPTS[:1] + [group("a", [1]).prompt]) == PROMPTS[:1]


def test_curriculum_state_round_trips():
    cur = PassRateCurriculum(window=2)
    cur.online([group("a", [1, 1]), group("b", [1, 1]), group("b", [1, 1])])
    restored = PassRateCurriculum(window=2)
    restored.load_state_dict(cur.state_dict())
    assert restored.retired == {"b"}
    assert [g.prompt.id for g in restored.online([group("a", [1, 1])])] == ["a"]
    assert restored.retired == {"a", "b"}
