"""The values that flow through an experiment: task -> sampler -> reward -> algorithm.

Plain dataclasses holding numpy arrays: nothing here knows about JAX, gin or
the wire, so every stage (task, sampler, reward, curation, algorithm) can be
tested with hand-made values.

Shape legend, the one used across rlax (every shape comment and docstring
uses these letters):

  batches:  M groups (prompts) of a batch, G group size (completions per
            prompt), B rows (one completion each), P prompt length,
            C completion length, T = P + C tokens of a row, L = T - 1 target
            positions (loss mask, logprobs, advantages: position t predicts
            token t + 1).
  models:   V vocabulary, D embed dim, F MLP hidden dim, N query heads,
            K key/value heads, H head dim, S cache length (key slots); in
            attention T is the query length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any

import ml_dtypes
import numpy as np

from rlax.core.constraints import AtLeast

PATH_MARK = "rlax:path"
#: A string parameter that names a file, a directory or a model reference. A
#: relative path written in a gin file is read relative to that file's folder
#: (``rlax.core.config.bindings.resolve_paths``); ``pypi:...`` and other
#: ``scheme:`` references are left as they are.
ConfigPath = Annotated[str, PATH_MARK]

# The batch and staleness settings of a run (rlax.core.spec.RunSpec), declared once.
PromptsPerStep = Annotated[int, AtLeast(1)]
GroupSize = Annotated[int, AtLeast(1)]
#: How many weight versions behind a group may be (0: the newest only).
Staleness = Annotated[int, AtLeast(0, means="0: the newest weights only")]
#: The floating dtypes a setting names (the trainer's compute dtype, a LoRA base's, the
#: wire's), as numpy dtypes: JAX takes them as they are, and a process that only reads
#: settings (the supervisor, the parameter server) needs no JAX for them.
FLOAT_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One problem to solve.

    Attributes:
      id: stable identifier (the same problem always has the same id).
      text: the prompt as text.
      tokens: token ids of the prompt, int32 [P].
      answer: the task's ground truth, handed to reward plugins.
      metadata: free-form task data (split, difficulty, ...).
    """

    id: str
    text: str
    tokens: np.ndarray
    answer: Any
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled continuation of a prompt.

    Attributes:
      tokens: generated token ids, int32 [C'] (C' <= max new tokens, stop token
        included when one was produced).
      logprobs: the sampler's log-probability of each generated token, float32 [C'].
      text: the decoded text, stop token excluded.
      finish_reason: "stop" (a stop token) or "length" (ran out of tokens);
        inside a :class:`PartialGroup`, "partial" for a row cut off mid-way.
      policy_version: the weight version that produced it; with weights
        loaded between decode steps, the *oldest* version among its tokens,
        which is the one the trainer's staleness rule judges it by.
      versions: the weight version of each token, int32 [C'], when they may
        differ (in-flight weight updates); None means every token is
        ``policy_version``'s.
      loss_mask: which tokens the model produced, int8 [C']: 1 for a model
        token, 0 for an environment's observation in a multi-turn episode
        (:mod:`rlax.core.episodes`; its logprob is 0 and nothing trains on
        it). None means every token is the model's.
      episode: what a multi-turn episode's environment reported, JSON values:
        ``reward`` (the group's reward for it, used instead of the reward
        plugin), ``reason``, ``turns``, ``tool_calls``, ``tool_errors``,
        ``observation_tokens``. None for a single-turn completion.
      routes: a mixture-of-experts sampler's routing of the row, int16
        [P' + C', R, k]: the experts each token of the prompt (P' tokens) and of
        the completion went to in each of the R sparse layers, -1 where none
        (the last token is never fed back). The trainer may route by it
        (:mod:`rlax.core.models.routing_replay`). None: not recorded.
      kept_floor: with ``logprobs`` under the sampler's truncated distribution
        (top-k / top-p), the kept set of each position, float32 [C']: the full
        tempered distribution's logprob of the least likely token that could
        be drawn (-inf: nothing cut). The trainer truncates its own
        distribution the same way (:mod:`rlax.plugins.samplers.sampling`).
        None: ``logprobs`` are under the full distribution.
      sampled_logprobs: when ``logprobs`` are not under the distribution each
        token was drawn from (a sampler set to record the full distribution
        while top-k / top-p cut), the logprobs under the one it was, float32
        [C']: the behaviour policy the trainer's mismatch metrics compare
        with. None: ``logprobs`` are.
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    text: str
    finish_reason: str
    policy_version: int
    versions: np.ndarray | None = None
    loss_mask: np.ndarray | None = None
    episode: dict[str, Any] | None = None
    kept_floor: np.ndarray | None = None
    routes: np.ndarray | None = None
    sampled_logprobs: np.ndarray | None = None

    @property
    def model_mask(self) -> np.ndarray:
        """float32 [C']: 1 on the model's tokens, 0 on observations."""
        if self.loss_mask is None:
            return np.ones(len(self.tokens), np.float32)
        return np.asarray(self.loss_mask, np.float32)

    @property
    def newest_version(self) -> int:
        """The newest weight version among its tokens."""
        if self.versions is None or not len(self.versions):
            return self.policy_version
        return int(np.max(self.versions))


@dataclasses.dataclass(frozen=True)
class Group:
    """A prompt, its completions and their rewards.

    Group-relative algorithms (GRPO and relatives) normalise within a group.
    """

    prompt: Prompt
    completions: tuple[Completion, ...]
    rewards: np.ndarray  # float32 [G]

    def __post_init__(self) -> None:
        if len(self.completions) != len(self.rewards):
            raise ValueError(
                f"group {self.prompt.id!r}: {len(self.completions)} completions "
                f"but {len(self.rewards)} rewards"
            )

    @property
    def policy_version(self) -> int:
        """The oldest weight version among the completions."""
        return min(c.policy_version for c in self.completions)

    def dropped(self) -> DroppedGroup:
        """What the trainer keeps of this group once online curation dropped it."""
        return DroppedGroup(self.rewards)


@dataclasses.dataclass(frozen=True)
class DroppedGroup:
    """A group an online curation filter dropped, as the trainer still sees it: its rewards.

    The batch's reward and pass-rate metrics count every sample, dropped or
    not; nothing trains on it. A rollout source hands these in among the
    kept :class:`Group` s (``RolloutSource.next_batch``).
    """

    rewards: np.ndarray  # float32 [G]


#: ``finish_reason`` of a row that was cut off before it finished (a preemption).
PARTIAL = "partial"


@dataclasses.dataclass(frozen=True)
class PartialGroup:
    """A group's samples as they stood when generation was cut off (a preemption notice).

    A worker hands it in on its lease; whoever leases the prompt next
    continues each unfinished row from its tokens (prefill prompt + prefix,
    keep decoding) instead of starting over. ``rows`` has one
    :class:`Completion` per sample of the group, in order: a finished row
    keeps its ``finish_reason``; an unfinished one has ``finish_reason ==
    PARTIAL`` and the tokens, logprobs and versions generated so far (none
    for a row never started).
    """

    rows: tuple[Completion, ...]

    @property
    def unfinished(self) -> int:
        return sum(r.finish_reason == PARTIAL for r in self.rows)

    @property
    def tokens(self) -> int:
        """Tokens generated so far, over every row."""
        return sum(len(r.tokens) for r in self.rows)


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """Padded arrays ready for the jitted train step.

    Row r is one completion; its prompt is left-padded to P and its completion
    right-padded to C, so ``tokens[r, P:]`` are the generated tokens.

    Attributes:
      tokens: int32 [B, T] prompt then completion token ids (0 where padded).
      attention_mask: bool [B, T], True on real tokens.
      loss_mask: float32 [B, L], 1 where position t predicts a generated token
        (the target is ``tokens[:, t+1]``).
      old_logprobs: float32 [B, L], the sampler's log-probability of
        ``tokens[:, t+1]`` (0 off the loss mask).
      advantages: float32 [B, L] per-token advantages (0 off the loss mask).
      group_ids: int32 [B], which group each row belongs to.
      ref_logprobs: optional float32 [B, L] of a frozen reference policy.
      routes: optional int16 [B, T, R, k], each token's recorded experts
        (:attr:`Completion.routes`; -1: none), for routing replay.
      kept_floor: optional float32 [B, L], the sampler's kept set of each
        target position (:attr:`Completion.kept_floor`; -inf: the full
        distribution): the trainer's logprobs are then under the same
        truncation as ``old_logprobs``.
      sampled_logprobs: optional float32 [B, L], the logprobs under the
        distribution each token was drawn from where ``old_logprobs`` are not
        (:attr:`Completion.sampled_logprobs`; elsewhere ``old_logprobs``):
        what the trainer's mismatch metrics compare with.
      policy_lag: optional int32 [B, L], how many weight versions before the
        one being trained each target was sampled with (0 off the loss mask;
        :mod:`rlax.core.trainer.mismatch`). None: every target is the current
        version's.
    """

    tokens: np.ndarray
    attention_mask: np.ndarray
    loss_mask: np.ndarray
    old_logprobs: np.ndarray
    advantages: np.ndarray
    group_ids: np.ndarray
    ref_logprobs: np.ndarray | None = None
    kept_floor: np.ndarray | None = None
    routes: np.ndarray | None = None
    sampled_logprobs: np.ndarray | None = None
    policy_lag: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class RewardResult:
    """A reward plugin's verdict: the score and why (shown in logs and reports)."""

    score: float
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class Dropped:
    """A prompt an offline curation filter removed, and why (shown in ``rlax curate``'s report)."""

    prompt: Prompt
    reason: str


@dataclasses.dataclass(frozen=True)
class Curated:
    """The outcome of one offline curation filter over a dataset.

    Attributes:
      kept: the prompts it keeps, in their original order.
      dropped: the others, each with its reason.
    """

    kept: list[Prompt]
    dropped: list[Dropped]

    @classmethod
    def split(cls, prompts: Sequence[Prompt], reasons: Sequence[str | None]) -> Curated:
        """Keeps ``prompts[i]`` where ``reasons[i]`` is None; drops it with the reason otherwise."""
        kept = [p for p, r in zip(prompts, reasons) if r is None]
        dropped = [Dropped(p, r) for p, r in zip(prompts, reasons) if r is not None]
        return cls(kept, dropped)
