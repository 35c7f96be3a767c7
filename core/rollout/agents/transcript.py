"""Token-exact recording of one agent episode: the ids each request sent, the ids sampled.

An agent that talks to the OpenAI-compatible endpoint
(:mod:`rlax.core.rollout.agents.endpoint`) sends its whole conversation with
every request. The endpoint renders it to prompt ids
(:func:`rlax.core.rollout.agents.chat_ids.conversation_ids`, which puts the sampled
ids back in place of the replies it gave, so nothing sampled is encoded
again) and hands them to :meth:`Transcript.request`:

- when they extend the ids recorded so far (the usual case: the last reply,
  then the agent's new messages), only the new ids are appended, as prompt
  ids (loss mask 0, logprob 0);
- when they do not (the agent rewrote, cut or reordered its history), a new
  segment starts with these ids as its prompt; the mismatch is counted
  (:attr:`Transcript.rewrites`) and logged.

:meth:`Transcript.reply` then appends the sampler's ids with its logprobs
and weight versions (loss mask 1). :meth:`Transcript.completions` gives each
segment as ONE :class:`~rlax.core.types.Completion`, the structure
environments produce (:mod:`rlax.plugins.environments.runner`): every id
after the segment's prompt, ``loss_mask`` 1 on the sampled ids and 0 on the
rest, ``logprobs`` the sampler's (0 off the mask), ``versions`` per token,
``kept_floor`` the sampler's kept sets when it recorded truncated logprobs
(-inf off the mask: :mod:`rlax.plugins.samplers.sampling`).
So the trainer sees exactly the ids and logprobs the sampler produced.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from rlax.core.types import Completion

__all__ = ["Segment", "Transcript"]

log = logging.getLogger("rlax.agents")


@dataclasses.dataclass
class Segment:
    """One unbroken token sequence of an episode: a prompt, then everything appended.

    Attributes:
      prompt: int32 [P], the ids of the request that opened the segment.
      tokens / logprobs / mask / versions: the parts appended after the prompt,
        in order (sampled parts: mask 1; prompt parts: mask 0, logprob 0).
      texts: the text of each reply, for logs and traces.
      finish_reason: the last reply's.
    """

    prompt: np.ndarray
    tokens: list[np.ndarray] = dataclasses.field(default_factory=list)
    logprobs: list[np.ndarray] = dataclasses.field(default_factory=list)
    mask: list[np.ndarray] = dataclasses.field(default_factory=list)
    versions: list[np.ndarray] = dataclasses.field(default_factory=list)
    floors: list[np.ndarray] = dataclasses.field(default_factory=list)  # kept sets; -inf: none
    # A mixture-of-experts sampler's record (routing replay): the last reply's, which covers
    # the segment's ids before it (as its prefill routed them) and the reply; None: none.
    routes: np.ndarray | None = None
    texts: list[str] = dataclasses.field(default_factory=list)
    finishes: list[str] = dataclasses.field(default_factory=list)
    finish_reason: str = "length"

    @property
    def ids(self) -> np.ndarray:
        """int32 [P + C]: the prompt and everything appended so far."""
        return np.concatenate([self.prompt, *self.tokens]).astype(np.int32)

    @property
    def turns(self) -> int:
        return len(self.texts)

    def append(self, ids, logprobs, *, model: bool, versions, floors=None) -> None:
        self.tokens.append(np.asarray(ids, np.int32))
        self.logprobs.append(np.asarray(logprobs, np.float32))
        self.mask.append(np.full(len(ids), int(model), np.int8))
        self.versions.append(np.asarray(versions, np.int32))
        none = np.full(len(ids), -np.inf, np.float32)
        self.floors.append(none if floors is None else np.asarray(floors, np.float32))

    def last_version(self) -> int:
        """The newest part's last version (-1 before any reply): what prompt ids are tagged with."""
        for part in reversed(self.versions):
            if len(part):
                return int(part[-1])
        return -1

    def completion(self, info: dict) -> Completion | None:
        """The segment as one Completion (trailing prompt ids cut), or None: nothing sampled."""
        mask = np.concatenate([np.zeros(0, np.int8), *self.mask])
        sampled = np.flatnonzero(mask)
        if not len(sampled):
            return None
        end = int(sampled[-1]) + 1
        versions = np.concatenate(self.versions)[:end]
        on_model = versions[mask[:end] == 1]
        floors = np.concatenate(self.floors)[:end]
        routes = None
        if self.routes is not None:  # prompt ids after the last reply: -1 (none recorded)
            routes = np.full((len(self.prompt) + end, *self.routes.shape[1:]), -1)
            routes = routes.astype(self.routes.dtype)
            kept = self.routes[: len(routes)]
            routes[: len(kept)] = kept
        return Completion(
            tokens=np.concatenate(self.tokens)[:end].astype(np.int32),
            logprobs=np.concatenate(self.logprobs)[:end].astype(np.float32),
            text=" | ".join(self.texts),
            finish_reason=self.finish_reason,
            policy_version=max(int(on_model.min()), 0),
            versions=versions if len(set(versions.tolist())) > 1 else None,
            loss_mask=mask[:end],
            episode={"turns": self.turns, **info},
            kept_floor=floors if np.isfinite(floors).any() else None,
            routes=routes,
        )


class Transcript:
    """What one episode sent and what was sampled for it, token exact (see the module docstring).

    Args:
      name: the episode's name in logs (its prompt id, say).
    """

    def __init__(self, name: str = ""):
        self.name = name
        self.segments: list[Segment] = []
        self.rewrites = 0

    @property
    def requests(self) -> int:
        return sum(s.turns for s in self.segments)

    def request(self, ids: np.ndarray) -> np.ndarray:
        """Records a request's rendered prompt ids; returns the ids to sample from (the segment's).

        Only the ids past those recorded are appended; ids that do not start
        with the recorded ones open a new segment (counted in ``rewrites``).
        """
        ids = np.asarray(ids, np.int32)
        if not self.segments:
            self.segments.append(Segment(ids))
            return ids
        segment = self.segments[-1]
        known = segment.ids
        if len(ids) >= len(known) and np.array_equal(ids[: len(known)], known):
            new = ids[len(known) :]
            if len(new):
                version = segment.last_version()
                segment.append(
                    new, np.zeros(len(new)), model=False, versions=np.full(len(new), version)
                )
            return ids
        self.rewrites += 1
        where = _first_difference(known, ids)
        log.warning(
            "episode %r: request %d does not extend the episode's %d ids (they differ at id %d); "
            "segment %d starts (the agent rewrote its history)",
            self.name,
            self.requests + 1,
            len(known),
            where,
            len(self.segments) + 1,
        )
        self.segments.append(Segment(ids))
        return ids

    def reply(self, completion: Completion, text: str | None = None) -> None:
        """Appends a reply the sampler made for the last request: its ids, logprobs, versions."""
        if not self.segments:
            raise ValueError(f"episode {self.name!r}: a reply before any request")
        c = completion
        versions = (
            c.versions if c.versions is not None else np.full(len(c.tokens), c.policy_version)
        )
        segment = self.segments[-1]
        if c.routes is not None and len(c.routes) == len(segment.ids) + len(c.tokens):
            segment.routes = c.routes  # sampled after the segment's ids as they stand
        segment.append(c.tokens, c.logprobs, model=True, versions=versions, floors=c.kept_floor)
        segment.texts.append(c.text if text is None else text)
        segment.finishes.append(c.finish_reason)
        segment.finish_reason = c.finish_reason

    def turns(self) -> list[tuple[np.ndarray, Completion]]:
        """Every reply in order: (the ids it was sampled after, the reply as sampled): what a
        replay answers the same requests with (:mod:`rlax.core.rollout.agents.turns`)."""
        out = []
        for segment in self.segments:
            before, k = [segment.prompt], 0
            for ids, lp, mask, versions, floors in zip(
                segment.tokens, segment.logprobs, segment.mask, segment.versions, segment.floors
            ):
                if len(mask) and mask[0] == 1:
                    c = Completion(
                        ids,
                        lp,
                        segment.texts[k],
                        segment.finishes[k],
                        int(versions.min()),
                        versions,
                        kept_floor=floors if np.isfinite(floors).any() else None,
                    )
                    out.append((np.concatenate(before).astype(np.int32), c))
                    k += 1
                before.append(ids)
        return out

    def completions(self) -> list[tuple[np.ndarray, Completion]]:
        """Each segment with a reply: (its prompt ids int32 [P], the rest as one Completion)."""
        out = []
        for k, segment in enumerate(self.segments):
            info = {"segment": k, "segments": len(self.segments), "rewrites": self.rewrites}
            completion = segment.completion(info)
            if completion is not None:
                out.append((segment.prompt, completion))
        return out


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
