"""The weight-load check (issue 53 item 2): a worker refuses a version whose probe its
loaded weights do not reproduce, against a real parameter server."""

from __future__ import annotations

import logging
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlax.core.models.bundle import load_model
from rlax.core.models.transformer import causal_mask, positions_from_mask
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.codec import probe_of, set_probe, tensor_list
from rlax.core.rollout import probe as probes
from rlax.core.trainer.queue_metrics import QueueMetrics
from rlax.core.types import Group
from rlax.core.wire import WirePlan
from rlax.core.worker import role
from rlax.core.worker.role import Worker
from rlax.core.worker.spec import WorkerSpec
from rlax.plugins.rewards.arithmetic import ArithmeticReward
from rlax.plugins.samplers.jax_sampler import JaxSampler

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bundle():
    return load_model(ROOT / "assets" / "quickstart-base")


# -- the comparison, by hand ------------------------------------------------------------


def test_compare_accepts_up_to_the_tolerance_and_refuses_past_it():
    want, got = [-1.0, -2.0, -0.5], [-1.01, -2.03, -0.5]  # |diff| = 0.01, 0.03, 0
    ok = probes.compare(want, got, tolerance=0.05)
    assert ok.ok and ok.max_diff == pytest.approx(0.03)
    assert not probes.compare(want, got, tolerance=0.02).ok
    assert probes.compare(want, want, tolerance=1e-9) == probes.ProbeResult(True, 0.0)


def test_compare_refuses_a_length_mismatch_and_a_non_finite_value():
    assert probes.compare([-1.0, -2.0], [-1.0], 1.0) == probes.ProbeResult(False, float("inf"))
    assert not probes.compare([-1.0, -2.0], [-1.0, float("nan")], 1.0).ok
    assert not probes.compare([-1.0, -2.0], [-1.0, -float("inf")], 1.0).ok


def test_the_worker_default_tolerance_is_the_modules():
    assert WorkerSpec().probe_tolerance == probes.DEFAULT_TOLERANCE
    assert WorkerSpec().probe_check


def test_probe_tokens_are_distinct_ids_inside_the_vocabulary():
    ids = probes.probe_tokens(17, 16)
    assert ids.tolist() == [(i * 7919 + 1) % 17 for i in range(16)]
    assert ids.max() < 17 and len(set(probes.probe_tokens(49152).tolist())) == 16


def test_probe_logprobs_are_the_models_next_token_logprobs(bundle):
    graphdef, state = nnx.split(bundle.model)
    tokens = probes.probe_tokens(bundle.model.cfg.vocab_size, 8)
    got = probes.probe_logprobs(graphdef, state, tokens)
    ids = jnp.asarray(tokens)[None]
    mask = jnp.ones_like(ids, dtype=bool)
    logits, _ = bundle.model(ids, positions_from_mask(mask), causal_mask(mask))
    logits = np.asarray(logits, np.float64).reshape(8, -1)
    full = logits - np.log(np.exp(logits).sum(-1, keepdims=True))  # log-softmax by hand
    want = full[np.arange(7), tokens[1:]]
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_the_probe_rides_the_header_and_a_pull(ps, bundle):
    state = nnx.state(bundle.model)
    plan = WirePlan.for_tree(state)
    probe = probes.Probe((1, 2, 3), (-0.5, -1.25))
    header = set_probe(pb.PartHeader(version=3), probe)
    assert probe_of(pb.PartHeader.FromString(header.SerializeToString())) == probe
    assert probe_of(pb.PartHeader(version=3)) is None
    ps.client.push(plan, state, 0, probe)
    version, tensors, _ = ps.client.pull(-1)
    assert (version, tensors.probe) == (0, probe)
    ps.client.push(plan, state, 1)  # a publisher without a probe: nothing to check
    assert ps.client.pull(0)[1].probe is None
    assert tensor_list(pb.PartHeader()).probe is None


# -- the worker ---------------------------------------------------------------------------


def make_worker(client, bundle, tolerance=probes.DEFAULT_TOLERANCE):
    sampler = JaxSampler(max_new_tokens=4)
    sampler.setup(bundle.model, bundle.tokenizer)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: bundle.model))
    return Worker(
        client,
        sampler,
        ArithmeticReward(),
        [],
        group_size=4,
        prompts_per_lease=3,
        reload_staleness=0,
        worker_id="w0",
        seed=0,
        probe=probes.ProbeCheck(graphdef, abstract, tolerance),
    )


def moved(state, scale=0.05, seed=1):
    """Another version's weights: every float leaf moved by noise."""
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    out = [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return jax.tree.unflatten(treedef, out)


def publish(client, plan, graphdef, params, version, probe_params=None, wire="float32"):
    """A trainer's publish: ``params``' bytes with the probe of ``probe_params`` (default:
    the same params, as an honest trainer sends)."""
    make = probes.trainer_probe(graphdef, wire)
    client.push(plan, params, version, make(params if probe_params is None else probe_params))


def versions_taken(client, version):
    _, entries, _ = client.take(9, current_version=version, max_staleness=9, wait_s=0)
    return sorted(
        {c.policy_version for e in entries if isinstance(e, Group) for c in e.completions}
    )


def test_an_honest_version_passes_and_is_sampled(ps, bundle):
    graphdef, state = nnx.split(bundle.model)
    plan = WirePlan.for_tree(state)
    publish(ps.client, plan, graphdef, state, 0)
    worker = make_worker(ps.client, bundle)
    assert worker.run_once(plan) == 3
    assert worker.version == 0 and worker.counts["probe_checks"] == 1
    assert worker.counts["probe_refused"] == 0 and worker.counts["probe_max_diff"] < 1e-5
    assert versions_taken(ps.client, 0) == [0]


def test_bytes_flipped_after_the_checksum_are_refused(ps, bundle, monkeypatch, caplog):
    graphdef, state = nnx.split(bundle.model)
    plan = WirePlan.for_tree(state)
    publish(ps.client, plan, graphdef, state, 0)
    honest = role.unpacked

    def corrupted(plan, tensors, buffer, adapters):  # after the pull's checksums passed
        t = next(t for t in tensors if "embed" in t["name"])
        view = np.frombuffer(buffer, np.uint8, count=t["nbytes"], offset=t["offset"])
        view.setflags(write=True)
        view[3::4] ^= 0x40  # every float32's high byte: the embedding scrambled
        return honest(plan, tensors, buffer, adapters)

    monkeypatch.setattr(role, "unpacked", corrupted)
    worker = make_worker(ps.client, bundle)
    with caplog.at_level(logging.ERROR, logger="rlax.worker"):
        assert worker.run_once(plan) == 0  # refused: nothing sampled, nothing leased
    assert worker.version == -1 and worker.refused_version == 0
    assert worker.counts["probe_refused"] == 1
    assert "weight-load check refused version 0" in caplog.text
    assert ps.client.stat().queue.queued == 0
    assert worker.run_once(plan) == 0 and worker.counts["probe_refused"] == 1  # not pulled again
    monkeypatch.setattr(role, "unpacked", honest)
    publish(ps.client, plan, graphdef, state, 1)  # the next version arrives whole
    assert worker.run_once(plan) == 3 and worker.version == 1
    assert versions_taken(ps.client, 1) == [1]
    # The count reached the server with the lease and is a trainer metric (metrics.jsonl).
    assert QueueMetrics()(ps.client.stat().queue)["probe_refused"] == 1.0


@pytest.mark.parametrize("reuse", [False, True])
def test_another_versions_tensors_under_a_new_number_are_refused(make_ps, bundle, caplog, reuse):
    """A worker whose pull buffer is not the one in use keeps its weights and samples on;
    one that pulled into it has none left: its leases expire, it waits for the next."""
    ps = make_ps(lease_ttl_s=5.0 if reuse else 600.0)
    ps.client.reuse_pull_buffer = reuse
    graphdef, state = nnx.split(bundle.model)
    plan = WirePlan.for_tree(state)
    publish(ps.client, plan, graphdef, state, 0)
    worker = make_worker(ps.client, bundle)
    assert worker.run_once(plan) == 3 and worker.version == 0
    assert versions_taken(ps.client, 0) == [0]
    newer = moved(state)
    publish(ps.client, plan, graphdef, state, 1, probe_params=newer)  # v0's bytes, v1's probe
    with caplog.at_level(logging.ERROR, logger="rlax.worker"):
        assert worker.run_once(plan) == (0 if reuse else 3)  # with the weights it kept
    assert worker.counts["probe_refused"] == 1 and worker.refused_version == 1
    assert worker.version == (-1 if reuse else 0) and worker.counts["probe_max_diff"] > 1.0
    assert "refused version 1" in caplog.text
    assert versions_taken(ps.client, 1) == ([] if reuse else [0])  # none of the refused version
    if reuse:
        assert worker.run_once(plan) == 0  # waits: the refused version is not pulled again
        assert worker.counts["probe_refused"] == 1
        time.sleep(5.2)  # the leases it held expire and go back to the pool
    publish(ps.client, plan, graphdef, newer, 2)
    assert worker.run_once(plan) > 0 and worker.version == 2
    assert versions_taken(ps.client, 2) == [2]


def test_bfloat16_wire_rounding_passes_and_one_update_does_not(ps, bundle):
    """The tolerance admits the wire's rounding (the trainer scores rounded weights) but
    not a version one small update apart."""
    graphdef, state = nnx.split(bundle.model)
    plan = WirePlan.for_tree(state, "bfloat16")
    tokens = probes.probe_tokens(bundle.model.cfg.vocab_size)
    rounded = probes.published_probe(graphdef, state, "bfloat16", tokens)
    check = make_worker(ps.client, bundle).probe
    pulled = plan.unpack(plan.pack(state))  # what a bfloat16 pull gives
    assert check(pulled, rounded).max_diff < 1e-4
    unrounded = probes.published_probe(graphdef, state, "float32", tokens)
    assert check(pulled, unrounded).max_diff > 1e-4  # the rounding itself is visible
    step = probes.published_probe(graphdef, moved(state, 0.01), "bfloat16", tokens)
    assert not check(pulled, step).ok


def test_the_handoff_path_checks_the_offered_probe(ps, bundle, caplog):
    """In one process the weights come device to device; their probe is offered with them
    and checked the same way: a bad one is refused and the version is not pulled instead."""
    from rlax.core.trainer.handoff import DeviceHandoff

    graphdef, state = nnx.split(bundle.model)
    plan = WirePlan.for_tree(state)
    handoff = DeviceHandoff(lambda tree: jax.tree.map(jnp.copy, tree))
    worker = make_worker(ps.client, bundle)
    worker.handoff = handoff
    pulls = []
    pull = ps.client.pull
    ps.client.pull = lambda *a, **k: pulls.append(a) or pull(*a, **k)
    make = probes.trainer_probe(graphdef, "float32")
    handoff.offer(state, 0, make(state))
    publish(ps.client, plan, graphdef, state, 0)
    worker.maybe_reload(plan)
    assert (worker.version, worker.counts["probe_checks"], handoff.taken) == (0, 1, 1)
    handoff.offer(state, 1, make(moved(state)))  # the offered weights are not the probe's
    publish(ps.client, plan, graphdef, state, 1, probe_params=moved(state))
    with caplog.at_level(logging.ERROR, logger="rlax.worker"):
        worker.maybe_reload(plan)
    assert worker.version == 0 and worker.refused_version == 1
    assert worker.counts["probe_refused"] == 1 and "refused version 1" in caplog.text
    worker.maybe_reload(plan)
    assert pulls == [] and handoff.taken == 2  # not asked for again, by either path


def test_the_probe_survives_a_split_store_and_a_multi_host_push(make_ps):
    """Every lane serves the probe: a store split over servers (each run carries it) and a
    version assembled from two hosts' parts (the served header copies it)."""
    from .param_server.test_bulk import _host
    from .param_server.test_sharded import PLAN, TREE, _sharded

    probe = probes.Probe((4, 5, 6), (-0.25, -3.5))
    servers = [make_ps() for _ in range(2)]
    split = _sharded(make_ps, tuple(s.settings.address for s in servers))
    assert split.client.push(PLAN, TREE, 0, probe).committed
    version, tensors, buf = split.client.pull(-1)
    assert (version, tensors.probe) == (0, probe) and bytes(buf) == PLAN.pack(TREE).tobytes()
    one = make_ps()
    for i in (1, 0):  # the last part to arrive commits
        header, pieces = _host(i)
        reply = one.client.push_part(set_probe(header, probe), iter(pieces))
    assert reply.committed and one.client.pull(-1)[1].probe == probe


def test_a_saved_version_is_served_again_with_its_probe(tmp_path, make_ps):
    """A parameter server that restarts from its saved weights serves their probe too, by
    a push (no store) and in place (served from the file)."""
    from rlax.core.param_server.weights.persist import WeightPersister

    tree = {"a": np.arange(12, dtype=np.float32).reshape(3, 4)}
    plan = WirePlan.for_tree(tree)
    probe = probes.Probe((7, 8), (-1.5,))
    first = make_ps()
    persister = WeightPersister(tmp_path, first.settings, store=first.server.weights)
    first.client.push(plan, tree, 4, probe)
    assert persister.save_newest() == 4
    persister.stop()
    pushed, in_place = make_ps(), make_ps()
    assert WeightPersister(tmp_path, pushed.settings).restore() == 4
    assert pushed.client.pull(-1)[1].probe == probe
    restored = WeightPersister(tmp_path, in_place.settings, store=in_place.server.weights)
    assert restored.restore() == 4 and in_place.client.pull(-1)[1].probe == probe
