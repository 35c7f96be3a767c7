"""A worker with a Resumable sampler: a notice hands partial work in, another worker finishes
it as if nothing had happened; weights reloaded between decode steps show in the versions."""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest

from rlax.core.contracts import Resumable
from rlax.core.errors import ConfigError
from rlax.core.param_server.client import ParamServerClient
from rlax.core.runtime.preemption import Preemption
from rlax.core.spec import RunSpec
from rlax.core.spec.checks import check_run
from rlax.core.spec.rules import check_worker
from rlax.core.types import PARTIAL, Completion, Group, PartialGroup
from rlax.core.wire import WirePlan
from rlax.core.worker.role import Worker, worker
from rlax.core.worker.spec import WorkerSpec

TREE = {"w": np.zeros((4,), np.float32)}
PLAN = WirePlan.for_tree(TREE)
STOP = 2


def _draw(*key) -> int:
    return zlib.crc32("/".join(map(str, key)).encode())


@dataclasses.dataclass
class _Row:
    tokens: list[int]
    versions: list[int]
    length: int  # the drawn length, stop token included
    reason: str = PARTIAL


class FakeEngine:
    """A deterministic Resumable sampler (no model).

    Token t of sample j of a prompt is a function of (seed, prompt, j, t); the
    sample stops with token 2 at a drawn length of 6..29. Rows advance
    ``CHUNK`` tokens per decode chunk; ``interrupt()`` and ``refresh()`` are
    polled before each chunk, and ``on_chunk(k)`` runs after the k-th.
    ``generated`` counts the tokens it decoded (not those it continued from).
    """

    CHUNK = 4
    temperature = 1.0
    max_new_tokens = 32

    def __init__(self, on_chunk=None):
        self.on_chunk = on_chunk or (lambda k: None)
        self.version = -1
        self.generated = 0
        self.calls: list[dict] = []

    def setup(self, model, tokenizer):
        pass

    def load_weights(self, params, version):
        self.version = version

    def generate(self, prompts, n, *, seed):
        return self.generate_groups(prompts, n, seed=seed)

    def generate_groups(self, prompts, n, *, seed, partials=None, interrupt=None, refresh=None):
        self.calls.append({"partials": partials, "interrupt": interrupt, "refresh": refresh})
        groups = [
            [self._start(seed, p, j, partials[i] if partials else None) for j in range(n)]
            for i, p in enumerate(prompts)
        ]
        chunks = 0
        while any(r.reason == PARTIAL for g in groups for r in g):
            if interrupt is not None and interrupt():
                break
            newer = refresh() if refresh is not None else None
            if newer is not None:
                self.version = newer[1]
            for p, g in zip(prompts, groups):
                for j, r in enumerate(g):
                    self._decode(seed, p, j, r)
            chunks += 1
            self.on_chunk(chunks)
        return [self._out(g) for g in groups]

    def _start(self, seed, prompt, j, partial):
        length = 6 + _draw(seed, prompt.id, j, "len") % 24
        if partial is None:
            return _Row([], [], length)
        c = partial.rows[j]
        versions = [c.policy_version] * len(c.tokens) if c.versions is None else c.versions
        return _Row(list(c.tokens), [int(v) for v in versions], length, c.finish_reason)

    def _decode(self, seed, prompt, j, r):
        for _ in range(self.CHUNK):
            if r.reason != PARTIAL:
                return
            t = len(r.tokens)
            r.tokens.append(STOP if t == r.length - 1 else 3 + _draw(seed, prompt.id, j, t) % 50)
            r.versions.append(self.version)
            self.generated += 1
            if r.tokens[-1] == STOP:
                r.reason = "stop"

    def _out(self, rows):
        def completion(r):
            tokens = np.asarray(r.tokens, np.int32)
            versions = np.asarray(r.versions, np.int32)
            text = " ".join(map(str, r.tokens[:-1] if r.reason == "stop" else r.tokens))
            oldest = int(versions.min()) if len(versions) else self.version
            logprobs = -(tokens.astype(np.float32) / 64)
            return Completion(tokens, logprobs, text, r.reason, oldest, versions)

        out = tuple(completion(r) for r in rows)
        return PartialGroup(out) if any(r.reason == PARTIAL for r in rows) else out


class LengthReward:
    def score(self, prompt, text):
        return float(len(text.split()) % 3)


def make_worker(client, engine, name, **kwargs):
    if kwargs.get("reload_in_flight"):  # a client of its own: each pull into a new buffer
        client = ParamServerClient(client.settings, retry_s=0.0, reuse_pull_buffer=False)
    return Worker(
        client,
        engine,
        LengthReward(),
        [],
        group_size=3,
        prompts_per_lease=2,
        reload_staleness=0,
        worker_id=name,
        seed=7,
        deterministic=True,
        **kwargs,
    )


def take_all(client, n, version=0, max_staleness=0):
    _, groups, dropped = client.take(
        n, current_version=version, max_staleness=max_staleness, wait_s=0
    )
    assert dropped == 0
    return {g.prompt.id: g for g in groups}


def rows(group: Group):
    return [
        (c.tokens.tolist(), c.logprobs.tolist(), c.versions.tolist(), c.finish_reason)
        for c in group.completions
    ]


def test_the_fake_is_resumable():
    assert isinstance(FakeEngine(), Resumable)


def test_a_notice_hands_partial_work_in_and_another_worker_finishes_it_exactly(make_ps, caplog):
    reference, running = make_ps(), make_ps()
    for ps in (reference, running):
        ps.client.push(PLAN, TREE, 0)
    uninterrupted = FakeEngine()
    assert make_worker(reference.client, uninterrupted, "ref").run_once(PLAN) == 2
    expected = take_all(reference.client, 2)

    stop = Preemption([], role="worker")
    first = FakeEngine(on_chunk=lambda k: k == 2 and stop.notify("test notice"))
    w1 = make_worker(running.client, first, "w1", interrupt=lambda: stop.requested)
    with caplog.at_level("INFO", logger="rlax.worker"):
        assert w1.run_once(PLAN) == 0  # nothing finished: p0 cut off after 2 chunks, p1 at once
    said = f"0 groups submitted, 2 partial groups handed in ({first.generated} tokens)"
    assert any(said in r.getMessage() for r in caplog.records)
    q = running.client.stat().queue
    assert (q.partial_submitted, q.leased, q.pool, q.queued) == (2, 0, 2, 0)
    assert q.partial_tokens == first.generated > 0  # every token decoded was handed in
    assert first.generated <= 2 * FakeEngine.CHUNK * 3  # two chunks of three rows

    second = FakeEngine()
    assert make_worker(running.client, second, "w2").run_once(PLAN) == 2
    assert [c["partials"][0] is not None for c in second.calls] == [False, True]  # p1, then p0
    resumed = second.calls[1]["partials"][0]
    assert resumed.tokens == first.generated and resumed.unfinished >= 1
    got = take_all(running.client, 2)
    assert sorted(got) == sorted(expected) == ["p0", "p1"]
    for pid in expected:
        assert rows(got[pid]) == rows(expected[pid])
        np.testing.assert_array_equal(got[pid].rewards, expected[pid].rewards)
    # Tokens decoded twice: none here (at most one chunk per unfinished row is allowed).
    regenerated = first.generated + second.generated - uninterrupted.generated
    assert regenerated == 0 <= FakeEngine.CHUNK * 3
    q = running.client.stat().queue
    assert (q.partial_resumed, q.queued, q.pool, q.leased) == (1, 0, 0, 0)


def test_without_partial_resume_the_cut_off_tokens_are_decoded_again(make_ps):
    running = make_ps()
    running.client.push(PLAN, TREE, 0)
    stop = Preemption([], role="worker")
    first = FakeEngine(on_chunk=lambda k: k == 2 and stop.notify("test notice"))
    make_worker(running.client, first, "w1", interrupt=lambda: stop.requested).run_once(PLAN)
    second = FakeEngine()
    w2 = make_worker(running.client, second, "w2")
    w2.client.lease = _dropping_partials(w2.client.lease)  # a worker that ignores them
    assert w2.run_once(PLAN) == 2
    final = sum(len(c.tokens) for g in take_all(running.client, 2).values() for c in g.completions)
    assert second.generated == final  # every token decoded from the prompt again
    assert first.generated + second.generated - final == first.generated > FakeEngine.CHUNK * 3


def _dropping_partials(lease):
    def call(*args, **kwargs):
        leases = lease(*args, **kwargs)
        leases.partials.clear()
        return leases

    return call


def push_once(client, version):
    """An ``on_chunk`` that publishes ``version`` after the first chunk of the first call."""
    done = []

    def on_chunk(k):
        if k == 1 and not done:
            client.push(PLAN, TREE, version)
            done.append(version)

    return on_chunk


def test_in_flight_reload_gives_a_completion_tokens_of_two_versions(make_ps):
    running = make_ps()
    running.client.push(PLAN, TREE, 0)
    pushed = FakeEngine(on_chunk=push_once(running.client, 1))
    w = make_worker(running.client, pushed, "w", reload_in_flight=True, refresh_interval_s=0.0)
    assert w.run_once(PLAN) == 2
    assert w.version == 1
    groups = take_all(running.client, 2, version=1, max_staleness=1)
    p0 = groups["p0"].completions
    assert all(c.versions[:4].tolist() == [0] * 4 for c in p0)  # the first chunk: version 0
    assert all(set(c.versions[4:].tolist()) == {1} for c in p0)  # then version 1
    assert all((c.policy_version, c.newest_version) == (0, 1) for c in p0)


@pytest.mark.parametrize("kwargs", [{}, {"reload_in_flight": True, "refresh_interval_s": 3600.0}])
def test_in_flight_reload_off_or_rate_limited_keeps_one_version(make_ps, kwargs):
    running = make_ps()
    running.client.push(PLAN, TREE, 0)
    engine = FakeEngine(on_chunk=push_once(running.client, 1))
    w = make_worker(running.client, engine, "w", **kwargs)
    w.run_once(PLAN)
    assert (engine.calls[0]["refresh"] is None) == (not kwargs)
    groups = take_all(running.client, 2, version=w.version)
    assert {v for g in groups.values() for c in g.completions for v in c.versions} == {0}


def test_reload_in_flight_needs_a_resumable_sampler():
    class Static:
        pass

    spec = RunSpec(
        task=None,
        reward=LengthReward(),
        sampler=Static(),
        init_checkpoint="unused",
        worker=WorkerSpec(reload_in_flight=True),
    )
    says = "rlax.worker.reload_in_flight: Static is not Resumable"
    with pytest.raises(ConfigError, match=says):
        check_run(spec, "worker")  # the run, checked before any role starts
    with pytest.raises(ConfigError, match=says):
        worker(spec)  # and the worker, before it loads the model ("unused" is none)
    check_worker(spec.replace(worker=WorkerSpec(reload_in_flight=False)), "worker")
    check_worker(spec, "trainer")  # the trainer runs no sampler between decode steps
