"""In-flight weights for agent episodes (issue 57 item 5): a worker with
``reload_in_flight`` and ``samplers.agents`` leases a prompt from the parameter
server, its agents' episodes span a weight push, and the group the trainer takes
has turns of both versions, each id tagged with the weights that sampled it."""

from __future__ import annotations

import itertools
import threading

import numpy as np
from agent_endpoint_case import TOK

from rlax.core.param_server.client import ParamServerClient
from rlax.core.types import Completion
from rlax.core.wire import WirePlan
from rlax.core.worker.role import Worker
from rlax.plugins.agents.runner import AgentSampler

TREE = {"w": np.zeros((4,), np.float32)}
PLAN = WirePlan.for_tree(TREE)


class Versioned:
    """Replies "v<version>" (stop id after it) with the version of the weights it holds."""

    temperature, max_new_tokens = 1.0, 16

    def __init__(self):
        self.version = -1
        self.loaded: list[int] = []

    def setup(self, model, tokenizer):
        pass

    def load_weights(self, params, version):
        self.version = version
        self.loaded.append(version)

    def generate(self, prompts, n, *, seed):
        text = f"v{self.version}"
        ids = np.append(TOK.encode(text), TOK.eos_id).astype(np.int32)
        c = Completion(ids, np.full(len(ids), -0.5, np.float32), text, "stop", self.version)
        return [(c,) * n for _ in prompts]


class NoReward:
    def score(self, prompt, text):
        raise AssertionError("agents return their own rewards")


def test_an_agent_episode_spanning_a_weight_load_has_turns_of_both_versions(make_ps):
    running = make_ps()
    running.client.push(PLAN, TREE, 0)
    between = threading.Barrier(2, action=lambda: running.client.push(PLAN, TREE, 1))
    rewards = itertools.count()

    def agent(client, prompt):
        messages = [{"role": "user", "content": prompt.text}]
        first = client.chat.completions.create(model="rlax-policy", messages=messages)
        between.wait(timeout=30)  # both episodes' first turns are sampled; v1 is pushed
        messages += [first.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "user", "content": "again"}]
        second = client.chat.completions.create(model="rlax-policy", messages=messages)
        return float(next(rewards)) if second.choices[0].message.content else -1.0

    inner = Versioned()
    sampler = AgentSampler(sampler=inner, agent=agent, max_turns=4, max_episode_tokens=128)
    sampler.setup(None, TOK)
    client = ParamServerClient(running.client.settings, retry_s=0.0, reuse_pull_buffer=False)
    worker = Worker(
        client,
        sampler,
        NoReward(),
        [],
        group_size=2,
        prompts_per_lease=1,
        reload_staleness=0,
        worker_id="w",
        seed=7,
        reload_in_flight=True,
        refresh_interval_s=0.0,
    )
    try:
        assert worker.run_once(PLAN) == 1
    finally:
        sampler.close()
    assert inner.loaded == [0, 1] and worker.version == 1
    _, groups, dropped = running.client.take(1, current_version=1, max_staleness=1, wait_s=0)
    assert dropped == 0
    ((group,),) = [groups]
    v0 = np.append(TOK.encode("v0"), TOK.eos_id).tolist()
    v1 = np.append(TOK.encode("v1"), TOK.eos_id).tolist()
    for c in group.completions:
        sampled = c.tokens[c.loss_mask == 1]
        assert sampled.tolist() == v0 + v1  # turn 1 by version 0, turn 2 by version 1
        assert c.versions[c.loss_mask == 1].tolist() == [0] * len(v0) + [1] * len(v1)
        assert (c.policy_version, c.newest_version) == (0, 1)
        assert c.episode["turns"] == 2 and c.episode["failed"] == 0
    assert sorted(c.episode["reward"] for c in group.completions) == [0.0, 1.0]
