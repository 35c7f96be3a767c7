"""core.types values <-> protocol messages, with validation of what arrives."""

from __future__ import annotations

import json

import numpy as np

from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.types import Completion, Group, Prompt


class WireError(ValueError):
    """A message that must not touch state; the text says what is wrong."""


def prompt_to_msg(p: Prompt) -> pb.PromptMsg:
    return pb.PromptMsg(
        id=p.id,
        text=p.text,
        tokens=np.asarray(p.tokens, "<i4").tobytes(),
        answer_json=json.dumps(p.answer),
        metadata_json=json.dumps(p.metadata),
    )


def _ints(data: bytes, what: str) -> np.ndarray:
    if len(data) % 4:
        raise WireError(f"{what}: {len(data)} bytes is not a whole number of int32")
    return np.frombuffer(data, "<i4").astype(np.int32)


def msg_to_prompt(m: pb.PromptMsg) -> Prompt:
    try:
        answer, metadata = json.loads(m.answer_json), json.loads(m.metadata_json or "{}")
    except json.JSONDecodeError as err:
        raise WireError(f"prompt {m.id!r}: bad JSON: {err}") from None
    return Prompt(m.id, m.text, _ints(m.tokens, f"prompt {m.id!r} tokens"), answer, metadata)


def group_to_msg(g: Group, lease_id: str, filtered: bool = False) -> pb.GroupMsg:
    msg = pb.GroupMsg(prompt=prompt_to_msg(g.prompt), lease_id=lease_id, filtered=filtered)
    msg.rewards.extend(float(r) for r in g.rewards)
    if filtered:  # a dropped group still reports its rewards (for the run's reward curve)
        return msg
    for c in g.completions:
        msg.completions.append(
            pb.CompletionMsg(
                tokens=np.asarray(c.tokens, "<i4").tobytes(),
                logprobs=np.asarray(c.logprobs, "<f4").tobytes(),
                text=c.text,
                finish_reason=c.finish_reason,
                policy_version=c.policy_version,
            )
        )
    return msg


def check_group(
    m: pb.GroupMsg, *, max_completions: int, max_tokens: int, newest_version: int
) -> None:
    """Raises WireError unless ``m`` is a well-formed group."""
    where = f"group for prompt {m.prompt.id!r}"
    if m.filtered:
        if m.completions or len(m.rewards) > max_completions:
            raise WireError(f"{where}: a filtered group carries its rewards only")
        if not np.all(np.isfinite(np.asarray(m.rewards, np.float64))):
            raise WireError(f"{where}: non-finite reward")
        return
    if not 0 < len(m.completions) <= max_completions:
        raise WireError(f"{where}: {len(m.completions)} completions (allowed 1..{max_completions})")
    if len(m.rewards) != len(m.completions):
        raise WireError(f"{where}: {len(m.rewards)} rewards for {len(m.completions)} completions")
    if not np.all(np.isfinite(np.asarray(m.rewards, np.float64))):
        raise WireError(f"{where}: non-finite reward")
    for i, c in enumerate(m.completions):
        n_tok, n_lp = len(c.tokens), len(c.logprobs)
        if n_tok % 4 or n_lp != n_tok or not 0 < n_tok // 4 <= max_tokens:
            raise WireError(
                f"{where}: completion {i} has {n_tok} token bytes and {n_lp} logprob bytes"
            )
        if not 0 <= c.policy_version <= newest_version:
            raise WireError(
                f"{where}: completion {i} claims policy version {c.policy_version}, "
                f"newest is {newest_version}"
            )
        if not np.all(np.isfinite(np.frombuffer(c.logprobs, "<f4"))):
            raise WireError(f"{where}: completion {i} has non-finite logprobs")


def msg_to_group(m: pb.GroupMsg) -> Group:
    completions = tuple(
        Completion(
            tokens=_ints(c.tokens, "completion tokens"),
            logprobs=np.frombuffer(c.logprobs, "<f4").astype(np.float32),
            text=c.text,
            finish_reason=c.finish_reason,
            policy_version=int(c.policy_version),
        )
        for c in m.completions
    )
    return Group(msg_to_prompt(m.prompt), completions, np.asarray(m.rewards, np.float32))
