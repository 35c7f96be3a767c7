"""Prompts -> scored groups: what a worker does between two weight loads.

With a :class:`~rlax.core.contracts.Resumable` sampler
(:func:`rollout_resumable`) a prompt may instead come back as the partial
work it stood at when a preemption notice cut generation off.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any

import numpy as np

from rlax.core.contracts import (
    Encoder,
    OfflineFilter,
    OnlineFilter,
    Resumable,
    Reward,
    Sampler,
    Task,
)
from rlax.core.errors import ConfigError
from rlax.core.rollout.reward_pool import RewardPool, score_one
from rlax.core.types import Completion, Group, PartialGroup, Prompt


def task_prompts(
    task: Task, split: str, *, tokenizer: Encoder, seed: int, setting: str
) -> Iterator[Prompt]:
    """``task.prompts(split)``, read far enough that its data errors come now, not mid-run.

    The ``"eval"`` split is read whole (a list; none at all is an error); the
    endless ``"train"`` stream up to its first prompt. A task raises ValueError
    (OSError for a missing file) for data it cannot use, e.g. a malformed row
    under ``on_malformed='error'``: that is a ConfigError naming ``setting``.
    """
    try:
        prompts = task.prompts(split, tokenizer=tokenizer, seed=seed)
        if split == "eval":
            held_out = list(prompts)
            if not held_out:
                raise ValueError("no prompts (were all of its rows malformed?)")
            return iter(held_out)
        return itertools.chain([next(prompts)], prompts)
    except StopIteration:
        raise ConfigError(f"{setting}: {split} split: no prompts") from None
    except (ValueError, OSError) as err:
        raise ConfigError(f"{setting}: {split} split: {str(err).splitlines()[0]}") from err


def rollout(
    prompts: Sequence[Prompt],
    sampler: Sampler,
    reward: Reward | RewardPool,
    group_size: int,
    seed: int,
    counts: MutableMapping[str, float] | None = None,
) -> list[Group]:
    """Samples ``group_size`` completions per prompt and scores each one.

    With a :class:`RewardPool` the verifier runs in worker processes under a
    timeout: a failed call scores 0 and is added to ``counts``
    (``reward_errors``, ``reward_timeouts``) instead of stopping the run.
    """
    start = time.perf_counter()
    completions = sampler.generate(prompts, group_size, seed=seed)
    if counts is not None:
        counts["generate_s"] += time.perf_counter() - start
    return score_groups(prompts, completions, reward, group_size, counts)


def rollout_resumable(
    prompts: Sequence[Prompt],
    sampler: Resumable,
    reward: Reward | RewardPool,
    group_size: int,
    seed: int,
    counts: MutableMapping[str, float] | None = None,
    *,
    partials: Sequence[PartialGroup | None] | None = None,
    interrupt: Callable[[], bool] | None = None,
    refresh: Callable[[], tuple[Any, int] | None] | None = None,
) -> list[Group | PartialGroup]:
    """:func:`rollout` through ``generate_groups``: continues ``partials``, stops when
    ``interrupt()`` says so, loads what ``refresh()`` returns between decode steps.

    Each entry is a scored :class:`Group` for a prompt whose samples all
    finished, or the :class:`PartialGroup` it stood at when cut off (not
    scored: it goes back to the queue as partial work).
    """
    start = time.perf_counter()
    results = sampler.generate_groups(
        prompts, group_size, seed=seed, partials=partials, interrupt=interrupt, refresh=refresh
    )
    if counts is not None:
        counts["generate_s"] += time.perf_counter() - start
    if len(results) != len(prompts):
        raise ValueError(
            f"{type(sampler).__name__}.generate_groups: {len(results)} results for "
            f"{len(prompts)} prompts"
        )
    finished = [(p, r) for p, r in zip(prompts, results) if not isinstance(r, PartialGroup)]
    scored = iter(
        score_groups([p for p, _ in finished], [r for _, r in finished], reward, group_size, counts)
    )
    return [r if isinstance(r, PartialGroup) else next(scored) for r in results]


def score_groups(
    prompts: Sequence[Prompt],
    completions: Sequence[tuple[Completion, ...]],
    reward: Reward | RewardPool,
    group_size: int,
    counts: MutableMapping[str, float] | None = None,
) -> list[Group]:
    """Scores each prompt's completions (by their text) into groups; the seconds it took
    go to ``counts["score_s"]``.

    A multi-turn episode (``Completion.episode``) brings its environment's
    reward: the reward plugin is not called for it.
    """
    if not prompts:
        return []
    start = time.perf_counter()
    scores: np.ndarray | list[list[float]]  # [M, G]
    if all(c.episode is not None for cs in completions for c in cs):
        scores = [[float(c.episode["reward"]) for c in cs] for cs in completions]  # type: ignore[index]
        if counts is not None:
            for key, value in episode_counts(completions).items():
                counts[key] += value
    elif isinstance(reward, RewardPool):
        flat = [(p, c.text) for p, cs in zip(prompts, completions) for c in cs]
        result = reward.score([p for p, _ in flat], [t for _, t in flat])
        scores = result.scores.reshape(len(prompts), group_size)
        if counts is not None:
            counts["reward_errors"] += result.errors
            counts["reward_timeouts"] += result.timeouts
    else:
        scores = [
            [score_one(reward, p, c.text)[0] for c in cs] for p, cs in zip(prompts, completions)
        ]
    if counts is not None:
        counts["score_s"] += time.perf_counter() - start
    return [
        Group(episode_prompt(p, cs), cs, np.asarray(s, np.float32))
        for p, cs, s in zip(prompts, completions, scores)
    ]


def episode_prompt(prompt: Prompt, completions: Sequence[Completion]) -> Prompt:
    """The prompt the completions continue: ``prompt``, or the ids an agent's episodes
    started from when they are not its own (``episode["prompt_tokens"]``, one list for the
    group: ``plugins/agents/runner.py``), so the trainer scores exactly the sampled context."""
    for c in completions:
        ids = (c.episode or {}).get("prompt_tokens")
        if ids is not None:
            return dataclasses.replace(prompt, tokens=np.asarray(ids, np.int32))
    return prompt


def check_online_filters(filters: Sequence[object], setting: str) -> None:
    """ConfigError unless every filter can run on groups (has ``online``), before any work.

    An offline filter (``offline(prompts)``: dedup, decontaminate, ...) belongs
    to ``rlax curate``, which runs before training; given to a role's
    ``curation`` it would fail at the first batch.
    """
    for i, f in enumerate(filters):
        if not isinstance(f, OnlineFilter):
            offline = (
                " (an offline filter: run it with `rlax curate`)"
                if isinstance(f, OfflineFilter)
                else ""
            )
            raise ConfigError(
                f"{setting}[{i}]: {type(f).__name__} has no online(groups){offline}; "
                "curation here takes online filters"
            )


def kept_by_filters(groups: Sequence[Group], filters: Sequence[OnlineFilter]) -> list[bool]:
    """Runs the online curation filters in order; True for each group they all kept."""
    kept = list(groups)
    for f in filters:
        kept = f.online(kept)
    ids = {id(g) for g in kept}
    return [id(g) in ids for g in groups]


def generated_tokens(groups: Sequence[Group]) -> int:
    return sum(len(c.tokens) for g in groups for c in g.completions)


EPISODE_COUNTS = ("turns", "tool_calls", "tool_errors", "observation_tokens", "failed")


def episode_counts(completions: Sequence[Sequence[Completion]]) -> dict[str, float]:
    """Totals of what multi-turn episodes reported: ``episodes`` and each of
    :data:`EPISODE_COUNTS` (empty when no completion is an episode)."""
    episodes = [c.episode for cs in completions for c in cs if c.episode is not None]
    if not episodes:
        return {}
    totals = {key: float(sum(e.get(key, 0) for e in episodes)) for key in EPISODE_COUNTS}
    return {"episodes": float(len(episodes)), **totals}


def episode_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """A batch's per-episode means: ``turns_mean``, ``tool_calls_mean``, ``tool_errors_mean``,
    ``observation_tokens_mean``, ``failed_mean`` (empty without multi-turn episodes)."""
    totals = episode_counts([g.completions for g in groups])
    if not totals:
        return {}
    n = totals.pop("episodes")
    return {f"{key}_mean": value / n for key, value in totals.items()}
