"""The worker's reload rule and one lease -> generate -> submit round, against a real server."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from flax import nnx

from rlax.core.models.bundle import load_model
from rlax.core.runtime.preemption import Preemption
from rlax.core.types import Group
from rlax.core.wire import WirePlan
from rlax.core.worker.role import Worker, _serve
from rlax.plugins.curation.zero_variance import ZeroVarianceFilter
from rlax.plugins.rewards.arithmetic import ArithmeticReward
from rlax.plugins.samplers.jax_sampler import JaxSampler


@pytest.fixture(scope="module")
def bundle():
    import pathlib

    return load_model(pathlib.Path(__file__).resolve().parents[2] / "assets" / "quickstart-base")


def make_worker(client, bundle, reload_staleness):
    sampler = JaxSampler(max_new_tokens=4)
    sampler.setup(bundle.model, bundle.tokenizer)
    return Worker(
        client,
        sampler,
        ArithmeticReward(),
        [ZeroVarianceFilter()],
        group_size=4,
        prompts_per_lease=3,
        reload_staleness=reload_staleness,
        worker_id="w0",
        seed=0,
    )


@pytest.mark.parametrize(
    "reload_staleness,expected", [(0, [0, 1, 2, 3]), (1, [0, 0, 2, 2]), (2, [0, 0, 0, 3])]
)
def test_reload_when_more_than_r_versions_behind(ps, bundle, reload_staleness, expected):
    state = nnx.state(bundle.model)
    plan = WirePlan.for_tree(state)
    worker = make_worker(ps.client, bundle, reload_staleness)
    seen = []
    for version in range(4):
        ps.client.push(plan, state, version)
        worker.maybe_reload(plan)
        seen.append(worker.version)
    assert seen == expected  # the first version is always loaded, whatever r is


def test_one_round_submits_every_leased_prompt_tagged_with_its_version(ps, bundle):
    state = nnx.state(bundle.model)
    plan = WirePlan.for_tree(state)
    ps.client.push(plan, state, 0)
    worker = make_worker(ps.client, bundle, 0)
    assert worker.run_once(plan) == 3
    q = ps.client.stat().queue
    assert (q.leased, q.queued) == (0, 3)
    _, entries, _ = ps.client.take(3, current_version=0, max_staleness=0, wait_s=0)
    assert len(entries) == 3
    kept = [e for e in entries if isinstance(e, Group)]
    assert q.filtered == 3 - len(kept)
    for group in kept:
        assert all(c.policy_version == 0 for c in group.completions)
        assert np.ptp(group.rewards) > 0  # the zero-variance filter ran in the worker


def test_a_lease_that_expired_during_generation_is_counted_not_fatal(make_ps, bundle):
    running = make_ps(lease_ttl_s=0.05)
    state = nnx.state(bundle.model)
    plan = WirePlan.for_tree(state)
    running.client.push(plan, state, 0)
    worker = make_worker(running.client, bundle, 0)
    worker.maybe_reload(plan)
    slow = worker.sampler.generate

    def generate_slowly(*args, **kwargs):
        import time

        time.sleep(0.2)  # longer than the lease
        return slow(*args, **kwargs)

    worker.sampler.generate = generate_slowly
    assert worker.run_once(plan) == 3
    assert worker.lost_leases == 3
    q = running.client.stat().queue
    assert (q.queued, q.expired_leases, q.pool) == (0, 3, 3)  # the prompts wait for another worker


def test_a_failing_verifier_scores_zero_and_is_reported_to_the_trainer(ps, bundle):
    from rlax.core.rollout.reward_pool import RewardPool

    class Flaky(ArithmeticReward):
        def score(self, prompt, text):
            if text.startswith("1"):
                raise RuntimeError("verifier crashed")
            return super().score(prompt, text)

    state = nnx.state(bundle.model)
    plan = WirePlan.for_tree(state)
    ps.client.push(plan, state, 0)
    worker = make_worker(ps.client, bundle, 0)
    worker.reward = RewardPool(Flaky(), workers=0)
    worker.curation = []
    worker.run_once(plan)
    _, groups, _ = ps.client.take(3, current_version=0, max_staleness=0, wait_s=0)
    crashed = [c.text.startswith("1") for g in groups for c in g.completions]
    rewards = [r for g in groups for r in g.rewards]
    assert worker.counts["reward_errors"] == sum(crashed) > 0
    assert all(r == 0.0 for r, bad in zip(rewards, crashed) if bad)
    worker.run_once(plan)  # the next lease reports the worker's counts
    assert ps.client.stat().queue.reward_errors >= sum(crashed)


# -- waiting out an unreachable server (the one retry policy, no deadline) ------------------


class Unreachable(grpc.RpcError):
    def __init__(self, code=grpc.StatusCode.UNAVAILABLE):
        self._code = code

    def code(self):
        return self._code


class RoundsThatFail:
    """A worker whose rounds fail with ``code``; records each round."""

    worker_id = "w0"

    def __init__(self, code=grpc.StatusCode.UNAVAILABLE):
        self.rounds, self.code = 0, code

    def run_once(self, plan):
        self.rounds += 1
        raise Unreachable(self.code)


class NoticeAfterWaits(Preemption):
    """A preemption watch whose notice comes during its ``n``-th wait; records the waits."""

    def __init__(self, n: int):
        super().__init__([], role="worker")
        self.n, self.waits = n, []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if len(self.waits) == self.n:
            self.notify("test notice")
        return self.requested


def test_a_worker_waits_out_an_unreachable_server_until_a_notice_without_another_round():
    w, stop = RoundsThatFail(), NoticeAfterWaits(3)
    _serve(w, None, stop)  # returns: a notice, not an error
    assert stop.waits == pytest.approx([0.2, 0.4, 0.8])  # the policy's backoff
    assert w.rounds == 3  # the notice came during the third wait: no fourth round


def test_a_worker_raises_a_status_that_is_not_an_outage():
    w, stop = RoundsThatFail(grpc.StatusCode.PERMISSION_DENIED), NoticeAfterWaits(3)
    with pytest.raises(grpc.RpcError):
        _serve(w, None, stop)
    assert (w.rounds, stop.waits) == (1, [])
