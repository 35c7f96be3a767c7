"""Multi-turn episodes, token in and token out, behind the Sampler contract.

``samplers.episodes(sampler=..., environment=...)`` is a
:class:`~rlax.core.contracts.Sampler`: ``generate(prompts, n)`` plays ``n``
episodes per prompt and returns each as ONE :class:`~rlax.core.types.Completion`
whose ``tokens`` are every id after the prompt, model turns and observations
in order, with ``loss_mask`` 1 on the model's ids (their logprobs the inner
sampler's) and 0 on the observations' (logprob 0), and ``episode`` the
environment's report (its ``reward`` replaces the reward plugin's). So a
worker, the inline trainer and ``rlax eval`` run episodes unchanged, one
lease holds whole episodes, and the trainer pads to ``max_new_tokens`` =
the episode's token limit.

An episode may open with ids of its own (``Episode.prompt_tokens``: a system
message and tools rendered by the chat template, as an agent's first request
is): they are the group's prompt (``episode["prompt_tokens"]``, which
:func:`~rlax.core.rollout.groups.episode_prompt` reads), so they must be a
function of the prompt; an episode whose opening differs from its group's ends
before its first turn with reward 0.

Each turn the inner sampler continues the episode's ids as they stand
(``Prompt.tokens`` = prompt + everything so far): the ids are appended, never
decoded and encoded again, so what the trainer scores is exactly what the
sampler produced (``retokenized_tokens`` is 0 by construction; the tests
check it). Turns of all live episodes are sampled in one batched call.

A mixture-of-experts sampler's routes (routing replay) are the last model
turn's record: the prompt and every id before that turn as its prefill routed
them, then the turn's own; observations after it have -1 (the trainer routes
them itself). Earlier turns' tokens were routed the same way when they were
sampled up to float rounding of prefill against decode (a near-tie).

Tool text is text (:mod:`.chat`): an observation may hold the control ids of
its chat framing and no other; one whose text brought control tokens (a
tool's output encoded with its ``<|im_end|>`` as the real token) ends its
episode with reward 0 and that reason, before any of it reaches the context.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlax.core import hookimpl
from rlax.core.contracts import Environment, Episode, Sampler
from rlax.core.episodes import EpisodeLimits, Observation
from rlax.core.types import Completion, Prompt, RewardResult
from rlax.plugins.environments.chat import ControlTokens

log = logging.getLogger("rlax.environments")


@dataclasses.dataclass
class _Live:
    """One episode as it is being played."""

    prompt: Prompt
    episode: Episode | None
    tokens: list[np.ndarray] = dataclasses.field(default_factory=list)
    logprobs: list[np.ndarray] = dataclasses.field(default_factory=list)
    mask: list[np.ndarray] = dataclasses.field(default_factory=list)
    versions: list[np.ndarray] = dataclasses.field(default_factory=list)
    floors: list[np.ndarray] = dataclasses.field(default_factory=list)  # the sampler's kept sets
    # A mixture-of-experts sampler's record (routing replay): the latest model turn's, which
    # covers the prompt, everything before the turn (as its prefill routed it) and the turn.
    routes: np.ndarray | None = None
    parts: list[str] = dataclasses.field(default_factory=list)
    turns: int = 0
    observation_tokens: int = 0
    opened: bool = False  # the episode opened with its own ids (``Episode.prompt_tokens``)
    finish: str = ""
    failure: str = ""

    @property
    def length(self) -> int:
        return sum(len(t) for t in self.tokens)

    def turn_prompt(self) -> Prompt:
        ids = np.concatenate([self.prompt.tokens, *self.tokens]).astype(np.int32)
        return dataclasses.replace(self.prompt, tokens=ids)

    def append(
        self, ids: np.ndarray, logprobs: np.ndarray, model: bool, version: np.ndarray, floors=None
    ):
        self.tokens.append(np.asarray(ids, np.int32))
        self.logprobs.append(np.asarray(logprobs, np.float32))
        self.mask.append(np.full(len(ids), int(model), np.int8))
        self.versions.append(np.asarray(version, np.int32))
        none = np.full(len(ids), -np.inf, np.float32)  # -inf: the full distribution
        self.floors.append(none if floors is None else np.asarray(floors, np.float32))

    def fail(self, reason: str) -> None:
        self.failure, self.finish = reason, "stop"


class EpisodeSampler:
    """Plays an environment's episodes with an inner sampler (see the module docstring).

    Args:
      sampler: the sampler of each model turn (``@samplers.jax()`` or ``@samplers.engine()``).
      environment: the environment (``@environments.<name>()``); its ``limits``
        bound turns, tokens per turn and tokens per episode.
    """

    def __init__(self, *, sampler: Sampler, environment: Environment):
        self.sampler = sampler
        self.environment = environment
        self.tokenizer: Any = None
        self._control: ControlTokens | None = None

    @property
    def limits(self) -> EpisodeLimits:
        return self.environment.limits

    def _controls(self, tokenizer: Any) -> ControlTokens:
        """The control ids the environment's observations may hold: the chat template's
        framing and the frame of its tool-call format, if it names one."""
        return ControlTokens(tokenizer, getattr(self.environment, "result_framing", None))

    @property
    def temperature(self) -> float:
        return self.sampler.temperature

    @property
    def max_new_tokens(self) -> int:
        """The episode's token limit: no episode is longer after its prompt."""
        return self.limits.max_episode_tokens

    def setup(self, model, tokenizer) -> None:
        self.sampler.setup(model, tokenizer)
        self.tokenizer = tokenizer
        self._control = self._controls(tokenizer)

    def load_weights(self, params, version: int) -> None:
        self.sampler.load_weights(params, version)

    def generate(
        self, prompts: Sequence[Prompt], n: int, *, seed: int
    ) -> list[tuple[Completion, ...]]:
        """``n`` episodes of each prompt, each one Completion (see the module docstring)."""
        lives = [self._start(p) for p in prompts for _ in range(n)]
        for i in range(len(prompts)):
            _one_opening(lives[i * n : (i + 1) * n], self.tokenizer)
        for turn in range(self.limits.max_turns):
            active = [e for e in lives if not e.finish]
            if not active:
                break
            turn_seed = zlib.crc32(f"{seed}/{turn}".encode())
            outs = self.sampler.generate([e.turn_prompt() for e in active], 1, seed=turn_seed)
            last = turn == self.limits.max_turns - 1
            for live, (completion,) in zip(active, outs):
                self._model_turn(live, completion, last)
        done = [self._finish(e) for e in lives]
        return [tuple(done[i * n : (i + 1) * n]) for i in range(len(prompts))]

    def _start(self, prompt: Prompt) -> _Live:
        try:
            episode = self.environment.start(prompt, self.tokenizer)
            opening = getattr(episode, "prompt_tokens", None)
            if opening is None:
                return _Live(prompt, episode)
            ids = np.asarray(opening)
            if ids.ndim != 1 or not len(ids) or ids.dtype.kind not in "iu":
                raise ValueError(
                    f"prompt_tokens must be a non-empty list of token ids, got {opening!r:.60}"
                )
            outside = _outside_vocabulary(ids, self.tokenizer)
            if outside is not None:
                raise ValueError(f"prompt_tokens {outside}")
            return _Live(
                dataclasses.replace(prompt, tokens=ids.astype(np.int32)), episode, opened=True
            )
        except Exception as err:  # noqa: BLE001 -- a broken environment costs its episode
            live = _Live(prompt, None)
            _lost(live, f"environment start raised {type(err).__name__}: {err}", self.tokenizer)
            return live

    def _model_turn(self, live: _Live, c: Completion, last: bool) -> None:
        limits = self.limits
        room = limits.max_episode_tokens - live.length
        k = min(len(c.tokens), limits.max_turn_tokens or len(c.tokens), room)
        versions = (
            c.versions if c.versions is not None else np.full(len(c.tokens), c.policy_version)
        )
        floors = None if c.kept_floor is None else c.kept_floor[:k]
        if c.routes is not None:  # the turn's prompt (the episode so far) and its kept ids
            live.routes = c.routes[: len(live.prompt.tokens) + live.length + k]
        live.append(c.tokens[:k], c.logprobs[:k], True, versions[:k], floors)
        cut = k < len(c.tokens)
        text = self.tokenizer.decode(c.tokens[:k]) if cut else c.text
        live.parts.append(text)
        live.turns += 1
        if cut or c.finish_reason != "stop":
            live.finish = "length"
            return
        observation = self._step(live, text)
        if observation is None or live.finish:
            live.finish = live.finish or "stop"
            return
        if last:
            live.finish = "length"  # turns are used up; the observation is not appended
            return
        ids = np.asarray(observation.tokens, np.int32)
        if self._control is None:
            self._control = self._controls(self.tokenizer)
        refused = self._control.refusal(ids) or _outside_vocabulary(ids, self.tokenizer)
        if refused is not None:
            live.fail(f"environment observation refused: {refused}")
            return
        ids = ids[: limits.max_episode_tokens - live.length]
        live.append(ids, np.zeros(len(ids)), False, np.full(len(ids), versions[k - 1]))
        live.parts.append(observation.text)
        live.observation_tokens += len(ids)
        if live.length >= limits.max_episode_tokens:
            live.finish = "length"

    def _step(self, live: _Live, text: str) -> Observation | None:
        assert live.episode is not None
        try:
            return live.episode.step(text)
        except Exception as err:  # noqa: BLE001 -- a broken environment costs its episode
            live.fail(f"environment step raised {type(err).__name__}: {err}")
            return None

    def _finish(self, live: _Live) -> Completion:
        score, reason = self._reward(live)
        info = {}
        if live.episode is not None:
            try:
                info = {k: float(v) for k, v in dict(live.episode.info).items()}
            except Exception as err:  # noqa: BLE001 -- counts are only metrics
                log.warning("episode of prompt %r: info raised %s", live.prompt.id, err)
        failed = float(bool(live.failure) or info.pop("failed", 0.0) > 0)
        if failed:
            score = 0.0
            log.warning("episode of prompt %r ends with reward 0: %s", live.prompt.id, reason)
        versions = np.concatenate(live.versions)
        oldest = int(versions.min()) if len(versions) else -1
        floors = np.concatenate(live.floors) if live.floors else np.zeros(0, np.float32)
        routes = None
        if live.routes is not None:  # observations after the last model turn: -1 (none)
            routes = np.full((len(live.prompt.tokens) + live.length, *live.routes.shape[1:]), -1)
            routes = routes.astype(live.routes.dtype)
            routes[: len(live.routes)] = live.routes
        return Completion(
            tokens=np.concatenate(live.tokens).astype(np.int32),
            logprobs=np.concatenate(live.logprobs).astype(np.float32),
            text=" | ".join(live.parts),
            finish_reason=live.finish or "length",
            policy_version=max(oldest, 0),
            versions=versions if len(set(versions.tolist())) > 1 else None,
            loss_mask=np.concatenate(live.mask),
            episode={
                "reward": score,
                "reason": reason,
                "turns": live.turns,
                "observation_tokens": live.observation_tokens,
                "failed": failed,
                **info,
                # The group's prompt (rollout.groups.episode_prompt): the ids it opened with.
                **({"prompt_tokens": live.prompt.tokens.tolist()} if live.opened else {}),
            },
            kept_floor=floors if np.isfinite(floors).any() else None,
            routes=routes,
        )

    def _reward(self, live: _Live) -> tuple[float, str]:
        if live.failure or live.episode is None:
            return 0.0, live.failure
        try:
            result = live.episode.reward()
        except Exception as err:  # noqa: BLE001 -- a broken environment costs its episode
            return 0.0, f"environment reward raised {type(err).__name__}: {err}"
        score, reason = (
            (result.score, result.reason) if isinstance(result, RewardResult) else (result, "")
        )
        if not math.isfinite(float(score)):
            return 0.0, f"environment reward not finite: {score}"
        return float(score), reason


def _outside_vocabulary(ids: np.ndarray, tokenizer: Any) -> str | None:
    """Why ``ids`` cannot be sampled from (some are outside the vocabulary), or None; an
    environment's ids that are not the model's would fail every episode sampled with them."""
    vocab = getattr(tokenizer, "vocab_size", None)
    if len(ids) and (ids.min() < 0 or (vocab is not None and ids.max() >= vocab)):
        return f"holds ids outside the vocabulary [0, {vocab}): {ids.min()}..{ids.max()}"
    return None


def _lost(live: _Live, reason: str, tokenizer: Any) -> None:
    """``live`` ends before its first turn with reward 0 and ``reason``."""
    live.fail(reason)
    # A completion holds at least one id: the stop id, off the loss mask.
    live.append(np.asarray([tokenizer.eos_id]), np.zeros(1), False, np.zeros(1))


def _one_opening(group: Sequence[_Live], tokenizer: Any) -> None:
    """A group has one prompt: an episode that opened with ids other than its group's
    first opening's (``Episode.prompt_tokens`` that is not a function of the prompt) ends
    before its first turn with reward 0."""
    opened = [live for live in group if live.opened]
    for live in opened[1:]:
        if not np.array_equal(live.prompt.tokens, opened[0].prompt.tokens):
            live.opened = False
            live.prompt = opened[0].prompt
            _lost(live, "its prompt_tokens differ from its group's first episode's", tokenizer)


@hookimpl
def rlax_register_samplers():
    return {"episodes": EpisodeSampler}
