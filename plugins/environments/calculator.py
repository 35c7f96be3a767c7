"""``environments.calculator``: the calculator agent's game, played in process.

The environment twin of ``agents.calculator`` (:mod:`rlax.plugins.agents.calculator`):
the same conversation as the agent has with the endpoint, token for token, without
the endpoint. Each episode opens with the agent's first request as the endpoint
renders it (the system instruction with the ``calculate`` tool offered,
:func:`~rlax.core.rollout.agents.turns.with_tools`, then the question), as its
``prompt_tokens``. A model turn with tool calls (the parser's, Hermes by default)
is answered with one ``tool`` message per call holding the call's result
(:func:`~rlax.plugins.agents.calculator.call_result`), as the agent's client sends
them; a turn without calls, or whose calls are malformed, is the answer, which
``reward`` scores. After ``max_calls`` turns of calls the next turn is the last:
still calling there is no answer (reward 0), as for the agent.

So ``benchmarks/agents.py`` can compare an agent run with a run that samples the
same ids without HTTP, threads or recording (``environments_calculator.gin``
against ``agents_calculator.gin``).
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast
from rlax.core.contracts import Reward, ToolParser
from rlax.core.episodes import EpisodeLimits, MaxEpisodeTokens, MaxTurnTokens, Observation
from rlax.core.rollout.agents.turns import with_tools
from rlax.core.rollout.reward_pool import score_one
from rlax.core.types import Prompt, RewardResult
from rlax.plugins.agents.calculator import TOOL, call_result, opening
from rlax.plugins.environments.chat import messages_ids
from rlax.plugins.environments.tool_calls import HermesToolParser


class CalculatorEnvironment:
    """Arithmetic with a calculator tool: ``agents.calculator``'s game as an environment.

    Args:
      reward: scores the answer's text (``@rewards.arithmetic()``).
      parser: the tool-call parser (default ``@tool_parsers.hermes()``); the
        endpoint's ``samplers.agents.tool_parser`` for the agent.
      max_calls: turns of tool calls before the last turn (the agent's ``max_calls``).
      max_turn_tokens, max_episode_tokens: the episode's limits.
    """

    def __init__(
        self,
        *,
        reward: Reward,
        parser: ToolParser | None = None,
        max_calls: Annotated[int, AtLeast(0)] = 3,
        max_turn_tokens: MaxTurnTokens = 0,
        max_episode_tokens: MaxEpisodeTokens = 512,
    ):
        if max_calls < 0:
            raise ValueError(f"environments.calculator: max_calls must be >= 0, got {max_calls}")
        self.reward = reward
        self.parser = parser or HermesToolParser()
        self.limits = EpisodeLimits(max_calls + 1, max_turn_tokens, max_episode_tokens, 1.0)

    def start(self, prompt: Prompt, tokenizer: Any) -> CalculatorEpisode:
        return CalculatorEpisode(self, prompt, tokenizer)


class CalculatorEpisode:
    """One question: calls answered, then the answer scored."""

    def __init__(self, env: CalculatorEnvironment, prompt: Prompt, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "environments.calculator needs a chat model (its tokenizer has no chat template)"
            )
        self.env, self.prompt, self.tokenizer = env, prompt, tokenizer
        messages = with_tools(opening(prompt.text), [TOOL])
        self.prompt_tokens = np.asarray(tokenizer.encode_chat(messages), np.int32)
        self.counts = {"tool_calls": 0.0, "tool_errors": 0.0}
        self.result = RewardResult(0.0, "no answer: still calling after max_calls")

    def step(self, turn_text: str) -> Observation | None:
        try:
            calls = self.env.parser.parse(turn_text)
        except ValueError:
            calls = []  # a malformed call is the model's answer, as text (the endpoint's rule)
        if not calls:
            score, reason = score_one(self.env.reward, self.prompt, turn_text)
            self.result = RewardResult(score, reason or f"answer {turn_text[:40]!r}: {score:g}")
            return None
        results = [call_result(call.arguments) for call in calls]
        self.counts["tool_calls"] += len(calls)
        self.counts["tool_errors"] += sum(r.startswith("error: ") for r in results)
        return Observation(messages_ids(self.tokenizer, results, role="tool"), "\n".join(results))

    def reward(self) -> RewardResult:
        return self.result

    @property
    def info(self) -> dict[str, float]:
        return dict(self.counts)


@hookimpl
def rlax_register_environments():
    return {"calculator": CalculatorEnvironment}
