"""core.types values <-> protocol messages, with validation of what arrives."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.rollout.probe import Probe
from rlax.core.types import PARTIAL, Completion, Group, PartialGroup, Prompt


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


def completion_to_msg(c: Completion) -> pb.CompletionMsg:
    msg = pb.CompletionMsg(
        tokens=np.asarray(c.tokens, "<i4").tobytes(),
        logprobs=np.asarray(c.logprobs, "<f4").tobytes(),
        text=c.text,
        finish_reason=c.finish_reason,
        policy_version=c.policy_version,
    )
    if c.versions is not None:
        msg.versions = np.asarray(c.versions, "<i4").tobytes()
    if c.loss_mask is not None:
        msg.loss_mask = np.asarray(c.loss_mask, np.int8).tobytes()
    if c.episode is not None:
        msg.episode_json = json.dumps(c.episode)
    if c.kept_floor is not None:
        msg.kept_floor = np.asarray(c.kept_floor, "<f4").tobytes()
    if c.sampled_logprobs is not None:
        msg.sampled_logprobs = np.asarray(c.sampled_logprobs, "<f4").tobytes()
    if c.routes is not None:  # routing replay's record (rlax.core.models.routing_replay)
        msg.routes = np.asarray(c.routes, "<i2").tobytes()
        msg.routes_shape.extend(int(d) for d in np.shape(c.routes)[1:])
    return msg


def msg_to_completion(c: pb.CompletionMsg) -> Completion:
    return Completion(
        tokens=_ints(c.tokens, "completion tokens"),
        logprobs=np.frombuffer(c.logprobs, "<f4").astype(np.float32),
        text=c.text,
        finish_reason=c.finish_reason,
        policy_version=int(c.policy_version),
        versions=_ints(c.versions, "completion versions") if c.versions else None,
        loss_mask=np.frombuffer(c.loss_mask, np.int8).copy() if c.loss_mask else None,
        episode=_episode(c.episode_json),
        kept_floor=np.frombuffer(c.kept_floor, "<f4").astype(np.float32) if c.kept_floor else None,
        routes=_routes(c),
        sampled_logprobs=(
            np.frombuffer(c.sampled_logprobs, "<f4").astype(np.float32)
            if c.sampled_logprobs
            else None
        ),
    )


def _routes(c: pb.CompletionMsg) -> np.ndarray | None:
    if not c.routes:
        return None
    return np.frombuffer(c.routes, "<i2").astype(np.int16).reshape(-1, *c.routes_shape)


def _episode(text: str) -> dict | None:
    if not text:
        return None
    try:
        episode = json.loads(text)
    except json.JSONDecodeError as err:
        raise WireError(f"completion episode: bad JSON: {err}") from None
    if not isinstance(episode, dict):
        raise WireError(f"completion episode: a JSON object expected, got {text[:40]!r}")
    return episode


def group_to_msg(g: Group, lease_id: str, filtered: bool = False) -> pb.GroupMsg:
    msg = pb.GroupMsg(prompt=prompt_to_msg(g.prompt), lease_id=lease_id, filtered=filtered)
    msg.rewards.extend(float(r) for r in g.rewards)
    if filtered:  # a dropped group still reports its rewards (for the run's reward curve)
        return msg
    msg.completions.extend(completion_to_msg(c) for c in g.completions)
    return msg


def partial_to_msg(p: PartialGroup, lease_id: str, prompt_id: str) -> pb.SubmitPartialRequest:
    msg = pb.SubmitPartialRequest(lease_id=lease_id, prompt_id=prompt_id)
    msg.rows.extend(completion_to_msg(c) for c in p.rows)
    return msg


def msgs_to_partial(rows: Sequence[pb.CompletionMsg]) -> PartialGroup | None:
    """The partial work a Lease carries (None when it carries none)."""
    return PartialGroup(tuple(msg_to_completion(c) for c in rows)) if rows else None


def version_range(c: pb.CompletionMsg) -> tuple[int, int]:
    """(oldest, newest) weight version among a completion's tokens."""
    if not c.versions or len(c.versions) % 4:
        return int(c.policy_version), int(c.policy_version)
    versions = np.frombuffer(c.versions, "<i4")
    return int(versions.min()), int(versions.max())


def check_completion(
    c: pb.CompletionMsg, where: str, *, max_tokens: int, newest_version: int, partial: bool = False
) -> None:
    """Raises WireError unless ``c`` is well formed.

    ``partial``: ``c`` is an unfinished row of partial work (finish reason
    "partial", possibly no token yet); otherwise it must not claim to be one.
    """
    n_tok, n_lp, n_ver = len(c.tokens), len(c.logprobs), len(c.versions)
    low = 0 if partial else 1
    if n_tok % 4 or n_lp != n_tok or not low <= n_tok // 4 <= max_tokens:
        raise WireError(f"{where} has {n_tok} token bytes and {n_lp} logprob bytes")
    if (c.finish_reason == PARTIAL) != partial:
        raise WireError(f"{where}: finish reason {c.finish_reason!r} here")
    if not 0 <= c.policy_version <= newest_version:
        raise WireError(
            f"{where} claims policy version {c.policy_version}, newest is {newest_version}"
        )
    if n_ver:
        if n_ver != n_tok:
            raise WireError(f"{where} has {n_ver // 4} versions for {n_tok // 4} tokens")
        oldest, newest = version_range(c)
        if newest > newest_version or oldest != c.policy_version:
            raise WireError(
                f"{where}: token versions {oldest}..{newest} with policy version "
                f"{c.policy_version} (must be the oldest), newest is {newest_version}"
            )
    if c.loss_mask and (len(c.loss_mask) != n_tok // 4 or not set(c.loss_mask) <= {0, 1}):
        raise WireError(f"{where}: a loss mask of {len(c.loss_mask)} bytes, not 0/1 per token")
    if not np.all(np.isfinite(np.frombuffer(c.logprobs, "<f4"))):
        raise WireError(f"{where} has non-finite logprobs")
    if c.kept_floor:  # logprobs of kept sets: <= 0, -inf where nothing was cut
        floors = np.frombuffer(c.kept_floor, "<f4") if len(c.kept_floor) == n_tok else None
        if floors is None or np.any(np.isnan(floors)) or np.any(floors > 0):
            raise WireError(
                f"{where}: kept_floor of {len(c.kept_floor)} bytes, not a logprob <= 0 or -inf per token"
            )
    if c.routes or c.routes_shape:
        check_routes(c, where, n_tok // 4)
    if c.sampled_logprobs and (
        len(c.sampled_logprobs) != n_tok
        or not np.all(np.isfinite(np.frombuffer(c.sampled_logprobs, "<f4")))
    ):
        raise WireError(
            f"{where}: sampled_logprobs of {len(c.sampled_logprobs)} bytes, "
            "not one finite float32 per token"
        )


#: At most this many expert ids per token (R sparse layers x k experts) on the wire.
MAX_ROUTES_PER_TOKEN = 1 << 14


def check_routes(c: pb.CompletionMsg, where: str, tokens: int, row: int | None = None) -> None:
    """WireError unless ``c.routes`` is int16 [rows, R, k] of expert ids >= -1 with rows >=
    ``tokens`` (the prompt's come first), or exactly ``row`` rows when given."""
    shape = tuple(c.routes_shape)
    width = int(np.prod(shape)) if len(shape) == 2 and min(shape) > 0 else 0
    if not 0 < width <= MAX_ROUTES_PER_TOKEN or len(c.routes) % (2 * width):
        raise WireError(f"{where}: routes of {len(c.routes)} bytes with shape {list(shape)}")
    rows = len(c.routes) // (2 * width)
    if rows < tokens or (row is not None and rows != row):
        raise WireError(
            f"{where}: routes for {rows} tokens, the row has {tokens if row is None else row}"
        )
    if np.any(np.frombuffer(c.routes, "<i2") < -1):
        raise WireError(f"{where}: an expert id below -1 in routes")


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
        check_completion(
            c, f"{where}: completion {i}", max_tokens=max_tokens, newest_version=newest_version
        )
        if c.routes:  # the prompt's tokens then the completion's
            row = len(m.prompt.tokens) // 4 + len(c.tokens) // 4
            check_routes(c, f"{where}: completion {i}", len(c.tokens) // 4, row)


def check_partial(
    m: pb.SubmitPartialRequest,
    *,
    rows: int | None,
    max_completions: int,
    max_tokens: int,
    newest_version: int,
) -> None:
    """Raises WireError unless ``m`` is well-formed partial work (``rows``: the row count of
    the partial work it continues, None if none)."""
    where = f"partial work for prompt {m.prompt_id!r}"
    if not 0 < len(m.rows) <= max_completions:
        raise WireError(f"{where}: {len(m.rows)} rows (allowed 1..{max_completions})")
    if rows is not None and len(m.rows) != rows:
        raise WireError(f"{where}: {len(m.rows)} rows, the group it continues has {rows}")
    if all(c.finish_reason != PARTIAL for c in m.rows):
        raise WireError(f"{where}: every row finished (submit it as a group)")
    for i, c in enumerate(m.rows):
        check_completion(
            c,
            f"{where}: row {i}",
            max_tokens=max_tokens,
            newest_version=newest_version,
            partial=c.finish_reason == PARTIAL,
        )


def msg_to_group(m: pb.GroupMsg) -> Group:
    completions = tuple(msg_to_completion(c) for c in m.completions)
    return Group(msg_to_prompt(m.prompt), completions, np.asarray(m.rewards, np.float32))


class TensorList(list[dict]):
    """A pulled version's tensors, and the probe published with it (None: none was)."""

    probe: Probe | None = None


def tensor_list(header: pb.PartHeader) -> TensorList:
    """A pulled version's tensors as dicts: name, shape, offset, nbytes, dtype; the
    version's probe (:mod:`rlax.core.rollout.probe`) as ``.probe``."""
    out = TensorList(
        {
            "name": t.name,
            "shape": list(t.shape),
            "offset": t.offset,
            "nbytes": t.nbytes,
            "dtype": t.dtype,
        }
        for t in header.tensors
    )
    out.probe = probe_of(header)
    return out


def probe_of(header: pb.PartHeader) -> Probe | None:
    """The probe a header carries (None: it carries none)."""
    if not header.probe_tokens:
        return None
    return Probe(tuple(header.probe_tokens), tuple(header.probe_logprobs))


def set_probe(header: pb.PartHeader, probe: Probe | None) -> pb.PartHeader:
    """Writes ``probe`` into ``header`` (None: leaves it without one); returns ``header``."""
    if probe is not None:
        header.probe_tokens[:] = probe.tokens
        header.probe_logprobs[:] = probe.logprobs
    return header


def copy_probe(source: pb.PartHeader, target: pb.PartHeader) -> None:
    """``source``'s probe into ``target`` (a header built from it: split, assembled)."""
    set_probe(target, probe_of(source))
