"""Agent episodes behind the Sampler contract: agent code talks to an endpoint over our sampler.

``samplers.agents(sampler=..., agent=...)`` is a
:class:`~rlax.core.contracts.Sampler`, as ``samplers.episodes`` is for
environments, so a worker, the inline trainer and ``rlax eval`` run agents
unchanged. ``setup`` starts one :class:`~rlax.core.rollout.agents.endpoint.AgentEndpoint`
over the inner sampler (kept for every call after). ``generate(prompts, n)``
opens ``n`` episodes per prompt (one API key each) and runs the agent for
all of them at once (:func:`~rlax.core.rollout.agents.episodes.run_agents`:
threads for a sync agent, one event loop for an async one); their requests
are sampled together (:class:`~rlax.core.rollout.agents.batch.Batcher`).

Limits: ``max_turns`` replies and ``max_episode_tokens`` ids after the
episode's prompt (requests past them are refused, 400), ``wall_s`` seconds
(then its key is closed: a late request gets 401). An agent that raises,
runs past its deadline, exceeds a limit or returns something else than a
reward, an answer or an ``AgentResult`` ends its episode with reward 0,
``failed`` 1 and the reason in the episode report.

Each episode is ONE :class:`~rlax.core.types.Completion`, built from its
transcript's FIRST segment (the one its first request opened): every id
after the group's prompt, ``loss_mask`` 1 on the sampled ids (their
logprobs and versions the inner sampler's) and 0 on the rest (tool answers,
the agent's next messages). A rewritten history opens later segments: their
sampled ids are not trained on; the report counts them (``segments``,
``rewrites``, ``dropped_tokens``). The group's prompt: the agent renders its
own first request, whose ids need not start with the task's
``Prompt.tokens``; the episodes' completions continue the ids their first
requests share (``episode["prompt_tokens"]``, which
:func:`~rlax.core.rollout.groups.episode_prompt` makes the group's prompt),
so the trainer scores exactly the context the sampler saw.

The reward: the agent's number, or its answer scored by ``reward`` (the
reward plugin, e.g. ``@rewards.arithmetic()``).

In-flight weights: with ``rlax.worker.reload_in_flight`` the worker's
``refresh`` is asked before each batch of turns (:class:`~rlax.core.rollout.agents.batch.Batcher`),
so an episode that spans a weight load has turns of both versions, each id
tagged with its own.

Preemption: replay, not hand-back of agent state (agent code holds state no
worker can hand on). :meth:`AgentSampler.generate_groups` is
:class:`~rlax.core.contracts.Resumable`: on a notice (``interrupt()``) every
episode's key is closed (a turn in flight is recorded first) and each group
goes back to the parameter server as a PartialGroup whose rows carry their
episodes' recorded turns (``episode["replay"]``: the ids each reply was
sampled after, its ids, logprobs, versions, text). The next worker runs the
agent again; the endpoint answers each request whose ids are the next
recorded turn's with the recorded reply, samples nothing for it, and
samples only past the record (a request that differs drops the rest of the
replay). ``replayed_turns`` in the report counts them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Self

import numpy as np

from rlax.core import hookimpl
from rlax.core.constraints import AtLeast, Positive
from rlax.core.contracts import Sampler, ToolParser
from rlax.core.rollout.agents.chat_tokenizer import with_chat_template
from rlax.core.rollout.agents.episodes import (
    AgentOutcome,
    Job,
    client_api,
    client_factory,
    outcome_of,
    run_agents,
)
from rlax.core.rollout.agents.transcript import Transcript
from rlax.core.rollout.reward_pool import score_one
from rlax.core.types import PARTIAL, Completion, PartialGroup, Prompt
from rlax.plugins.agents.rules import SELECTOR, check_chat_template, check_served_model

__all__ = ["AgentSampler"]

log = logging.getLogger("rlax.agents")


class AgentSampler:
    """Runs an agent's episodes with an inner sampler (see the module docstring).

    Args:
      sampler: the sampler of each request (``@samplers.engine()`` or ``@samplers.jax()``).
      agent: the agent (``@agents.<name>`` for a function, ``@agents.<name>()`` for a class).
      reward: scores an agent's answer (not needed by an agent that returns rewards).
      tool_parser: reads tool calls in the model's text (``@tool_parsers.hermes()``).
      max_turns: replies per episode.
      max_episode_tokens: ids per episode after its prompt (the trainer pads to it).
      wall_s: seconds per episode.
      batch_window_s: how long a request waits for others to be sampled with it.
      model: the model name the endpoint serves (the one the agent's code asks for).
      chat_template: jinja source the endpoint renders chats with, in place of the
        model's own (None: the model's; :mod:`rlax.core.rollout.agents.chat_tokenizer`).
      in_process: the agents' ``openai`` clients call the endpoint's app in this
        process, no socket (:mod:`rlax.core.rollout.agents.in_process`); False: over
        loopback HTTP, as an agent in another process would.
    """

    def __init__(
        self,
        *,
        sampler: Sampler,
        agent: Any,
        reward: Any = None,
        tool_parser: ToolParser | None = None,
        max_turns: Annotated[int, AtLeast(1)] = 4,
        max_episode_tokens: Annotated[int, AtLeast(1)] = 256,
        wall_s: Annotated[float, Positive] = 120.0,
        batch_window_s: Annotated[float, AtLeast(0)] = 0.01,
        model: str = "rlax-policy",
        chat_template: str | None = None,
        in_process: bool = True,
    ):
        self.sampler, self.agent, self.reward = sampler, agent, reward
        self.tool_parser = tool_parser
        self.max_turns, self.max_episode_tokens = max_turns, max_episode_tokens
        self.wall_s, self.batch_window_s = wall_s, batch_window_s
        self.model, self.chat_template = model, chat_template
        self.in_process = in_process
        self.tokenizer: Any = None
        self.endpoint: Any = None

    @property
    def temperature(self) -> float:
        return self.sampler.temperature

    @property
    def max_new_tokens(self) -> int:
        """The episode's token limit: no completion is longer."""
        return self.max_episode_tokens

    def check_run(self, spec: Any) -> None:
        """The rules of an agent run, before it starts (:mod:`rlax.plugins.agents.rules`): the
        agent asks for the model the endpoint serves, and the policy's tokenizer (with
        ``chat_template``) renders a conversation."""
        from rlax.core.models.tokenizer import load_tokenizer

        check_served_model(self.agent, self.model)
        try:
            tokenizer = load_tokenizer(spec.init_checkpoint)
        except (OSError, ValueError):
            return  # the roles load it and say what is wrong with the checkpoint
        setting = f"{SELECTOR}.chat_template" if self.chat_template else "rlax.run.init_checkpoint"
        check_chat_template(with_chat_template(tokenizer, self.chat_template), setting)

    def setup(self, model, tokenizer) -> None:
        self.sampler.setup(model, tokenizer)
        self.tokenizer = with_chat_template(tokenizer, self.chat_template)
        self._endpoint()

    def load_weights(self, params, version: int) -> None:
        self.sampler.load_weights(params, version)

    def _endpoint(self):
        if self.endpoint is None:
            # Imported here: the endpoint needs the 'agents' extra (fastapi, uvicorn, openai).
            from rlax.core.rollout.agents.endpoint import AgentEndpoint

            self.endpoint = AgentEndpoint(
                sampler=self.sampler,
                tokenizer=self.tokenizer,
                tool_parser=self.tool_parser,
                model=self.model,
                batch_window_s=self.batch_window_s,
            )
            self.endpoint.start()
        return self.endpoint

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.stop()
            self.endpoint = None

    def generate(
        self, prompts: Sequence[Prompt], n: int, *, seed: int
    ) -> list[tuple[Completion, ...]]:
        """``n`` episodes of each prompt, each one Completion (see the module docstring)."""
        out = self.generate_groups(prompts, n, seed=seed)
        assert all(isinstance(g, tuple) for g in out)  # nothing interrupts this call
        return out  # type: ignore[return-value]

    def generate_groups(
        self,
        prompts: Sequence[Prompt],
        n: int,
        *,
        seed: int,
        partials: Sequence[PartialGroup | None] | None = None,
        interrupt: Callable[[], bool] | None = None,
        refresh: Callable[[], Any] | None = None,
    ) -> list[tuple[Completion, ...] | PartialGroup]:
        """``generate``, resumable: once ``interrupt()`` is True every episode's key is
        closed and each group comes back as a PartialGroup whose rows carry their
        episodes' recorded turns (``episode["replay"]``); given back as ``partials``,
        each episode is played again with the endpoint answering the recorded requests
        with the recorded replies (nothing sampled again) and sampling only past them.
        ``refresh`` (``rlax.worker.reload_in_flight``) is asked before each batch of
        turns: a turn after a load samples with the new weights, its ids carry their
        version (the episode's Completion ``versions``)."""
        endpoint = self._endpoint()
        asked = [(i, j, p) for i, p in enumerate(prompts) for j in range(n)]
        keys = [self._open(endpoint, p, seed, k) for k, (_, _, p) in enumerate(asked)]
        sessions = [endpoint.sessions[key] for key in keys]
        for (i, j, _), session in zip(asked, sessions):
            work = partials[i] if partials is not None else None
            row = work.rows[j] if work is not None else None
            session.replay = _turns((row.episode or {}).get("replay", [])) if row else []
        made: dict[str, Any] = {}  # a sync client's HTTP client, by key: closed when it returns
        api = client_api(self.agent)
        local = endpoint if self.in_process else None
        jobs = [
            Job(p, client_factory(endpoint.url, key, made, api, local))
            for (_, _, p), key in zip(asked, keys)
        ]
        cut = _Watch(interrupt, lambda: _close_all(endpoint, keys))
        endpoint.backend.batcher.refresh = refresh  # in-flight weights between batches
        with cut, _unset(endpoint.backend.batcher):
            outcomes = run_agents(
                self.agent,
                jobs,
                wall_s=self.wall_s,
                on_deadline=lambda k: _close(endpoint, keys[k]),
                # A finished episode's key closes at once: the batcher waits for live ones only.
                on_done=lambda k: _close(endpoint, keys[k], made),
            )
        for key in keys:
            _close(endpoint, key)
        if cut.fired:
            rows = [_partial_row(s.transcript) for s in sessions]
            return [PartialGroup(tuple(rows[i * n : (i + 1) * n])) for i in range(len(prompts))]
        episodes = [self._episode(p, s, o) for (_, _, p), s, o in zip(asked, sessions, outcomes)]
        return [
            _rebased(
                prompts[i], episodes[i * n : (i + 1) * n], self.max_episode_tokens, self.tokenizer
            )
            for i in range(len(prompts))
        ]

    def _open(self, endpoint: Any, p: Prompt, seed: int, k: int) -> str:
        return endpoint.open_episode(
            f"{p.id}/{seed}/{k}", max_turns=self.max_turns, max_tokens=self.max_episode_tokens
        )

    def _episode(self, prompt: Prompt, session: Any, o: AgentOutcome):
        """(first segment's prompt ids or None, its Completion or None, the report)."""
        transcript: Transcript = session.transcript
        reward, reason, failed, info = self._reward(prompt, session.stopped, o)
        pairs = transcript.completions()
        first = transcript.segments[0] if transcript.segments else None
        kept = pairs[0] if pairs and first is not None and pairs[0][0] is first.prompt else None
        dropped = sum(int(c.model_mask.sum()) for _, c in pairs[1 if kept else 0 :])
        report = {
            "reward": reward,
            "reason": reason,
            "failed": failed,
            "turns": float(transcript.requests),
            "segments": float(len(transcript.segments)),
            "rewrites": float(transcript.rewrites),
            "dropped_tokens": float(dropped),
            "agent_s": round(o.seconds, 3),
            "replayed_turns": float(session.replayed),
            **info,
        }
        return (kept[0] if kept else None), (kept[1] if kept else None), report

    def _reward(self, prompt: Prompt, stopped: str, o: AgentOutcome):
        """(reward, reason, failed 0/1, info): a failed episode's reward is 0."""
        failure = stopped or o.failure
        info: dict[str, float] = {}
        if not failure:
            try:
                result = outcome_of(o.value)
                info = {k: float(v) for k, v in result.info.items()}
                if result.reward is not None:
                    return result.reward, result.answer or "", 0.0, info
                if self.reward is None:
                    raise ValueError(
                        "the agent answered; samplers.agents has no reward to score it"
                    )
                score, why = score_one(self.reward, prompt, result.answer or "")
                return score, why, 0.0, info
            except Exception as err:  # noqa: BLE001 -- a bad result costs its episode
                failure = f"{type(err).__name__}: {err}"
        log.warning("agent episode of prompt %r ends with reward 0: %s", prompt.id, failure)
        return 0.0, failure, 1.0, info


@contextlib.contextmanager
def _unset(batcher: Any):
    """The batcher's ``refresh`` is this call's only: unset when it ends."""
    try:
        yield
    finally:
        batcher.refresh = None


class _Watch:
    """Polls ``interrupt`` in a thread while the episodes run; once True, calls ``cut``."""

    def __init__(self, interrupt: Callable[[], bool] | None, cut: Callable[[], object]):
        self.interrupt, self.cut, self.fired = interrupt, cut, False
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def _poll(self) -> None:
        assert self.interrupt is not None
        while not self._done.wait(0.02):
            if self.interrupt():
                self.fired = True
                self.cut()
                return

    def __enter__(self) -> Self:
        if self.interrupt is not None:
            self._thread = threading.Thread(target=self._poll, name="agents-interrupt", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


def _partial_row(transcript: Transcript) -> Completion:
    """An interrupted episode as a PartialGroup row: no tokens, its recorded turns to replay."""
    replay = [
        {
            "ids": ids.tolist(),
            "tokens": c.tokens.tolist(),
            "logprobs": c.logprobs.tolist(),
            "versions": np.asarray(c.versions).tolist(),
            "text": c.text,
            "finish": c.finish_reason,
        }
        for ids, c in transcript.turns()
    ]
    empty = np.zeros(0, np.int32)
    return Completion(empty, np.zeros(0, np.float32), "", PARTIAL, 0, episode={"replay": replay})


def _turns(replay: list[dict]) -> list[tuple[np.ndarray, Completion]]:
    out = []
    for t in replay:
        versions = np.asarray(t["versions"], np.int32)
        c = Completion(
            np.asarray(t["tokens"], np.int32),
            np.asarray(t["logprobs"], np.float32),
            t["text"],
            t["finish"],
            int(versions.min()) if len(versions) else 0,
            versions,
        )
        out.append((np.asarray(t["ids"], np.int32), c))
    return out


def _close_all(endpoint: Any, keys: Sequence[str]) -> None:
    for key in keys:
        _close(endpoint, key)


def _close(endpoint: Any, key: str, made: dict[str, Any] | None = None) -> None:
    http = made.pop(key, None) if made is not None else None
    if http is not None:
        http.close()
    try:
        endpoint.close_episode(key)
    except KeyError:
        pass  # closed already (its agent returned, or its deadline passed)


def _rebased(prompt: Prompt, episodes, limit: int, tokenizer: Any) -> tuple[Completion, ...]:
    """Each episode's Completion after the ids its group's first requests share."""
    starts = [ids for ids, _, _ in episodes if ids is not None]
    common = _common_prefix(starts) if starts else np.asarray(prompt.tokens, np.int32)
    out = []
    for ids, c, report in episodes:
        report = {**report, "prompt_tokens": common.tolist()}
        if c is not None and not np.array_equal(ids[: len(common)], common):
            why = "its first request shares no ids with its group's"
            c, report = None, {**report, "reward": 0.0, "reason": why, "failed": 1.0}
        if c is None:
            # A completion holds at least one id: the stop id, off the loss mask.
            eos = np.asarray([tokenizer.eos_id], np.int32)
            c = Completion(eos, np.zeros(1, np.float32), "", "stop", 0, None, np.zeros(1, np.int8))
        else:
            c = _after(ids[len(common) :], c, limit)
        out.append(dataclasses.replace(c, episode=report))
    return tuple(out)


def _after(head: np.ndarray, c: Completion, limit: int) -> Completion:
    """``c`` with ``head`` (prompt ids, mask 0) before it, cut to ``limit`` ids."""
    mask = c.loss_mask if c.loss_mask is not None else np.ones(len(c.tokens), np.int8)
    versions = c.versions if c.versions is not None else np.full(len(c.tokens), c.policy_version)
    first = int(versions[mask == 1][0]) if mask.any() else c.policy_version
    tokens = np.r_[head, c.tokens].astype(np.int32)[:limit]
    cut = len(tokens) < len(head) + len(c.tokens)
    v = np.r_[np.full(len(head), first), versions].astype(np.int32)[:limit]
    return dataclasses.replace(
        c,
        tokens=tokens,
        logprobs=np.r_[np.zeros(len(head)), c.logprobs].astype(np.float32)[:limit],
        loss_mask=np.r_[np.zeros(len(head)), mask].astype(np.int8)[:limit],
        versions=v if len(set(v.tolist())) > 1 else None,
        finish_reason="length" if cut else c.finish_reason,
    )


def _common_prefix(seqs: list[np.ndarray]) -> np.ndarray:
    n = min(len(s) for s in seqs)
    first = seqs[0][:n]
    for s in seqs[1:]:
        differ = np.flatnonzero(s[:n] != first)
        n = int(differ[0]) if len(differ) else n
        first = first[:n]
    # At least one id of the prompt stays the group's (a prompt is never empty).
    return np.asarray(first if n else seqs[0][:1], np.int32)


@hookimpl
def rlax_register_samplers():
    return {"agents": AgentSampler}
