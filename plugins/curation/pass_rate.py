"""Pass-rate curation: offline by sampling the current model, online as a curriculum.

Offline (``curation.pass_rate``): sample ``samples`` completions per prompt
with the policy, score them, and keep the prompts whose pass rate lies in
``[min_rate, max_rate]``. A prompt the model always or never solves gives
every completion the same reward, hence zero group-relative advantage: it
costs sampling and teaches nothing.

Online (``curation.pass_rate_curriculum``): remember, per prompt, whether each
recent group solved it (pass rate >= ``solved_rate``); a prompt solved in each
of its last ``window`` attempts is retired. ``online(groups)`` drops groups of
retired prompts, and ``admit(prompts)`` lets the rollout source skip them
before spending any sampling on them.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, Probability, Range, checked_by, ordered
from rlax.core.types import Group, Prompt
from rlax.plugins.curation.offline import Curated

__all__ = ["PassRateCurriculum", "PassRateFilter"]


@checked_by(ordered("min_rate", "max_rate"))
class PassRateFilter:
    """Keeps prompts whose pass rate under the policy lies in ``[min_rate, max_rate]``.

    Args:
      reward: scores each completion (``score(prompt, text)``).
      policy: a sampler (``generate(prompts, n, *, seed)``); with ``checkpoint``
        it is first set up with that model (``setup(model, tokenizer)``).
      checkpoint: a model directory to sample with ("" : ``policy`` is ready).
      samples: completions per prompt (k).
      min_rate: the lowest pass rate kept.
      max_rate: the highest pass rate kept.
      pass_threshold: a completion passes when its reward is at least this.
      batch_prompts: prompts per ``generate`` call.
      reward_workers: score in a :class:`~rlax.core.rollout.reward_pool.RewardPool` of
        this many processes (0: in this process).
      seed: sampling seed.
    """

    def __init__(
        self,
        *,
        reward: Any,
        policy: Any,
        checkpoint: str = "",
        samples: Annotated[int, AtLeast(1)] = 8,
        min_rate: Annotated[float, Probability] = 0.05,
        max_rate: Annotated[float, Probability] = 0.95,
        pass_threshold: float = 1.0,
        batch_prompts: Annotated[int, AtLeast(1)] = 32,
        reward_workers: Annotated[int, AtLeast(0, means="0: in this process")] = 0,
        seed: int = 0,
    ) -> None:
        if samples < 1:
            raise ValueError(f"curation.pass_rate: samples must be >= 1, got {samples}")
        if not 0 <= min_rate <= max_rate <= 1:
            raise ValueError(
                f"curation.pass_rate: need 0 <= min_rate <= max_rate <= 1, got {min_rate}, "
                f"{max_rate}"
            )
        self.reward, self.policy, self.checkpoint = reward, policy, checkpoint
        self.samples, self.min_rate, self.max_rate = samples, min_rate, max_rate
        self.pass_threshold, self.batch_prompts = pass_threshold, batch_prompts
        self.reward_workers, self.seed = reward_workers, seed
        self.rates: dict[str, float] = {}
        self._tokenizer = None

    def _setup(self) -> None:
        if self.checkpoint and self._tokenizer is None:
            from rlax.core.models.bundle import load_model

            bundle = load_model(self.checkpoint)
            self.policy.setup(bundle.model, bundle.tokenizer)
            self._tokenizer = bundle.tokenizer

    def _encode(self, prompt: Prompt) -> Prompt:
        if self._tokenizer is None:
            return prompt
        tokens = self._tokenizer.encode(prompt.text, bos=True)
        return Prompt(prompt.id, prompt.text, tokens, prompt.answer, prompt.metadata)

    def pass_rates(self, prompts: Sequence[Prompt]) -> np.ndarray:
        """The pass rate of each prompt over ``samples`` completions, float [M]."""
        from rlax.core.rollout.reward_pool import RewardPool

        self._setup()
        pool = RewardPool(self.reward, workers=self.reward_workers)
        rates = []
        try:
            for start in range(0, len(prompts), self.batch_prompts):
                batch = [self._encode(p) for p in prompts[start : start + self.batch_prompts]]
                groups = self.policy.generate(batch, self.samples, seed=self.seed + start)
                pairs = [(p, c.text) for p, cs in zip(batch, groups) for c in cs]
                scores = pool.score([p for p, _ in pairs], [t for _, t in pairs]).scores
                passed = (scores >= self.pass_threshold).reshape(len(batch), self.samples)
                rates.extend(passed.mean(axis=1).tolist())
        finally:
            pool.close()
        return np.asarray(rates, np.float64)

    def offline(self, prompts: Sequence[Prompt]) -> Curated:
        rates = self.pass_rates(prompts)
        reasons: list[str | None] = []
        for prompt, rate in zip(prompts, rates):
            self.rates[prompt.id] = float(rate)
            shown = f"pass rate {round(rate * self.samples)}/{self.samples}"
            if rate < self.min_rate:
                reasons.append(f"{shown} below {self.min_rate:g} (never solved)")
            elif rate > self.max_rate:
                reasons.append(f"{shown} above {self.max_rate:g} (always solved)")
            else:
                reasons.append(None)
        return Curated.split(prompts, reasons)


class PassRateCurriculum:
    """Retires prompts solved in each of their last ``window`` attempts.

    Args:
      window: consecutive solved attempts that retire a prompt.
      solved_rate: a group solves its prompt when this share of its
        completions pass.
      pass_threshold: a completion passes when its reward is at least this.
    """

    def __init__(
        self,
        *,
        window: Annotated[int, AtLeast(1)] = 3,
        solved_rate: Annotated[float, Range(gt=0, le=1)] = 1.0,
        pass_threshold: float = 1.0,
    ) -> None:
        if window < 1:
            raise ValueError(f"curation.pass_rate_curriculum: window must be >= 1, got {window}")
        if not 0 < solved_rate <= 1:
            raise ValueError(
                f"curation.pass_rate_curriculum: solved_rate must be in (0, 1], got {solved_rate}"
            )
        self.window, self.solved_rate, self.pass_threshold = window, solved_rate, pass_threshold
        self._history: dict[str, collections.deque[bool]] = {}
        self._retired: set[str] = set()

    @property
    def retired(self) -> frozenset[str]:
        """Ids of the prompts retired so far."""
        return frozenset(self._retired)

    def admit(self, prompts: Sequence[Prompt]) -> list[Prompt]:
        """The prompts that are not retired (call before sampling them)."""
        return [p for p in prompts if p.id not in self._retired]

    def online(self, groups: Sequence[Group]) -> list[Group]:
        """Records each group's attempt; drops groups of prompts retired before it."""
        return [g for g in groups if self.observe(g.prompt.id, g.rewards)]

    def observe(self, prompt_id: str, rewards: np.ndarray) -> bool:
        """Records one attempt at ``prompt_id``; False if the prompt was already retired.

        The parameter server calls this for every submitted group (its rewards
        travel even when a filter dropped the group), so one curriculum sees
        every worker's attempts.
        """
        if prompt_id in self._retired:
            return False
        rate = float(np.mean(np.asarray(rewards) >= self.pass_threshold))
        history = self._history.setdefault(prompt_id, collections.deque(maxlen=self.window))
        history.append(rate >= self.solved_rate)
        if len(history) == self.window and all(history):
            self._retired.add(prompt_id)
            del self._history[prompt_id]
        return True

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep to resume the curriculum exactly."""
        return {
            "history": {k: list(v) for k, v in self._history.items()},
            "retired": sorted(self._retired),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._history = {
            k: collections.deque(v, maxlen=self.window) for k, v in state["history"].items()
        }
        self._retired = set(state["retired"])


@hookimpl
def rlax_register_curation_filters():
    return {"pass_rate": PassRateFilter, "pass_rate_curriculum": PassRateCurriculum}
