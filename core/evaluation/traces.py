"""Rollout traces: what the policy wrote, a few groups every few steps, in ``RUN/rollouts.jsonl``
(:attr:`rlax.core.runtime.run_dir.RunDir.rollouts`).

One JSON object per line, one sampled group each::

    {"step": 20, "time": 1760000000.0, "prompt_id": "...", "prompt": "12+7=",
     "answer": "19", "policy_version": 19, "reward_mean": 0.5,
     "completions": [{"text": "19", "reward": 1.0, "reason": "correct", "length": 3,
                      "finish_reason": "stop", "policy_version": 19}, ...]}

``reward`` is the score the step trained on; ``reason`` comes from scoring the
text again with the trainer's reward, in its process (a composite reward's
reason lists its parts), except for a multi-turn episode, whose reward and
reason are its environment's (``Completion.episode``: why a tool call was
stopped, or how the answer scored). ``length`` counts the generated tokens, stop token
included.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Sequence
from typing import Any

from rlax.core.contracts import Reward
from rlax.core.rollout.reward_pool import score_one
from rlax.core.runtime.run_dir import read_json_lines
from rlax.core.types import Completion, Group


def _reason(reward: Reward | None, group: Group, completion: Completion) -> str:
    if completion.episode is not None:
        return str(completion.episode.get("reason", ""))
    text = completion.text
    if reward is None:
        return ""
    try:
        return score_one(reward, group.prompt, text)[1]
    except Exception as err:  # noqa: BLE001 -- a trace shows a failing verifier, never stops
        return f"scoring failed: {type(err).__name__}: {err}"


def sample(groups: Sequence[Group], count: int) -> list[Group]:
    """``count`` groups spread evenly over ``groups`` (all of them if there are fewer)."""
    if len(groups) <= count:
        return list(groups)
    return [groups[i * len(groups) // count] for i in range(count)]


def trace_rows(
    step: int, groups: Sequence[Group], reward: Reward | None, *, max_chars: int = 2000
) -> list[dict[str, Any]]:
    """The rows of ``groups`` (sampled already) for step ``step``."""
    now = time.time()
    rows = []
    for g in groups:
        completions = [
            {
                "text": c.text[:max_chars],
                "reward": float(r),
                "reason": _reason(reward, g, c),
                "length": len(c.tokens),
                "finish_reason": c.finish_reason,
                "policy_version": int(c.policy_version),
            }
            for c, r in zip(g.completions, g.rewards)
        ]
        rows.append(
            {
                "step": step,
                "time": now,
                "prompt_id": g.prompt.id,
                "prompt": g.prompt.text,
                "answer": str(g.prompt.answer)[:max_chars],
                "policy_version": int(g.policy_version),
                "reward_mean": float(g.rewards.mean()),
                "completions": completions,
            }
        )
    return rows


def append(path: pathlib.Path, rows: Sequence[dict[str, Any]]) -> None:
    with path.open("a") as f:
        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def read(path: pathlib.Path) -> list[dict[str, Any]]:
    """The rows of ``path`` (none if it is missing); a torn last line is skipped."""
    return read_json_lines(path)


def keep_until(path: pathlib.Path, step: int) -> None:
    """Drops the rows after ``step`` (a resumed run redoes those steps)."""
    rows = read(path)
    kept = [r for r in rows if r.get("step", 0) <= step]
    if len(kept) != len(rows) or (rows and path.read_text().count("\n") != len(rows)):
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        tmp.replace(path)
