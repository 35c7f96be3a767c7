"""Concurrent agent episodes share the sampler: far fewer generate calls than requests, and
every episode's recorded ids and logprobs are still exactly what the sampler returned."""

from __future__ import annotations

import threading

import numpy as np
import openai
import pytest
from chatml_case import chatml_tokenizer

from rlax.core.rollout.agents.batch import Batcher
from rlax.core.rollout.agents.endpoint import AgentEndpoint
from rlax.core.types import Completion, Prompt

TOK = chatml_tokenizer()


class Counting:
    """A deterministic sampler (ids from each prompt's length and seed) that counts its calls."""

    temperature, max_new_tokens, max_prompt_tokens = 1.0, 6, 4096

    def __init__(self):
        self.calls: list[int] = []  # rows per call
        self.rows: list[tuple[list[int], Completion]] = []
        self._lock = threading.Lock()

    def generate(self, prompts, n, *, seed):
        out = []
        for p in prompts:
            k = 2 + (len(p.tokens) + seed) % 3
            ids = np.r_[97 + (np.arange(k) + len(p.tokens)) % 26, TOK.eos_id].astype(np.int32)
            lp = -np.linspace(0.1, 0.9, len(ids)).astype(np.float32) - len(p.tokens) / 1000
            c = Completion(ids, lp, TOK.decode(ids[:-1]), "stop", 3)
            out.append((c,))
            with self._lock:
                self.rows.append((p.tokens.tolist(), c))
        with self._lock:
            self.calls.append(len(prompts))
        return out


def test_a_batch_samples_every_pending_request_in_one_call():
    sampler = Counting()
    batcher = Batcher(sampler, window_s=5.0, live=lambda: 4)
    got = {}

    def ask(k):
        got[k] = batcher.sample(Prompt(str(k), "", np.arange(k + 1, dtype=np.int32), None), k)

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    # Four live episodes, four requests: one call, without waiting out the 5 s window.
    assert sampler.calls == [4] and batcher.calls == 1 and batcher.requests == 4
    for k in range(4):
        assert any(p == list(range(k + 1)) and c is got[k] for p, c in sampler.rows)


def test_a_sampler_s_error_is_every_request_s_of_its_batch():
    class Broken(Counting):
        def generate(self, prompts, n, *, seed):
            raise RuntimeError("engine down")

    batcher = Batcher(Broken(), window_s=0.0)
    with pytest.raises(RuntimeError, match="engine down"):
        batcher.sample(Prompt("p", "", np.arange(3, dtype=np.int32), None), 0)
    assert batcher.calls == 1


def test_concurrent_episodes_make_far_fewer_generate_calls_than_requests():
    sampler = Counting()
    episodes, turns = 8, 3
    with AgentEndpoint(sampler=sampler, tokenizer=TOK, model="m", batch_window_s=0.5) as ep:
        keys = [ep.open_episode(f"ep/{k}") for k in range(episodes)]

        def play(k):
            api = openai.OpenAI(base_url=ep.url, api_key=keys[k], max_retries=0, timeout=60)
            messages = [{"role": "user", "content": "w" * (k + 1)}]
            for _ in range(turns):
                r = api.chat.completions.create(model="m", messages=messages)
                messages += [r.choices[0].message.model_dump(exclude_none=True)]
                messages += [{"role": "user", "content": "go on"}]

        threads = [threading.Thread(target=play, args=(k,)) for k in range(episodes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        transcripts = [ep.close_episode(k) for k in keys]
    requests = episodes * turns
    assert sum(sampler.calls) == requests and ep.backend.batcher.requests == requests
    assert len(sampler.calls) <= requests // 2, sampler.calls
    for transcript in transcripts:
        ((prompt, c),) = transcript.completions()
        ids = np.r_[prompt, c.tokens].tolist()
        mine = [s for p, s in sampler.rows if ids[: len(p)] == p and len(p) >= len(prompt)]
        assert len(mine) == turns and transcript.rewrites == 0
        on = c.loss_mask == 1
        assert c.tokens[on].tolist() == np.concatenate([s.tokens for s in mine]).tolist()
        assert c.logprobs[on].tolist() == np.concatenate([s.logprobs for s in mine]).tolist()


def test_a_replay_answers_the_recorded_requests_and_samples_from_the_first_other_one():
    sampler = Counting()
    with AgentEndpoint(sampler=sampler, tokenizer=TOK, model="m", batch_window_s=0.0) as ep:
        key = ep.open_episode("first")
        api = openai.OpenAI(base_url=ep.url, api_key=key, max_retries=0, timeout=60)
        one = [{"role": "user", "content": "a"}]
        r = api.chat.completions.create(model="m", messages=one)
        reply = r.choices[0].message.model_dump(exclude_none=True)
        api.chat.completions.create(
            model="m", messages=[*one, reply, {"role": "user", "content": "b"}]
        )
        turns = ep.close_episode(key).turns()
        assert len(turns) == 2
        calls = len(sampler.calls)

        again = ep.open_episode("again")
        ep.sessions[again].replay = list(turns)
        api = openai.OpenAI(base_url=ep.url, api_key=again, max_retries=0, timeout=60)
        r2 = api.chat.completions.create(model="m", messages=one)
        assert len(sampler.calls) == calls  # answered from the record, not sampled
        assert r2.choices[0].message.content == r.choices[0].message.content
        other = [*one, reply, {"role": "user", "content": "something else"}]
        api.chat.completions.create(model="m", messages=other)
        session = ep.sessions[again]
        assert len(sampler.calls) == calls + 1 and session.replayed == 1 and session.replay == []
        transcript = ep.close_episode(again)
    ((_, c),) = transcript.completions()
    first = turns[0][1]
    assert c.tokens[: len(first.tokens)].tolist() == first.tokens.tolist()
    assert c.logprobs[: len(first.tokens)].tolist() == first.logprobs.tolist()
