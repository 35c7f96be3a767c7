"""The rollout queue in SQLite: a queue rebuilt from its database is the queue that stopped."""

from __future__ import annotations

import itertools
import sqlite3

import numpy as np
import pytest

from rlax.core.param_server import codec
from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.param_server.queue.service import RolloutQueue
from rlax.core.param_server.queue.store import QueueDB, QueueDBError, read_consumed_log
from rlax.core.types import Completion, Group, Prompt


def prompts(seed=0):
    for i in itertools.count():
        yield Prompt(f"s{seed}-p{i}", f"{i}=", np.array([1, 3 + i % 5], np.int32), str(i))


def make(path, *, capacity=8, seed=0, **kwargs):
    kwargs.setdefault("version_fn", lambda: 100)  # the newest weight version served
    return RolloutQueue(
        prompts(seed), capacity=capacity, lease_ttl_s=60.0, db=QueueDB(path), **kwargs
    )


def lease(q, n, worker="w"):
    return [
        (x.lease_id, x.prompt)
        for x in q.lease(pb.LeaseRequest(worker=worker, max_prompts=n)).leases
    ]


def submit(q, lease_id, prompt_msg, version=0):
    prompt = codec.msg_to_prompt(prompt_msg)
    comp = Completion(
        np.array([5, 2], np.int32), np.array([-0.5, -0.1], np.float32), "x", "stop", version
    )
    group = Group(prompt, (comp, comp), np.array([1.0, 0.0], np.float32))
    q.submit(pb.SubmitRequest(group=codec.group_to_msg(group, lease_id)))


def take(q, n, version=0):
    reply = q.take(pb.TakeRequest(max_groups=n, current_version=version, max_staleness=0))
    return reply.take_id, [g.prompt.id for g in reply.groups], reply.dropped_stale


def busy_queue(path):
    """Every place holds something: consumed 2, taken 2, queued 1, leased 2, pool 1."""
    q = make(path)
    leases = lease(q, 8)
    for lease_id, msg in leases[:5]:
        submit(q, lease_id, msg)
    t1, ids1, _ = take(q, 2)
    q.ack(pb.AckRequest(take_id=t1))
    t2, ids2, _ = take(q, 2)
    q._leases[leases[7][0]].expires = 0
    with q._cv:
        q._expire()
    return q, leases, ids1, ids2, t2


def test_a_reopened_queue_has_every_prompt_where_it_was(tmp_path):
    db = tmp_path / "queue.sqlite"
    q, _leases, ids1, ids2, _ = busy_queue(db)
    before = q.accounting()
    assert before == {
        "pool": ["s0-p7"],
        "leased": ["s0-p5", "s0-p6"],
        "queued": ["s0-p4"],
        "taken": ids2,
        "consumed": ids1,
    }
    counts = dict(q.counts)
    del q  # as if the process were killed: nothing is flushed on the way out

    again = make(db)
    assert again.accounting() == before
    assert dict(again.counts) == counts
    # The cursor continues: new leases take the returned prompt, then prompts never drawn.
    t, _ids, _ = take(again, 1)
    again.ack(pb.AckRequest(take_id=t))
    got = [m.id for _, m in lease(again, 4)]
    assert got == ["s0-p7", "s0-p8", "s0-p9", "s0-p10"]  # 8 - 2 leased - 2 taken
    assert read_consumed_log(db) == [*ids1, "s0-p4"]


def test_retried_submit_and_ack_are_still_recognised_after_a_restart(tmp_path):
    db = tmp_path / "queue.sqlite"
    q, leases, _, _ids2, t2 = busy_queue(db)
    q.ack(pb.AckRequest(take_id=t2))
    again = make(db)
    assert again.ack(pb.AckRequest(take_id=t2)).duplicate
    lease_id, msg = leases[4]  # submitted before the restart, still queued
    comp = Completion(np.array([5], np.int32), np.array([-0.5], np.float32), "x", "stop", 0)
    group = Group(codec.msg_to_prompt(msg), (comp,), np.array([1.0], np.float32))
    assert again.submit(pb.SubmitRequest(group=codec.group_to_msg(group, lease_id))).duplicate
    # A lease granted before the restart can still be fulfilled.
    submit(again, *leases[5])
    assert again.accounting()["queued"] == ["s0-p4", "s0-p5"]


def test_resume_trainer_returns_what_the_lost_trainer_consumed_after_its_checkpoint(tmp_path):
    db = tmp_path / "queue.sqlite"
    q = make(db, capacity=4)
    consumed_at = {}
    for version in range(3):  # three steps of 2 prompts, taken at versions 0, 1, 2
        for lease_id, msg in lease(q, 2):
            submit(q, lease_id, msg, version=version)
        t, ids, _ = take(q, 2, version=version)
        q.ack(pb.AckRequest(take_id=t))
        consumed_at[version] = ids
    for lease_id, msg in lease(q, 2):
        submit(q, lease_id, msg, version=3)
    _open_take, open_ids, _ = take(q, 1, version=3)
    # The trainer is killed; its newest checkpoint is version 2 (after the second step);
    # it had published version 3, so it now publishes 4.
    back = make(db, capacity=4).resume_trainer(2, 4)
    q = make(db, capacity=4)
    assert back == {"unconsumed": 2, "untaken": 1}
    acc = q.accounting()
    assert acc["consumed"] == consumed_at[0] + consumed_at[1]
    assert acc["pool"] == consumed_at[2] + open_ids  # served again first, in order
    assert acc["taken"] == [] and q.counts["consumed"] == 4
    # The group still queued came from version 3, older than the new floor 4: dropped.
    _, ids, dropped = take(q, 1, version=4)
    assert ids == [] and dropped == 1
    # Everything drawn is in exactly one place.
    acc = q.accounting()
    everywhere = [i for place in acc.values() for i in place]
    assert sorted(everywhere) == sorted(f"s0-p{i}" for i in range(q.counts["cursor"]))
    assert q.resume_trainer(2, 4) == {"unconsumed": 0, "untaken": 0}  # idempotent


def test_release_takes_puts_an_orphaned_take_back_at_the_front(tmp_path):
    q = make(tmp_path / "queue.sqlite")
    for lease_id, msg in lease(q, 3):
        submit(q, lease_id, msg)
    kept, _, _ = take(q, 1)
    _orphan, orphan_ids, _ = take(q, 1)
    assert q.release_takes([kept]) == 1
    q = make(tmp_path / "queue.sqlite")
    assert q.accounting()["queued"] == [*orphan_ids, "s0-p2"]
    assert q.accounting()["taken"] == ["s0-p0"]


def test_a_corrupt_database_is_an_error_naming_it_and_is_left_untouched(tmp_path):
    db = tmp_path / "queue.sqlite"
    q, *_ = busy_queue(db)
    q._db.close()
    raw = bytearray(db.read_bytes())
    raw[:16] = b"not sqlite at al"
    db.write_bytes(bytes(raw))
    with pytest.raises(QueueDBError, match=str(db)) as err:
        QueueDB(db)
    assert "left as it is" in str(err.value)
    assert db.read_bytes() == bytes(raw)


def test_a_database_from_another_task_is_refused(tmp_path):
    db = tmp_path / "queue.sqlite"
    busy_queue(db)
    with pytest.raises(QueueDBError, match="different task or seed"):
        make(db, seed=1)


def test_every_change_is_one_committed_transaction(tmp_path):
    db = tmp_path / "queue.sqlite"
    q = make(db)
    ((lease_id, msg),) = lease(q, 1)
    # Another connection sees the lease at once (committed, WAL), and no open transaction.
    with sqlite3.connect(db) as other:
        assert other.execute("SELECT COUNT(*) FROM leases").fetchone() == (1,)
        assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    submit(q, lease_id, msg)
    with sqlite3.connect(db) as other:
        assert other.execute("SELECT COUNT(*) FROM leases").fetchone() == (0,)
        assert other.execute("SELECT COUNT(*) FROM queued").fetchone() == (1,)


def test_a_call_after_close_is_unavailable_and_changes_nothing(tmp_path):
    """The server stopping with calls still running: none succeeds without being on disk."""
    import grpc

    from rlax.core.param_server.queue.state import QueueError

    db = tmp_path / "queue.sqlite"
    q = make(db)
    for lease_id, msg in lease(q, 2):
        submit(q, lease_id, msg)
    before = q.accounting()
    q.close()
    for call in (lambda: lease(q, 1), lambda: take(q, 1)):
        with pytest.raises(QueueError) as err:
            call()
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert make(db).accounting() == before
