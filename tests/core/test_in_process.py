"""Which devices a trainer that hosts the sampler gives each role, the supervisor's word
for it in the environment, and colocated turn-taking (no devices needed: the devices are
stand-ins, placement only picks them)."""

from __future__ import annotations

import threading
import time

import jax
import pytest

from rlax.core.errors import ConfigError
from rlax.core.parallel.in_process_env import (
    ROLE_DEVICES_ENV,
    InProcessRoles,
    read_role_devices,
    role_devices_env,
)
from rlax.core.parallel.placement import Placement, RoleDevices
from rlax.core.trainer.in_process import in_process_placement
from rlax.core.trainer.turns import IdleOptimizerState, Turns, host_memory

DEVICES = [f"d{i}" for i in range(8)]  # what jax.devices() would list
CPU = {"JAX_PLATFORMS": "cpu"}


def placed(placement, env=CPU, inline=False):
    import os

    saved = dict(os.environ)
    os.environ.update(env)  # detect_inventory reads JAX_PLATFORMS from os.environ
    try:
        where = in_process_placement(placement, inline=inline, env=env, devices=DEVICES)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return None if where is None else (where.mode, where.trainer, where.sampler)


def test_one_process_on_a_cpu_host_splits_its_host_devices_by_the_rule():
    # ceil(8 / 2) = 4 to the trainer, the rest to the sampler (placement's rule).
    assert placed(Placement(mode="one_process")) == (
        "one_process",
        tuple(DEVICES[:4]),
        tuple(DEVICES[4:]),
    )


def test_colocated_gives_both_roles_every_device():
    assert placed(Placement(mode="colocated")) == ("colocated", tuple(DEVICES), tuple(DEVICES))


def test_no_sampler_in_the_trainer_by_default_inline_or_unset():
    assert placed(Placement()) is None  # a CPU host's auto: worker processes
    assert placed(Placement(mode="processes")) is None
    assert placed(Placement(mode="one_process"), inline=True) is None
    assert placed(None) is None


def test_the_supervisors_word_wins_and_round_trips():
    roles = RoleDevices("one_process", trainer=(2, 3), sampler=(6, 7))
    env = role_devices_env(roles)
    # The child sees devices 2, 3, 6, 7 only: they are its 0..3.
    assert env == {ROLE_DEVICES_ENV: "one_process:0,1:2,3"}
    assert read_role_devices(env) == InProcessRoles("one_process", (0, 1), (2, 3))
    got = placed(Placement(mode="one_process"), env={**CPU, **env})
    assert got == ("one_process", ("d0", "d1"), ("d2", "d3"))
    assert role_devices_env(RoleDevices("processes", (0,), (1,), ((1,),))) == {}


@pytest.mark.parametrize("value", ["one_process:0,1", "both:0:1", "colocated:a:1"])
def test_a_malformed_word_is_refused_naming_the_variable(value):
    with pytest.raises(ValueError, match=ROLE_DEVICES_ENV):
        read_role_devices({ROLE_DEVICES_ENV: value})


def test_a_device_the_process_does_not_have_is_refused():
    env = {**CPU, ROLE_DEVICES_ENV: "one_process:0,1:8,9"}
    with pytest.raises(ConfigError, match="device 8 is not one of this process's 8 devices"):
        placed(Placement(mode="one_process"), env=env)


def test_a_worker_waits_for_the_trainers_turn_and_a_stop_ends_the_wait():
    turns, order = Turns(), []
    turns.take_trainer()

    def worker():
        assert turns.take_worker(lambda: False)
        order.append("worker")
        turns.release_worker()

    t = threading.Thread(target=worker)
    t.start()
    time.sleep(0.3)
    order.append("trainer done")
    turns.release_trainer()
    t.join(5)
    assert order == ["trainer done", "worker"]  # never both at once
    turns.take_trainer()
    assert turns.take_worker(lambda: True) is False  # stopping: no turn, no hang
    turns.release_trainer()
    turns.release_trainer()  # not held: nothing


def test_on_the_cpu_idle_state_stays_where_it_is():
    # The CPU's device memory is host memory: moving the optimiser state gains nothing.
    assert host_memory(jax.devices()) is None

    class T:
        state = type("S", (), {"opt_state": jax.numpy.ones(3)})()

    idle = IdleOptimizerState(T(), host_memory(jax.devices()))
    before = T.state.opt_state
    idle.park()
    idle.unpark()
    assert T.state.opt_state is before and idle.moves == 0


def test_parked_state_is_in_host_memory_while_the_trainer_waits_and_back_after():
    # What a GPU or TPU does (the CPU backend has the memory kinds too, so the move itself
    # is checked here, though host_memory never asks for it on the CPU).
    opt = {"mu": jax.numpy.arange(4.0), "nu": jax.numpy.ones((2, 2))}

    class T:
        state = type("S", (), {"opt_state": opt})()

    idle = IdleOptimizerState(T(), "pinned_host")
    idle.park()
    kinds = {x.sharding.memory_kind for x in jax.tree.leaves(T.state.opt_state)}
    assert kinds == {"pinned_host"}
    idle.unpark()
    back = T.state.opt_state
    assert {x.sharding.memory_kind for x in jax.tree.leaves(back)} == {"device"}
    assert all(
        x.sharding == y.sharding for x, y in zip(jax.tree.leaves(back), jax.tree.leaves(opt))
    )
    assert [x.tolist() for x in jax.tree.leaves(back)] == [
        [0.0, 1.0, 2.0, 3.0],
        [[1.0, 1.0], [1.0, 1.0]],
    ]
    assert idle.moves == 1


def test_auto_hosts_the_sampler_only_on_the_supervisors_word():
    # A "processes" trainer's environment narrows what it sees; read alone, its one device
    # would look like a one-device host ("colocated") beside the worker processes.
    assert placed(Placement()) is None
    env = {**CPU, ROLE_DEVICES_ENV: "colocated:0,1,2,3,4,5,6,7:0,1,2,3,4,5,6,7"}
    assert placed(Placement(), env=env) == ("colocated", tuple(DEVICES), tuple(DEVICES))


@pytest.mark.parametrize(
    "reload_staleness,expected", [(0, [0, 1, 2, 3]), (1, [0, 0, 2, 2]), (2, [0, 0, 0, 3])]
)
def test_a_handing_worker_reloads_by_the_same_rule_and_pulls_nothing(
    ps, reload_staleness, expected
):
    # test_worker's reload rule, every version also offered: the same versions are loaded
    # (the rule decides; the handoff only replaces the bytes) and none is pulled.
    import pathlib

    from flax import nnx

    from rlax.core.models.bundle import load_model
    from rlax.core.trainer.handoff import DeviceHandoff
    from rlax.core.wire import WirePlan
    from rlax.core.worker.role import Worker
    from rlax.plugins.samplers.jax_sampler import JaxSampler

    bundle = load_model(pathlib.Path(__file__).resolve().parents[2] / "assets" / "quickstart-base")
    state = nnx.state(bundle.model)
    plan = WirePlan.for_tree(state)
    sampler = JaxSampler(max_new_tokens=4)
    sampler.setup(bundle.model, bundle.tokenizer)
    handoff = DeviceHandoff(lambda tree: jax.tree.map(jax.numpy.copy, tree))
    pulls = []
    client = ps.client
    pull = client.pull
    client.pull = lambda *a, **k: pulls.append(a) or pull(*a, **k)
    worker = Worker(
        client,
        sampler,
        None,
        [],
        group_size=4,
        prompts_per_lease=3,
        reload_staleness=reload_staleness,
        worker_id="w0",
        seed=0,
        handoff=handoff,
    )
    seen = []
    for version in range(4):
        handoff.offer(state, version)
        client.push(plan, state, version)
        worker.maybe_reload(plan)
        seen.append(worker.version)
    assert seen == expected
    assert pulls == [] and handoff.taken == len(set(expected))
