"""The closed rollout-source interface: each source owns its position, restore and resume.

The inline source continues exactly where a checkpoint left it (the same
prompts and sampler seeds as a source that never stopped); the remote one
rolls the server's queue back and never reuses a served version; a position
recorded by one kind is refused by the other; and the training loop works
with any source that implements the Protocol, without asking which it is.
"""

from __future__ import annotations

import inspect
import itertools
import pathlib
import types

import numpy as np
import pytest

from rlax.core.contracts import RolloutSource
from rlax.core.errors import ConfigError, SourceMismatch
from rlax.core.param_server.client import ParamServerClient
from rlax.core.runtime.preemption import Preemption
from rlax.core.trainer.checkpoint import Restored
from rlax.core.trainer.loop import TrainingRun
from rlax.core.trainer.sources import MADE_WITH, InlineRollouts, RemoteRollouts
from rlax.core.types import Completion, Prompt
from rlax.core.wire import WirePlan
from rlax.plugins.curation.dynamic_sampling import DynamicSampling

TREE = {"w": np.zeros((4,), np.float32)}


def numbered_prompts():
    for i in itertools.count():
        yield Prompt(id=f"p{i}", text=f"{i}=", tokens=np.array([1, 3], np.int32), answer=str(i))


class ScriptedSampler:
    """Two completions per prompt, mixed rewards for the informative prompts; records calls."""

    version = 0

    def __init__(self, informative: set[int]):
        self.informative, self.calls = informative, []

    def generate(self, prompts, n, *, seed):
        self.calls.append(([p.id for p in prompts], seed))
        out = []
        for p in prompts:
            texts = ("ok", "no") if int(p.id[1:]) in self.informative else ("no", "no")
            tokens, logprobs = np.array([5, 2], np.int32), np.array([-0.5, -0.1], np.float32)
            out.append(tuple(Completion(tokens, logprobs, t, "stop", 0) for t in texts))
        return out

    def load_weights(self, params, version):
        self.version = version


class OkReward:
    def score(self, prompt, completion_text):
        return 1.0 if completion_text == "ok" else 0.0


def inline(informative, curation):
    sampler = ScriptedSampler(set(informative))
    source = InlineRollouts(
        numbered_prompts(), sampler, OkReward(), curation, group_size=2, prompts_per_step=4, seed=0
    )
    return source, sampler


def protocol_members(protocol) -> set[str]:
    names = {n for n in vars(protocol) if not n.startswith("_")}
    return names | set(getattr(protocol, "__annotations__", {}))


@pytest.mark.parametrize("source", [InlineRollouts, RemoteRollouts])
def test_both_sources_have_every_member_of_the_protocol(source):
    members = protocol_members(RolloutSource)
    assert {"next_batch", "position", "restore", "resume", "curation"} <= members
    methods = members - {"curation"}
    assert all(callable(getattr(source, m, None)) for m in methods), methods
    for m in methods:  # the same parameters as the Protocol's
        want = list(inspect.signature(getattr(RolloutSource, m)).parameters)
        assert list(inspect.signature(getattr(source, m)).parameters) == want, m


# -- inline: restore continues the prompt stream and the seeds -----------------------------


def test_an_inline_source_restored_from_its_position_continues_as_if_it_never_stopped():
    whole, whole_sampler = inline({0, 5, 6, 9}, [DynamicSampling(extra_rounds=3)])
    whole.next_batch(0)
    position = whole.position()
    assert position == {"drawn": 12, "sampler_step": 3}  # three rounds of four prompts
    second, _ = whole.next_batch(1)

    resumed, resumed_sampler = inline({0, 5, 6, 9}, [DynamicSampling(extra_rounds=3)])
    resumed.restore(position)
    again, _ = resumed.next_batch(1)
    assert resumed_sampler.calls == whole_sampler.calls[3:]  # same prompts, same seeds
    assert resumed_sampler.calls[0][0][0] == "p12"
    assert [getattr(e, "prompt", None) for e in again] == [
        getattr(e, "prompt", None) for e in second
    ]
    assert resumed.position() == whole.position()


def test_a_checkpoint_of_the_earlier_layout_gives_the_same_position():
    # Before the sources kept their own position, the seed counter was under "rng".
    from rlax.core.trainer.loop import saved_position

    earlier = {"data": {"drawn": 12}, "rng": {"seed": 0, "sampler_step": 3}}
    now = {"data": {"drawn": 12, "sampler_step": 3}, "rng": {"seed": 0}}
    assert saved_position(earlier) == saved_position(now) == {"drawn": 12, "sampler_step": 3}
    assert saved_position({"data": {"consumed": 7}, "rng": {"sampler_step": None}}) == {
        "consumed": 7
    }


def test_an_inline_resume_publishes_the_weights_as_the_same_version():
    source, sampler = inline({0}, [])
    assert source.resume(TREE, 7) == 7
    assert sampler.version == 7


# -- the other kind's position is refused --------------------------------------------------


def test_each_source_refuses_the_other_kinds_position(make_ps):
    source, _ = inline({0}, [])
    with pytest.raises(SourceMismatch) as err:
        source.restore({"consumed": 12})
    assert err.value.made_with == MADE_WITH["consumed"]
    remote = RemoteRollouts(
        ParamServerClient(make_ps().settings, retry_s=0.0),
        WirePlan.for_tree(TREE),
        prompts_per_step=4,
        max_staleness=0,
    )
    with pytest.raises(SourceMismatch) as err:
        remote.restore({"drawn": 12, "sampler_step": 3})
    assert err.value.made_with == "--role inline (an in-process sampler)"
    remote.restore({"consumed": 12})  # its own: accepted
    remote.close()


# -- remote: resume rolls the queue back and versions only grow ---------------------------


@pytest.mark.parametrize("served,restored,published", [(-1, 0, 0), (3, 5, 5), (6, 4, 7)])
def test_a_remote_resume_publishes_past_every_served_version(make_ps, served, restored, published):
    running = make_ps()
    plan = WirePlan.for_tree(TREE)
    if served >= 0:
        running.client.push(plan, TREE, served)
    source = RemoteRollouts(
        ParamServerClient(running.settings, retry_s=0.0), plan, prompts_per_step=4, max_staleness=0
    )
    assert source.resume(TREE, restored) == published
    assert running.client.stat().version == published
    source.close()


def test_a_remote_position_is_the_queue_s_consumed_count(make_ps):
    running = make_ps()
    source = RemoteRollouts(
        ParamServerClient(running.settings, retry_s=0.0),
        WirePlan.for_tree(TREE),
        prompts_per_step=4,
        max_staleness=0,
    )
    assert source.position() == {"consumed": 0}
    source.close()


# -- the curation filters' state goes through the source -----------------------------------


class Remembers:
    """A stateful online filter (keeps every group)."""

    def __init__(self):
        self.seen = 0

    def online(self, groups):
        self.seen += len(groups)
        return list(groups)

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.seen = state["seen"]


def test_the_curation_state_round_trips_through_the_source():
    source, _ = inline({0, 1}, [Remembers(), DynamicSampling(extra_rounds=0)])
    source.next_batch(0)
    state = source.curation_state()
    assert state == [{"seen": 4}, None]  # None for the stateless filter
    fresh, _ = inline({0, 1}, [Remembers(), DynamicSampling(extra_rounds=0)])
    fresh.load_curation_state(state)
    assert fresh.curation[0].seen == 4


# -- the loop runs any source, never asking which -------------------------------------------


class ThirdSource:
    """A rollout source of a third kind: records what the loop asks of it."""

    def __init__(self):
        self.curation: list = []
        self.calls: list = []

    def next_batch(self, version):
        raise AssertionError("not called here")

    def publish(self, params, version):
        self.calls.append(("publish", version))
        return {}

    def done(self):
        pass

    def close(self):
        pass

    def position(self):
        return {"cursor": 11}

    def restore(self, position):
        self.calls.append(("restore", position))

    def resume(self, params, version):
        self.calls.append(("resume", version))
        return version + 2  # two versions had been served past the checkpoint

    def curation_state(self):
        return []

    def load_curation_state(self, states):
        self.calls.append(("curation", list(states)))


class Ckpt:
    def __init__(self):
        self.saved: list = []

    def save(self, step, tree, meta):
        self.saved.append((step, meta))
        return 0.0


def run_with(source, tmp_path: pathlib.Path, meta: dict) -> TrainingRun:
    state = types.SimpleNamespace(params=TREE, opt_state=(), critic=None, step=3)
    trainer = types.SimpleNamespace(state=state)
    restored = Restored(step=3, state=None, meta=meta, path=tmp_path / "3")
    return TrainingRun(
        tmp_path, trainer, source, Ckpt(), Preemption([], role="trainer"), restored, False, 0
    )


def test_the_loop_resumes_and_checkpoints_a_third_kind_of_source(tmp_path):
    source = ThirdSource()
    run = run_with(source, tmp_path, {"data": {"cursor": 9}, "curation": [], "version_offset": 1})
    run.resume()
    assert source.calls == [("restore", {"cursor": 9}), ("curation", []), ("resume", 4)]
    assert run.version == 3 + 3  # the restored offset 1, and 2 more skipped by the source
    run.save()
    ((step, meta),) = run.ckpt.saved
    assert (step, meta["data"], meta["version_offset"], meta["version"]) == (
        3,
        {"cursor": 11},
        3,
        6,
    )


def test_a_checkpoint_of_the_other_kind_is_a_config_error_that_names_the_run(tmp_path):
    source, _ = inline({0}, [])
    run = run_with(source, tmp_path, {"data": {"consumed": 64}})
    with pytest.raises(ConfigError) as err:
        run.resume()
    assert str(err.value) == (
        f"{tmp_path}: its checkpoint at step 3 was trained with a parameter server and "
        "workers (--role all, or trainer); resume it the same way"
    )
    assert not (tmp_path / "metrics.jsonl").exists() and source.prompts.drawn == 0
