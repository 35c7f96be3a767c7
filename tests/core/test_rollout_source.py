"""Rollout sources fill a batch that curation thinned: inline (rounds of sampling) and remote.

The remote tests run a real parameter server in this process (the fixtures of
``tests/core/conftest.py``) and play the workers' part by hand: lease, score,
submit — so that which groups a filter drops, and when, is under the test's
control.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from rlax.core.param_server.client import ParamServerClient
from rlax.core.trainer.sources import InlineRollouts, RemoteRollouts
from rlax.core.types import Completion, DroppedGroup, Group, Prompt
from rlax.core.wire import WirePlan
from rlax.plugins.curation.dynamic_sampling import DynamicSampling
from rlax.plugins.curation.zero_variance import ZeroVarianceFilter

G = 2  # completions per prompt


def counts(info: dict) -> dict:
    """The round counts of a batch's info, without its timings (``generate_s``, ``score_s``)."""
    timings = {k for k in info if k.endswith("_s")}
    assert timings <= {"generate_s", "score_s"} and all(info[k] >= 0 for k in timings)
    return {k: v for k, v in info.items() if k not in timings}


def numbered_prompts():
    for i in itertools.count():
        yield Prompt(id=f"p{i}", text=f"{i}=", tokens=np.array([1, 3], np.int32), answer=str(i))


def completions(prompt: Prompt, informative: set[int], version: int = 0):
    """Mixed rewards (one right, one wrong) for an informative prompt, all wrong otherwise."""
    i = int(prompt.id[1:])
    texts = ("ok", "no") if i in informative else ("no", "no")
    tokens, logprobs = np.array([5, 2], np.int32), np.array([-0.5, -0.1], np.float32)
    return tuple(Completion(tokens, logprobs, t, "stop", version) for t in texts)


class ScriptedSampler:
    """Completions decided by the prompt's number; records every generate call."""

    version = 0

    def __init__(self, informative: set[int]):
        self.informative = informative
        self.calls: list[tuple[list[str], int]] = []

    def generate(self, prompts, n, *, seed):
        assert n == G
        self.calls.append(([p.id for p in prompts], seed))
        return [completions(p, self.informative) for p in prompts]

    def load_weights(self, params, version):
        self.version = version


class OkReward:
    def score(self, prompt, completion_text):
        return 1.0 if completion_text == "ok" else 0.0


def inline(informative, curation, prompts_per_step=4):
    sampler = ScriptedSampler(set(informative))
    source = InlineRollouts(
        numbered_prompts(),
        sampler,
        OkReward(),
        curation,
        group_size=G,
        prompts_per_step=prompts_per_step,
        seed=0,
    )
    return source, sampler


def kept_ids(entries):
    return [e.prompt.id for e in entries if isinstance(e, Group)]


# -- inline -----------------------------------------------------------------------------


def test_inline_refills_a_short_batch_with_extra_rounds():
    source, sampler = inline({0, 5, 6, 9}, [DynamicSampling(extra_rounds=3)])
    entries, info = source.next_batch(0)
    assert kept_ids(entries) == ["p0", "p5", "p6", "p9"]
    assert [ids for ids, _ in sampler.calls] == [
        ["p0", "p1", "p2", "p3"],
        ["p4", "p5", "p6", "p7"],
        ["p8", "p9", "p10", "p11"],
    ]
    assert len({seed for _, seed in sampler.calls}) == 3  # each round samples afresh
    assert counts(info) == {"extra_rounds": 2, "groups_filtered": 8, "groups_surplus": 0}
    assert len(entries) == 12  # the dropped groups' rewards still reach the metrics
    entries, info = source.next_batch(1)  # the next batch starts after the last prompt taken
    assert sampler.calls[3][0][0] == "p12"


def test_inline_respects_the_cap_on_extra_rounds():
    source, sampler = inline({0, 5, 6, 9}, [DynamicSampling(extra_rounds=1)])
    entries, info = source.next_batch(0)
    assert len(sampler.calls) == 2  # one extra round, not the third that would fill it
    assert kept_ids(entries) == ["p0", "p5", "p6"]
    assert counts(info) == {"extra_rounds": 1, "groups_filtered": 5, "groups_surplus": 0}


def test_inline_surplus_groups_of_the_last_round_are_not_trained_on():
    source, _ = inline({0, 4, 5, 6, 7}, [DynamicSampling(extra_rounds=3)])
    entries, info = source.next_batch(0)
    assert kept_ids(entries) == ["p0", "p4", "p5", "p6"]
    assert isinstance(entries[-1], DroppedGroup)  # p7: its rewards only
    np.testing.assert_array_equal(entries[-1].rewards, [1.0, 0.0])
    assert counts(info) == {"extra_rounds": 1, "groups_filtered": 3, "groups_surplus": 1}


def test_inline_filter_without_extra_rounds_takes_one_round():
    source, sampler = inline({0}, [ZeroVarianceFilter()])
    entries, info = source.next_batch(0)
    assert len(sampler.calls) == 1 and kept_ids(entries) == ["p0"]
    assert counts(info) == {"extra_rounds": 0, "groups_filtered": 3, "groups_surplus": 0}


# -- remote: a real parameter server, workers played by a thread -------------------------

TREE = {"w": np.zeros((4,), np.float32)}


class HandWorker(threading.Thread):
    """Leases prompts in order and submits scripted groups, with or without its own filter."""

    def __init__(self, settings, informative: set[int], *, filters: bool):
        super().__init__(daemon=True)
        self.client = ParamServerClient(settings, retry_s=0.0)
        self.informative, self.filters = informative, filters
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            for lease_id, prompt in self.client.lease("hand", 16, wait_s=0.1):
                comps = completions(prompt, self.informative)
                rewards = np.array([OkReward().score(prompt, c.text) for c in comps], np.float32)
                filtered = self.filters and int(prompt.id[1:]) not in self.informative
                self.client.submit(Group(prompt, comps, rewards), lease_id, filtered=filtered)

    def close(self):
        self.stop.set()
        self.join(timeout=10)
        self.client.close()


def next_batch_within(source, seconds=30.0):
    """``source.next_batch(0)``, failing (not hanging) if it has not returned in ``seconds``."""
    result = []
    thread = threading.Thread(target=lambda: result.append(source.next_batch(0)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, f"next_batch did not return within {seconds} s (the queue is stuck)"
    return result[0]


@pytest.fixture
def remote(make_ps):
    """(source factory, server): a synchronous server (capacity = one batch of 4 prompts)."""
    made = []

    def make(informative, curation, *, worker_filters=True):
        running = make_ps(capacity=4)
        source = RemoteRollouts(
            ParamServerClient(running.settings, retry_s=0.0),
            WirePlan.for_tree(TREE),
            prompts_per_step=4,
            max_staleness=0,
            curation=curation,
        )
        source.publish(TREE, 0)
        worker = HandWorker(running.settings, set(informative), filters=worker_filters)
        worker.start()
        made.append((source, worker))
        return source, running

    yield make
    for source, worker in made:
        worker.close()
        source.close()


@pytest.mark.parametrize("worker_filters", [True, False], ids=["worker-filters", "trainer-filters"])
def test_remote_refills_a_short_batch_without_exhausting_the_queue(remote, worker_filters):
    source, running = remote(
        {0, 5, 6, 9}, [DynamicSampling(extra_rounds=3)], worker_filters=worker_filters
    )
    # The capacity is one batch: the dropped groups must give their room back for this to end.
    entries, info = next_batch_within(source)
    assert kept_ids(entries) == ["p0", "p5", "p6", "p9"]
    assert len(entries) == 10  # p10 and p11 are not taken: the batch was full at p9
    assert info["extra_rounds"] == 2 and info["groups_filtered"] == 6
    assert info["groups_surplus"] == 0
    q = running.client.stat().queue
    assert (q.consumed, q.taken) == (6, 4)  # the dropped were acknowledged at once
    source.done()
    assert running.client.stat().queue.consumed == 10


def test_remote_respects_the_cap_on_extra_rounds(remote):
    source, running = remote({0, 5, 6, 9}, [DynamicSampling(extra_rounds=1)])
    entries, info = next_batch_within(source)
    assert [e.prompt.id for e in entries if isinstance(e, Group)] == ["p0", "p5", "p6"]
    assert len(entries) == 8  # two rounds of four
    assert info["extra_rounds"] == 1 and info["groups_filtered"] == 5
    source.done()
    assert running.client.stat().queue.consumed == 8


def test_remote_without_extra_rounds_takes_one_batch(remote):
    source, running = remote({0}, [ZeroVarianceFilter()])
    entries, info = next_batch_within(source)
    assert kept_ids(entries) == ["p0"] and len(entries) == 4
    assert info["extra_rounds"] == 0 and info["groups_filtered"] == 3
    assert running.client.stat().queue.consumed == 0  # one take, acknowledged after training
    source.done()
    assert running.client.stat().queue.consumed == 4


class _RestartedServer:
    """A parameter server's client, scripted: it loses its weights (a restart with
    ``saved_weights = 0``) and hands out a (dropped) group only while it serves ``need``."""

    def __init__(self, need: int):
        self.version, self.need, self.pushed, self.acked = -1, need, [], []

    def push(self, plan, tree, version, probe=None):
        self.pushed.append(version)
        self.version = version
        return type("Reply", (), {"committed": True})()

    def stat(self):
        return type("Stat", (), {"version": self.version})()

    def take(self, n, **kwargs):
        return "t", ([np.zeros(2, np.float32)] if self.version >= self.need else []), 0

    def ack(self, take_id):
        self.acked.append(take_id)


def test_remote_publishes_again_when_the_server_came_back_without_its_weights(capsys):
    tree = {"w": np.ones((4, 4), np.float32)}
    server = _RestartedServer(need=5)
    source = RemoteRollouts(server, WirePlan.for_tree(tree), prompts_per_step=1, max_staleness=0)
    source.publish(tree, 5)
    assert source._take_round(5, 1) and server.pushed == [5]  # served: nothing again
    server.version = -1  # restarted, nothing saved
    assert len(source._take_round(5, 1)) == 1
    assert server.pushed == [5, 5]  # the empty take found it behind; version 5 went again
    assert "restarted without weights (serving -1); version 5 published again" in (
        capsys.readouterr().out
    )
    fresh = RemoteRollouts(
        _RestartedServer(need=-1), WirePlan.for_tree(tree), prompts_per_step=1, max_staleness=0
    )
    fresh._republish_if_lost()  # nothing published yet: nothing to publish again
    assert fresh.client.pushed == []
