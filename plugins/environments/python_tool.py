"""A tool-use environment: the model may run Python in the code sandbox before it answers.

Each model turn either calls tools (:mod:`.tool_calls`; the one tool is
``python`` with argument ``code``) or answers. A call's code runs in the
sandbox of :mod:`rlax.plugins.rewards.sandbox.run` (its own world, no
network, CPU, memory and process limits, ``tool_timeout_s`` of wall time);
what it printed, or its error, comes back as the observation. A tool that
fails (an exception, a malformed call, an unknown tool) is an observation
and counts as a tool error; a call the sandbox had to stop (the wall-clock
limit, a kill by a resource limit, a sandbox failure) is hostile or broken
code: the episode ends there with reward 0 and that reason, logged by the
episode runner. An answer (a turn without calls) ends the episode; the
``reward`` plugin scores its text.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, Positive
from rlax.core.contracts import Reward, ToolParser
from rlax.core.episodes import (
    EpisodeLimits,
    MaxEpisodeTokens,
    MaxTurns,
    MaxTurnTokens,
    Observation,
    ToolCall,
)
from rlax.core.rollout.reward_pool import score_one
from rlax.core.types import Prompt, RewardResult
from rlax.plugins.environments.chat import observation_ids, parts_ids, results_parts
from rlax.plugins.environments.tool_calls import HermesToolParser
from rlax.plugins.rewards.sandbox.interpreter import python_for_sandbox
from rlax.plugins.rewards.sandbox.run import Limits, run_sandboxed

TOOL = "python"


class PythonToolEnvironment:
    """Python in the sandbox as a tool, then an answer scored by ``reward``.

    Args:
      reward: scores the final answer's text (e.g. ``@rewards.math()``).
      parser: the tool-call parser (default ``@tool_parsers.hermes()``).
      max_turns, max_turn_tokens, max_episode_tokens, tool_timeout_s: the
        episode's limits (:class:`~rlax.core.episodes.EpisodeLimits`).
      memory_mb: address space of a tool call's process.
      run_memory_mb: memory of a tool call's whole run, all its processes
        together (``rewards.code``'s ``run_memory_mb``).
      max_output_chars: a tool's output is cut to this many characters.
      role: the chat role the tool's result is sent as.
      namespaces, allow_weak_isolation: as for ``rewards.code``.
    """

    def __init__(
        self,
        *,
        reward: Reward,
        parser: ToolParser | None = None,
        max_turns: MaxTurns = 4,
        max_turn_tokens: MaxTurnTokens = 0,
        max_episode_tokens: MaxEpisodeTokens = 512,
        tool_timeout_s: Annotated[float, Positive] = 5.0,
        memory_mb: Annotated[int, AtLeast(1)] = 256,
        run_memory_mb: Annotated[int, AtLeast(1)] = 512,
        max_output_chars: Annotated[int, AtLeast(0)] = 400,
        role: str = "user",
        namespaces: bool = True,
        allow_weak_isolation: bool = False,
    ):
        self.reward = reward
        self.parser = parser or HermesToolParser()
        self.limits = EpisodeLimits(max_turns, max_turn_tokens, max_episode_tokens, tool_timeout_s)
        self.sandbox = Limits(
            cpu_s=max(1, math.ceil(tool_timeout_s)),
            wall_s=tool_timeout_s,
            memory_mb=memory_mb,
            run_memory_mb=run_memory_mb,
        )
        self.max_output_chars = max_output_chars
        self.role = role
        self.namespaces, self.allow_weak_isolation = namespaces, allow_weak_isolation

    @property
    def result_framing(self) -> tuple[str, str] | None:
        """The parser's frame around each tool result (framing, not text), if it has one."""
        return getattr(self.parser, "result_framing", None)

    def start(self, prompt: Prompt, tokenizer: Any) -> PythonToolEpisode:
        return PythonToolEpisode(self, prompt, tokenizer)

    def run(self, code: str) -> tuple[str, str | None, bool]:
        """(output, error, contained) of one call: ``contained`` when the sandbox stopped it."""
        result = run_sandboxed(
            {"main.py": code},
            [python_for_sandbox(), "-I", "-S", "-B", "main.py"],
            limits=self.sandbox,
            namespaces=self.namespaces,
            allow_weak_isolation=self.allow_weak_isolation,
        )
        cut = self.max_output_chars
        if result.status != "finished" or result.signal is not None:
            why = result.detail or f"killed by signal {result.signal}"
            return "", f"sandbox stopped the tool call ({result.status}: {why})", True
        if result.returncode != 0:
            return result.stdout[:cut], (result.stderr.strip()[-cut:] or "exit status"), False
        return result.stdout[:cut], None, False


class PythonToolEpisode:
    """One problem: tool calls, then the answer."""

    def __init__(self, env: PythonToolEnvironment, prompt: Prompt, tokenizer: Any):
        self.env, self.prompt, self.tokenizer = env, prompt, tokenizer
        self.counts = {"tool_calls": 0.0, "tool_errors": 0.0, "failed": 0.0}
        self.result = RewardResult(0.0, "no answer")

    def step(self, turn_text: str) -> Observation | None:
        try:
            calls = self.env.parser.parse(turn_text)
        except ValueError as err:
            self.counts["tool_errors"] += 1
            return self._observe(f"error: {err}")
        if not calls:
            score, reason = score_one(self.env.reward, self.prompt, turn_text)
            self.result = RewardResult(score, reason or f"answer {turn_text[:40]!r}: {score:g}")
            return None
        results = []
        for call in calls:
            self.counts["tool_calls"] += 1
            text = self._call(call)
            if text is None:
                return None  # contained: the episode ends with reward 0
            results.append(text)
        shown = "\n".join(self.env.parser.format_result(c, r) for c, r in zip(calls, results))
        framing = self.env.result_framing
        if framing is None:
            return self._observe(shown)
        parts = results_parts(self.tokenizer, results, framing, role=self.env.role)
        return Observation(parts_ids(self.tokenizer, parts), shown)

    def _call(self, call: ToolCall) -> str | None:
        code = call.arguments.get("code")
        if call.name != TOOL or not isinstance(code, str):
            self.counts["tool_errors"] += 1
            return f"error: unknown tool {call.name!r} (the tool is {TOOL!r}, argument 'code')"
        output, error, contained = self.env.run(code)
        if contained:
            self.counts["failed"] = 1.0
            self.result = RewardResult(0.0, str(error))
            return None
        if error is not None:
            self.counts["tool_errors"] += 1
            return f"{output}error: {error}"
        return output

    def _observe(self, text: str) -> Observation:
        return Observation(observation_ids(self.tokenizer, text, role=self.env.role), text)

    def reward(self) -> RewardResult:
        return self.result

    @property
    def info(self) -> dict[str, float]:
        return dict(self.counts)


@hookimpl
def rlax_register_environments():
    return {"python_tool": PythonToolEnvironment}
