"""RolloutQueue over real gRPC: leases, expiry, staleness, backpressure, idempotency, auth."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from rlax.core.param_server.client import ParamServerClient
from rlax.core.types import Completion, DroppedGroup, Group
from rlax.core.wire import WirePlan

TREE = {"w": np.zeros((4,), np.float32)}


def group_for(prompt, version=0, n=2, rewards=(1.0, 0.0)):
    comps = tuple(
        Completion(
            np.array([5, 2], np.int32), np.array([-0.5, -0.1], np.float32), "x", "stop", version
        )
        for _ in range(n)
    )
    return Group(prompt, comps, np.asarray(rewards[:n], np.float32))


def publish(client, version):
    client.push(WirePlan.for_tree(TREE), TREE, version)


def test_lease_submit_take_ack_accounts_for_every_prompt(ps):
    publish(ps.client, 0)
    leases = ps.client.lease("w", 3, wait_s=0)
    assert [p.id for _, p in leases] == ["p0", "p1", "p2"]
    for lease_id, prompt in leases:
        assert ps.client.submit(group_for(prompt), lease_id) is False
    take_id, groups, dropped = ps.client.take(3, current_version=0, max_staleness=0, wait_s=0)
    assert [g.prompt.id for g in groups] == ["p0", "p1", "p2"] and dropped == 0
    np.testing.assert_array_equal(groups[0].completions[0].tokens, [5, 2])
    assert ps.client.ack(take_id) == 3
    q = ps.client.stat().queue
    assert (q.consumed, q.leased, q.queued, q.taken, q.pool, q.cursor) == (3, 0, 0, 0, 0, 3)


def test_retried_submit_and_ack_change_nothing(ps):
    publish(ps.client, 0)
    ((lease_id, prompt),) = ps.client.lease("w", 1, wait_s=0)
    assert ps.client.submit(group_for(prompt), lease_id) is False
    assert ps.client.submit(group_for(prompt), lease_id) is True  # duplicate
    take_id, groups, _ = ps.client.take(5, current_version=0, max_staleness=0, wait_s=0)
    assert len(groups) == 1
    assert ps.client.ack(take_id) == 1
    assert ps.client.ack(take_id) == 0  # duplicate: nothing consumed twice
    assert ps.client.stat().queue.consumed == 1


def test_expired_lease_is_handed_out_again_and_its_late_submit_refused(make_ps):
    running = make_ps(lease_ttl_s=0.3)
    publish(running.client, 0)
    ((old_lease, prompt),) = running.client.lease("dead-worker", 1, wait_s=0)
    time.sleep(0.5)
    ((new_lease, again),) = running.client.lease("live-worker", 1, wait_s=0)
    assert again.id == prompt.id and new_lease != old_lease
    with pytest.raises(grpc.RpcError) as err:
        running.client.submit(group_for(prompt), old_lease)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert running.client.submit(group_for(again), new_lease) is False
    assert running.client.stat().queue.expired_leases == 1


def test_stale_group_is_dropped_counted_and_its_prompt_served_again(ps):
    publish(ps.client, 0)
    ((lease_id, prompt),) = ps.client.lease("w", 1, wait_s=0)
    ps.client.submit(group_for(prompt, version=0), lease_id)
    publish(ps.client, 1)
    publish(ps.client, 2)
    _, groups, dropped = ps.client.take(1, current_version=2, max_staleness=1, wait_s=0)
    assert groups == [] and dropped == 1
    assert ps.client.stat().queue.dropped_stale == 1
    ((_, again),) = ps.client.lease("w", 1, wait_s=0)
    assert again.id == prompt.id


def test_within_staleness_group_is_kept(ps):
    publish(ps.client, 0)
    ((lease_id, prompt),) = ps.client.lease("w", 1, wait_s=0)
    ps.client.submit(group_for(prompt, version=0), lease_id)
    publish(ps.client, 1)
    _, groups, dropped = ps.client.take(1, current_version=1, max_staleness=1, wait_s=0)
    assert len(groups) == 1 and dropped == 0


def test_backpressure_blocks_leases_until_the_trainer_acks(make_ps):
    running = make_ps(capacity=2)
    c = running.client
    publish(c, 0)
    leases = c.lease("w", 5, wait_s=0)
    assert len(leases) == 2  # capacity, not 5
    start = time.monotonic()
    assert c.lease("w", 1, wait_s=0.4) == []  # waited for room, got none, dropped nothing
    assert time.monotonic() - start >= 0.35
    for lease_id, prompt in leases:
        c.submit(group_for(prompt), lease_id)
    take_id, _, _ = c.take(2, current_version=0, max_staleness=0, wait_s=0)
    assert c.lease("w", 1, wait_s=0) == []  # taken but not acknowledged still holds room
    c.ack(take_id)
    ((_, nxt),) = c.lease("w", 1, wait_s=0)
    assert nxt.id == "p2"
    q = c.stat().queue
    assert q.consumed == 2 and q.cursor == 3


def test_filtered_groups_carry_rewards_only(ps):
    publish(ps.client, 0)
    ((lease_id, prompt),) = ps.client.lease("w", 1, wait_s=0)
    ps.client.submit(group_for(prompt, rewards=(0.0, 0.0)), lease_id, filtered=True)
    _, entries, _ = ps.client.take(1, current_version=0, max_staleness=0, wait_s=0)
    assert isinstance(entries[0], DroppedGroup)
    np.testing.assert_array_equal(entries[0].rewards, [0.0, 0.0])
    assert ps.client.stat().queue.filtered == 1


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda m: m.completions[0].__setattr__("tokens", b"\x01\x02\x03"), "token bytes"),
        (lambda m: m.completions[0].__setattr__("logprobs", b""), "logprob bytes"),
        (lambda m: m.rewards.append(1.0), "rewards for"),
        (lambda m: m.rewards.__setitem__(0, float("nan")), "non-finite"),
        (lambda m: m.completions[0].__setattr__("policy_version", 7), "policy version"),
        (lambda m: m.prompt.__setattr__("id", "someone-else"), "not 'someone-else'"),
    ],
)
def test_malformed_groups_are_rejected_and_the_lease_kept(ps, mutate, match):
    from rlax.core.param_server import codec
    from rlax.core.param_server import rlax_pb2 as pb

    publish(ps.client, 0)
    ((lease_id, prompt),) = ps.client.lease("w", 1, wait_s=0)
    msg = codec.group_to_msg(group_for(prompt), lease_id)
    mutate(msg)
    with pytest.raises(grpc.RpcError) as err:
        ps.client._call("Submit", pb.SubmitRequest(group=msg))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert match in err.value.details()
    q = ps.client.stat().queue
    assert (q.leased, q.queued) == (1, 0)
    assert ps.client.submit(group_for(prompt), lease_id) is False  # the lease is still good


@pytest.mark.parametrize("call", ["Lease", "Submit", "Take", "Ack"])
def test_queue_mutations_need_the_token(ps, call):
    from rlax.core.param_server import rlax_pb2 as pb

    requests = {
        "Lease": pb.LeaseRequest(worker="w", max_prompts=1),
        "Submit": pb.SubmitRequest(),
        "Take": pb.TakeRequest(max_groups=1),
        "Ack": pb.AckRequest(take_id="x"),
    }
    with pytest.raises(grpc.RpcError) as err:
        ps.client._calls[call](
            requests[call], metadata=(("authorization", "Bearer nope"),), timeout=5
        )
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ps.client.stat().queue.cursor == 0


def test_tls_with_a_self_signed_certificate(tmp_path, make_ps):
    import dataclasses
    import shutil
    import subprocess

    from rlax.core.param_server.settings import ServerSettings

    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            key,
            "-out",
            cert,
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    settings = ServerSettings(
        address="127.0.0.1:0", token="t", tls_cert=str(cert), tls_key=str(key)
    )
    running = make_ps(settings=settings)
    publish(running.client, 0)
    assert running.client.stat().version == 0
    plain = ParamServerClient(dataclasses.replace(running.settings, tls_cert=None), retry_s=0)
    with pytest.raises(grpc.RpcError):
        plain.stat()
    plain.close()


def test_a_curriculum_on_the_server_retires_prompts_every_worker_solved():
    import itertools

    from rlax.core.param_server import codec
    from rlax.core.param_server import rlax_pb2 as pb
    from rlax.core.param_server.queue.service import RolloutQueue
    from rlax.core.types import Prompt
    from rlax.plugins.curation.pass_rate import PassRateCurriculum

    prompts = [Prompt(f"r{i}", "", np.array([1], np.int32), "") for i in range(3)]
    curriculum = PassRateCurriculum(window=2)
    queue = RolloutQueue(
        itertools.cycle(prompts), capacity=3, lease_ttl_s=60, curricula=[curriculum]
    )

    def round_trip(solved_ids):
        reply = queue.lease(pb.LeaseRequest(worker="w", max_prompts=3))
        ids = [lease.prompt.id for lease in reply.leases]
        for lease in reply.leases:
            p = codec.msg_to_prompt(lease.prompt)
            rewards = (1.0, 1.0) if p.id in solved_ids else (1.0, 0.0)
            group = codec.group_to_msg(
                group_for(p, rewards=rewards), lease.lease_id, filtered=p.id in solved_ids
            )
            queue.submit(
                pb.SubmitRequest(group=group)
            )  # filtered groups still report their rewards
        take = queue.take(pb.TakeRequest(max_groups=3, current_version=0, max_staleness=0))
        queue.ack(pb.AckRequest(take_id=take.take_id))
        return ids

    assert round_trip({"r0"}) == ["r0", "r1", "r2"]
    assert round_trip({"r0"}) == ["r0", "r1", "r2"]  # second solved attempt: r0 retires
    assert curriculum.retired == {"r0"}
    assert round_trip(set()) == ["r1", "r2", "r1"]
    assert queue.stats().retired_skipped == 2  # r0 came round twice and was passed over


def test_worker_reports_are_summed_over_workers_each_its_latest(ps):
    c = ps.client
    c.lease("w1", 1, wait_s=0, idle_s=1.0, busy_s=2.0, generate_s=1.5, score_s=0.25)
    c.lease("w2", 1, wait_s=0, idle_s=0.5, busy_s=1.0, generate_s=0.75, score_s=0.5)
    c.lease("w1", 1, wait_s=0, idle_s=1.0, busy_s=4.0, generate_s=3.0, score_s=1.0)  # w1 again
    q = c.stat().queue
    assert (q.worker_idle_s, q.worker_busy_s) == (1.5, 5.0)
    assert (q.worker_generate_s, q.worker_score_s) == (3.75, 1.5)
