"""Partial work on the wire and in the queue: versions per token, SubmitPartial, resume, restart."""

from __future__ import annotations

import itertools

import grpc
import numpy as np
import pytest

from rlax.core.param_server import codec
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.queue.service import RolloutQueue
from rlax.core.param_server.queue.state import QueueError
from rlax.core.param_server.queue.store import QueueDB
from rlax.core.types import PARTIAL, Completion, Group, PartialGroup, Prompt
from rlax.core.wire import WirePlan

TREE = {"w": np.zeros((4,), np.float32)}


def prompts():
    for i in itertools.count():
        yield Prompt(f"p{i}", f"{i}=", np.array([1, 3 + i % 5], np.int32), str(i))


def make(db=None, newest=5):
    return RolloutQueue(prompts(), capacity=4, lease_ttl_s=60.0, version_fn=lambda: newest, db=db)


def row(tokens, versions=None, reason=PARTIAL, version=None):
    tokens = np.asarray(tokens, np.int32)
    versions = None if versions is None else np.asarray(versions, np.int32)
    if version is None:
        version = int(versions.min()) if versions is not None and len(versions) else 0
    logprobs = -np.arange(1, len(tokens) + 1, dtype=np.float32) / 8
    return Completion(tokens, logprobs, "", reason, version, versions)


def partial():
    """Three rows: finished, cut off mid-way (tokens from versions 1 and 2), never started."""
    return PartialGroup(
        (row([7, 8, 2], [1, 1, 1], "stop"), row([4, 5, 6, 9], [1, 1, 2, 2]), row([], None))
    )


def lease(q, n=1):
    return list(q.lease(pb.LeaseRequest(worker="w", max_prompts=n)).leases)


def group_msg(prompt_msg, lease_id, completions):
    g = Group(codec.msg_to_prompt(prompt_msg), tuple(completions), np.zeros(len(completions)))
    return codec.group_to_msg(g, lease_id)


# -- the wire -----------------------------------------------------------------------------------


def test_versions_and_partial_rows_round_trip_bit_equal():
    sent = partial()
    msg = codec.partial_to_msg(sent, "L", "p0")
    got = codec.msgs_to_partial(pb.SubmitPartialRequest.FromString(msg.SerializeToString()).rows)
    assert got is not None and len(got.rows) == 3
    for a, b in zip(sent.rows, got.rows):
        assert a.tokens.tobytes() == b.tokens.tobytes()
        assert a.logprobs.tobytes() == b.logprobs.tobytes()
        assert (a.finish_reason, a.policy_version) == (b.finish_reason, b.policy_version)
        if a.versions is None:
            assert b.versions is None
        else:
            assert b.versions.dtype == np.int32 and a.versions.tobytes() == b.versions.tobytes()
    assert got.rows[1].newest_version == 2 and got.rows[1].policy_version == 1
    assert codec.msgs_to_partial([]) is None


def check(completion, newest=5):
    g = Group(Prompt("p", "", np.array([1], np.int32), ""), (completion,), np.zeros(1))
    codec.check_group(
        codec.group_to_msg(g, "L"), max_completions=4, max_tokens=16, newest_version=newest
    )


@pytest.mark.parametrize(
    "bad,says",
    [
        (row([4, 5, 6], [3, 3], "stop"), "2 versions for 3 tokens"),
        (row([4, 5], [3, 6], "stop"), "token versions 3..6"),  # a token from the future
        (row([4, 5], [3, 4], "stop", version=4), "must be the oldest"),
        (row([4, 5], [3, 4]), "finish reason 'partial'"),  # partial work is not a group
    ],
)
def test_check_group_refuses_bad_versions(bad, says):
    check(row([4, 5], [3, 4], "stop"))  # the well-formed one passes
    with pytest.raises(codec.WireError, match=says):
        check(bad)


# -- the queue ----------------------------------------------------------------------------------


def test_submit_partial_returns_the_prompt_first_with_its_rows_bit_equal():
    q = make()
    first, _second = lease(q, 2)
    assert q.accounting()["leased"] == ["p0", "p1"]
    sent = codec.partial_to_msg(partial(), first.lease_id, "p0")
    assert q.submit_partial(sent).duplicate is False
    acc = q.accounting()
    assert (acc["pool"], acc["leased"], q.partial_ids()) == (["p0"], ["p1"], ["p0"])
    assert q.submit_partial(sent).duplicate is True  # a retry changes nothing
    assert q.accounting() == acc
    (again,) = lease(q)
    assert again.prompt.id == "p0" and again.lease_id != first.lease_id  # the next one leased
    assert [m.SerializeToString() for m in again.partial] == [
        m.SerializeToString() for m in sent.rows
    ]
    acc = q.accounting()
    assert (acc["pool"], sorted(acc["leased"])) == ([], ["p0", "p1"])
    with pytest.raises(QueueError) as err:  # the lease that handed in its work has ended
        q.submit(
            pb.SubmitRequest(group=group_msg(first.prompt, first.lease_id, [row([1], [1], "stop")]))
        )
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "ended with its partial work" in str(err.value)
    counted = [q.counts[k] for k in ("partial_submitted", "partial_resumed", "partial_tokens")]
    assert counted == [1, 1, 7]
    stats = q.stats()
    assert (stats.partial_submitted, stats.partial_resumed, stats.partial_tokens) == (1, 1, 7)


def test_a_finished_group_detaches_the_partial_and_nothing_is_counted_twice():
    q = make()
    (first,) = lease(q)
    q.submit_partial(codec.partial_to_msg(partial(), first.lease_id, "p0"))
    (again,) = lease(q)
    done = [row([7, 8, 2], [1, 1, 1], "stop"), row([4, 5, 6, 9, 3], [1, 1, 2, 2, 3], "stop")]
    q.submit(pb.SubmitRequest(group=group_msg(again.prompt, again.lease_id, done)))
    acc = q.accounting()
    assert (acc["pool"], acc["leased"], acc["queued"], q.partial_ids()) == ([], [], ["p0"], [])
    (nxt,) = lease(q)
    assert nxt.prompt.id == "p1" and not nxt.partial


def test_an_expired_lease_keeps_the_partial_and_a_newer_one_replaces_it():
    q = make()
    (first,) = lease(q)
    q.submit_partial(codec.partial_to_msg(partial(), first.lease_id, "p0"))
    (again,) = lease(q)
    q._leases[again.lease_id].expires = 0  # the worker that continued it died
    (third,) = lease(q)
    assert third.prompt.id == "p0" and len(third.partial) == 3  # still attached
    longer = PartialGroup(partial().rows[:2] + (row([11], [3]),))
    q.submit_partial(codec.partial_to_msg(longer, third.lease_id, "p0"))
    (fourth,) = lease(q)
    assert codec.msgs_to_partial(fourth.partial).rows[2].tokens.tolist() == [11]
    nothing = PartialGroup(tuple(row([], None) for _ in range(3)))
    q.submit_partial(codec.partial_to_msg(nothing, fourth.lease_id, "p0"))
    (fifth,) = lease(q)
    assert codec.msgs_to_partial(fifth.partial).rows[2].tokens.tolist() == [11]  # kept
    assert q.accounting()["leased"] == ["p0"] and q.counts["expired_leases"] == 1


@pytest.mark.parametrize(
    "rows,says",
    [
        ((row([4], [6]),), "newest is 5"),  # a token from the future
        ((row([4, 5], [1]),), "1 versions for 2 tokens"),
        ((row([4], [1], "stop"),), "every row finished"),
        ((row([], None),) * 5, "5 rows"),  # more than the group's max_completions (4)
    ],
)
def test_submit_partial_refusals_touch_nothing(rows, says):
    q = make()
    q.max_completions = 4
    (first,) = lease(q)
    before = q.accounting()
    with pytest.raises(QueueError, match=says) as err:
        q.submit_partial(codec.partial_to_msg(PartialGroup(rows), first.lease_id, "p0"))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert q.accounting() == before and q.partial_ids() == []


def test_partial_work_continues_a_group_of_the_same_size_only():
    q = make()
    (first,) = lease(q)
    q.submit_partial(codec.partial_to_msg(partial(), first.lease_id, "p0"))
    (again,) = lease(q)
    two = PartialGroup(partial().rows[:2])
    with pytest.raises(QueueError, match="2 rows, the group it continues has 3"):
        q.submit_partial(codec.partial_to_msg(two, again.lease_id, "p0"))
    with pytest.raises(QueueError, match="is for prompt 'p0', not 'p9'"):
        q.submit_partial(codec.partial_to_msg(partial(), again.lease_id, "p9"))
    with pytest.raises(QueueError) as err:
        q.submit_partial(codec.partial_to_msg(partial(), "no-such-lease", "p0"))
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_a_restarted_queue_still_hands_the_partial_out_with_its_prompt(tmp_path):
    path = tmp_path / "queue.sqlite"
    q = make(QueueDB(path))
    first, _ = lease(q, 2)
    sent = codec.partial_to_msg(partial(), first.lease_id, "p0")
    q.submit_partial(sent)
    before, counts = q.accounting(), dict(q.counts)
    del q  # killed: nothing flushed on the way out
    again = make(QueueDB(path))
    assert again.accounting() == before and dict(again.counts) == counts
    assert again.submit_partial(sent).duplicate is True  # the retry after the restart
    (resumed,) = lease(again)
    assert resumed.prompt.id == "p0"
    assert [m.SerializeToString() for m in resumed.partial] == [
        m.SerializeToString() for m in sent.rows
    ]


def test_resume_trainer_drops_partial_work_older_than_the_floor(tmp_path):
    q = make(QueueDB(tmp_path / "queue.sqlite"))
    a, b = lease(q, 2)
    q.submit_partial(codec.partial_to_msg(partial(), a.lease_id, "p0"))  # oldest token: 1
    newer = PartialGroup((row([4], [3]), row([5, 6], [3, 4])))
    q.submit_partial(codec.partial_to_msg(newer, b.lease_id, "p1"))  # oldest token: 3
    q.resume_trainer(restored_version=2, new_version=2)
    assert q.partial_ids() == ["p1"] and q.counts["partial_dropped"] == 1
    assert sorted(q.accounting()["pool"]) == ["p0", "p1"]  # both prompts stay in the pool
    by_id = {x.prompt.id: len(x.partial) for x in lease(q, 2)}
    assert by_id == {"p0": 0, "p1": 2}


# -- the staleness rule: a completion is as old as its oldest token ------------------------------


@pytest.mark.parametrize("max_staleness,taken", [(1, 0), (2, 1)])
def test_staleness_judges_a_completion_by_its_oldest_token(max_staleness, taken):
    q = make()
    (x,) = lease(q)
    mixed = row([4, 5, 6, 7], [3, 3, 4, 4], "stop")
    q.submit(pb.SubmitRequest(group=group_msg(x.prompt, x.lease_id, [mixed])))
    reply = q.take(pb.TakeRequest(max_groups=1, current_version=5, max_staleness=max_staleness))
    assert (len(reply.groups), reply.dropped_stale) == (taken, 1 - taken)


def test_a_group_with_a_token_newer_than_the_trainer_is_refused():
    q = make(newest=6)
    (x,) = lease(q)
    ahead = row([4, 5], [5, 6], "stop")  # oldest 5 is fine, newest 6 is the future
    q.submit(pb.SubmitRequest(group=group_msg(x.prompt, x.lease_id, [ahead])))
    reply = q.take(pb.TakeRequest(max_groups=1, current_version=5, max_staleness=3))
    assert (len(reply.groups), reply.dropped_stale) == (0, 1)
    assert q.accounting()["pool"] == ["p0"]


# -- the client over gRPC ---------------------------------------------------------------------


def test_the_client_leases_partials_and_retries_submit_partial_idempotently(ps):
    ps.client.push(WirePlan.for_tree(TREE), TREE, 2)
    leases = ps.client.lease("w", 2, wait_s=0)
    assert [p.id for _, p in leases] == ["p0", "p1"] and leases.partials == {}
    lease_id, prompt = leases[1]
    assert ps.client.submit_partial(lease_id, prompt, partial()) is False
    assert ps.client.submit_partial(lease_id, prompt, partial()) is True
    again = ps.client.lease("w", 1, wait_s=0)
    ((new_id, same),) = again
    assert same.id == "p1" and list(again.partials) == [new_id]
    got = again.partials[new_id]
    assert [r.tokens.tolist() for r in got.rows] == [[7, 8, 2], [4, 5, 6, 9], []]
    assert got.rows[1].versions.tolist() == [1, 1, 2, 2]
    with pytest.raises(grpc.RpcError) as err:
        ps.client.submit(Group(prompt, (row([1], [1], "stop"),), np.zeros(1)), lease_id)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    q = ps.client.stat().queue
    assert (q.partial_submitted, q.partial_resumed, q.partial_tokens, q.leased) == (1, 1, 7, 2)
