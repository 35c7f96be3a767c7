"""A guessing game with higher/lower feedback: the multi-turn quickstart's task.

The secret is a number in ``[0, size)``; the prompt says nothing about it.
Each model turn is a guess (decimal digits, then the stop id); the
environment answers ``>`` (the secret is higher) or ``<`` (lower), and a right
guess ends the episode with reward 1. ``max_turns`` wrong guesses end it with
reward 0. Halving the interval finds any secret of ``[0, 2**k)`` in ``k + 1``
guesses, guessing uniformly among the numbers the answers still allow takes
about ``2 ln(size)`` on average, so a policy gains by learning to use the
feedback well.

Ids: the observation is one character of the tokenizer's alphabet, appended
after the stop id the model produced (the toy character tokenizer has no
chat template; a chat model gets it in its template, :mod:`.chat`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import numpy as np

from rlax.core import hookimpl
from rlax.core.constraints import Range
from rlax.core.episodes import EpisodeLimits, MaxEpisodeTokens, MaxTurns, MaxTurnTokens, Observation
from rlax.core.types import Prompt, RewardResult
from rlax.plugins.environments.chat import observation_ids

ALPHABET = "0123456789<>?"
PROMPT = "?"


class GuessTask:
    """Secrets to find: ``"train"`` an endless stream drawn from ``seed``, ``"eval"``
    every secret of ``[0, size)`` once (the prompt is the same for all: the
    held-out measure is the success rate over every secret).

    Args:
      size: secrets are ``0 .. size - 1``.
    """

    alphabet = ALPHABET

    def __init__(self, *, size: Annotated[int, Range(ge=2, le=10000)] = 32):
        if not 2 <= size <= 10_000:
            raise ValueError(f"tasks.guess: size must be in [2, 10000], got {size}")
        self.size = size

    def _prompt(self, secret: int, split: str, tokenizer: Any, index: int) -> Prompt:
        tokens = np.asarray(tokenizer.encode(PROMPT, bos=True), np.int32)
        return Prompt(f"guess-{split}-{index}-{secret}", PROMPT, tokens, secret, {"split": split})

    def prompts(self, split: str, *, tokenizer: Any, seed: int) -> Iterator[Prompt]:
        if split == "eval":
            return iter([self._prompt(s, split, tokenizer, s) for s in range(self.size)])
        if split != "train":
            raise ValueError(f"tasks.guess: unknown split {split!r}; valid: train, eval")
        rng = np.random.default_rng(seed)

        def stream() -> Iterator[Prompt]:
            index = 0
            while True:
                yield self._prompt(int(rng.integers(self.size)), split, tokenizer, index)
                index += 1

        return stream()


def parse_guess(text: str) -> int | None:
    """The guess in a model turn, or None if it is not a plain decimal number."""
    text = text.strip()
    return int(text) if text.isdigit() and len(text) <= 5 else None


class GuessEpisode:
    """One game against one secret."""

    def __init__(self, secret: int, tokenizer: Any):
        self.secret, self.tokenizer = int(secret), tokenizer
        self.solved = False
        self.reason = "out of turns"
        self.guesses: list[int] = []

    def step(self, turn_text: str) -> Observation | None:
        guess = parse_guess(turn_text)
        if guess is None:
            self.reason = f"not a number: {turn_text[:20]!r}"
            return None
        self.guesses.append(guess)
        if guess == self.secret:
            self.solved, self.reason = True, f"found in {len(self.guesses)}"
            return None
        hint = ">" if self.secret > guess else "<"
        return Observation(observation_ids(self.tokenizer, hint), hint)

    def reward(self) -> RewardResult:
        return RewardResult(1.0 if self.solved else 0.0, self.reason)

    @property
    def info(self) -> dict[str, float]:
        return {}


class GuessEnvironment:
    """The higher/lower game (see the module docstring); the limits are its gin parameters.

    Args:
      max_turns: guesses per episode.
      max_turn_tokens: tokens per guess (digits and the stop id).
      max_episode_tokens: tokens per episode after the prompt.
    """

    def __init__(
        self,
        *,
        max_turns: MaxTurns = 5,
        max_turn_tokens: MaxTurnTokens = 3,
        max_episode_tokens: MaxEpisodeTokens = 24,
    ):
        self.limits = EpisodeLimits(
            max_turns=max_turns,
            max_turn_tokens=max_turn_tokens,
            max_episode_tokens=max_episode_tokens,
        )

    def start(self, prompt: Prompt, tokenizer: Any) -> GuessEpisode:
        return GuessEpisode(prompt.answer, tokenizer)


class GuessReward:
    """1 when the episode's last guess is the secret (the episode's own reward, from its text:
    the runner joins the turns and observations with ``" | "``)."""

    def score(self, prompt: Prompt, completion_text: str) -> float:
        return float(parse_guess(completion_text.split(" | ")[-1]) == int(prompt.answer))


@hookimpl
def rlax_register_environments():
    return {"guess": GuessEnvironment}


@hookimpl
def rlax_register_tasks():
    return {"guess": GuessTask}


@hookimpl
def rlax_register_rewards():
    return {"guess": GuessReward}
