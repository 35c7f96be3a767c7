"""The environment contract: multi-turn episodes, token in and token out.

An environment answers each model turn with an observation until the
episode ends, then gives its reward. The episode is ONE token sequence that
only ever grows: the prompt, the model's first turn (the sampler's ids and
logprobs), the observation's ids, the next turn, ... The worker appends the
ids it is handed and never decodes earlier turns to text and encodes them
again, so the trainer trains on exactly the ids the sampler produced and
the importance ratios see the sampler's own logprobs (a re-tokenised
conversation need not give the same ids: the bug TRL, verl and prime-rl
report for their agent loops). The loss mask says which ids were the
model's (1) and which the environment's (0).

:mod:`rlax.core.contracts` re-exports the Protocols (``Environment``,
``Episode``, ``ToolParser``); their members are documented here.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Protocol

import numpy as np

from rlax.core.constraints import AtLeast, Positive
from rlax.core.types import Prompt, RewardResult

__all__ = ["Environment", "Episode", "EpisodeLimits", "Observation", "ToolCall", "ToolParser"]


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the environment appends after a model turn.

    Attributes:
      tokens: int32 [O], the ids appended to the episode after the model's
        turn (its stop token included), already in the model's chat format:
        the end of the model's message is the stop token the model sampled,
        then e.g. ``\\n<|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``.
      text: the observation's text, for logs and traces.
    """

    tokens: np.ndarray
    text: str


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call a tool-call parser found in a model turn.

    Attributes:
      name: the tool's name.
      arguments: its arguments by name, as the model wrote them (JSON values).
    """

    name: str
    arguments: dict[str, Any]


# An environment's limits as its gin parameters declare them (rlax.core.constraints).
MaxTurns = Annotated[int, AtLeast(1)]
MaxTurnTokens = Annotated[int, AtLeast(0, means="0: the sampler's max_new_tokens")]
MaxEpisodeTokens = Annotated[int, AtLeast(1)]


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    """How long an episode may run; an environment's gin parameters set them.

    Attributes:
      max_turns: model turns per episode (the episode ends after the last).
      max_turn_tokens: tokens per model turn (0: the sampler's
        ``max_new_tokens``); a longer turn is cut there and ends the episode.
      max_episode_tokens: tokens after the prompt, model and observation
        together; an episode that reaches it ends (its last part cut there).
      tool_timeout_s: wall-clock seconds one tool call may take.
    """

    max_turns: MaxTurns = 4
    max_turn_tokens: MaxTurnTokens = 0
    max_episode_tokens: MaxEpisodeTokens = 256
    tool_timeout_s: Annotated[float, Positive] = 5.0

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_turn_tokens < 0 or self.max_episode_tokens < 1:
            raise ValueError(
                "episode limits: need max_turns >= 1, max_turn_tokens >= 0 and "
                f"max_episode_tokens >= 1; got {self.max_turns}, {self.max_turn_tokens}, "
                f"{self.max_episode_tokens}"
            )
        if not self.tool_timeout_s > 0:
            raise ValueError(
                f"episode limits: tool_timeout_s must be > 0, got {self.tool_timeout_s}"
            )


class Episode(Protocol):
    """One run of an environment from one prompt (what ``Environment.start`` returns).

    An episode may also have ``prompt_tokens``: the ids it opens with in place of the
    prompt's (a system message and the tools offered, rendered by the model's chat
    template), the same for every episode of one prompt; the trainer takes them as the
    group's prompt. Absent or None: the prompt's own ``tokens``.
    """

    def step(self, turn_text: str) -> Observation | None:
        """The answer to the model's turn (its text, stop token excluded), or None:
        the episode is over. A tool that fails or times out is an observation
        (its error as text), never an exception."""

    def reward(self) -> float | RewardResult:
        """The episode's reward once it is over (a number, or the number and why)."""

    @property
    def info(self) -> dict[str, float]:
        """Counts for the metrics, e.g. ``tool_calls`` and ``tool_errors`` (may be empty)."""


class Environment(Protocol):
    """What the workers, the inline trainer and the evaluation need of an environment.

    An environment whose observations frame tool results in its tool-call format's
    frame (``ToolParser.result_framing``) names that frame as ``result_framing``
    too: the episode runner then allows its control ids in an observation besides
    the chat template's, and no others.
    """

    @property
    def limits(self) -> EpisodeLimits:
        """Turns, tokens per turn, tokens per episode, seconds per tool call."""

    def start(self, prompt: Prompt, tokenizer: Any) -> Episode:
        """A new episode from ``prompt``; ``tokenizer`` is the policy's (a
        :class:`~rlax.core.contracts.Tokenizer`), to encode observations with."""


class ToolParser(Protocol):
    """Finds tool calls in a model turn and formats their results.

    A format whose results sit in a frame of its own (Hermes' ``<tool_response>``)
    may also name it as ``result_framing = (before, after)``: the environments then
    place the frame as framing, its spellings of the tokenizer's added tokens as
    their ids, and the result between as text (``environments.chat.results_parts``);
    ``format_result`` is then ``before + result + after``.
    """

    def parse(self, text: str) -> list[ToolCall]:
        """The calls in ``text``, in order (none: an answer). ValueError for a
        call that is there but malformed (the message says what is wrong)."""

    def format_result(self, call: ToolCall, result: str) -> str:
        """The text of the observation that answers ``call`` with ``result``."""
