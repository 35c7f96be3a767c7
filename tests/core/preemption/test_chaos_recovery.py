"""(b) SIGKILL of the trainer, (c) of a worker mid-generation, (d) of the parameter server —
in one run: each is restarted, the run completes, and every prompt drawn from the task is
in exactly one place, none consumed twice."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import sqlite3
import time

import pytest
from cluster import BASE, children, finish, kill, leases_of, metrics, small, start, wait_until

from rlax.core.param_server import rlax_pb2 as pb
from rlax.core.runtime.recovery import read_rows

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # kills processes on a clock

N = 12
EVERY = 2  # rlax.checkpointing.every in `small`
PER_STEP = 16


def kill_while_leasing(proc, db, worker, tries=20):
    """SIGKILLs ``worker`` at a moment it holds leases: (its pid, the prompts it held).

    It is stopped first, so that nothing it sends changes its leases between their
    reading and the kill (seen leasing, a worker may submit before a plain kill lands:
    under load it then died holding none). Stopped without leases, it goes on and
    the wait starts again."""
    for _ in range(tries):
        wait_until(lambda: leases_of(db, worker), what=f"{worker} leasing", proc=proc)
        pid = children(proc.pid)[worker]
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.5)  # a request it had already sent is answered
        held = leases_of(db, worker)
        if held:
            os.kill(pid, signal.SIGKILL)
            return pid, held
        os.kill(pid, signal.SIGCONT)
    raise AssertionError(f"{worker} was never stopped holding a lease in {tries} tries")


@pytest.fixture(scope="module")
def chaos(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("chaos") / "run"
    db = run_dir / "param_server" / "queue.sqlite"
    proc = start(run_dir, small(N))
    rows = lambda: len(metrics(run_dir))
    events = {}
    # (c) a worker holding leases, i.e. generating, is killed.
    wait_until(lambda: rows() >= 2, what="step 2", proc=proc)
    events["worker"], events["worker_leases"] = kill_while_leasing(proc, db, "worker-1")
    # (d) the parameter server is killed.
    wait_until(lambda: rows() >= 5, what="step 5", proc=proc)
    events["param_server"] = kill(proc, "param_server", signal.SIGKILL)
    # (b) the trainer is killed, after the restarted server has served more steps.
    wait_until(lambda: rows() >= 8, what="step 8", proc=proc)
    events["trainer_rows"] = rows()
    events["trainer"] = kill(proc, "trainer", signal.SIGKILL)
    code, out, err = finish(proc)
    assert code == 0, err[-4000:]
    return run_dir, db, events, out, err


def places(db):
    with sqlite3.connect(db) as conn:
        consumed = [r[0] for r in conn.execute("SELECT prompt_id FROM consumed ORDER BY seq")]
        counts = json.loads(conn.execute("SELECT value FROM meta WHERE key='counts'").fetchone()[0])

        def ids(sql, msg):
            return [
                msg.FromString(r[0]).id if msg is pb.PromptMsg else msg.FromString(r[0]).prompt.id
                for r in conn.execute(sql)
            ]

        return (
            consumed,
            counts,
            {
                "pool": ids("SELECT prompt FROM pool", pb.PromptMsg),
                "leased": ids("SELECT prompt FROM leases", pb.PromptMsg),
                "queued": ids("SELECT grp FROM queued", pb.GroupMsg),
                "taken": ids("SELECT grp FROM taken", pb.GroupMsg),
            },
        )


def drawn(n):
    """The first ``n`` training prompts of the run's task (the task draws with replacement,
    so a problem can come twice: prompts are compared as multisets)."""
    from rlax.core.models.bundle import load_model
    from rlax.plugins.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask(digits=2, operations="+", eval_fraction=0.1, num_eval=16)
    stream = task.prompts("train", tokenizer=load_model(BASE).tokenizer, seed=0)
    return collections.Counter(next(stream).id for _ in range(n))


def test_every_prompt_is_accounted_for_exactly_once(chaos):
    run_dir, db, *_ = chaos
    consumed, counts, others = places(db)
    assert len(consumed) == N * PER_STEP  # the N steps trained on exactly this many
    everywhere = collections.Counter(consumed + [i for ids in others.values() for i in ids])
    # Each prompt drawn from the task is in exactly one place (consumed once, or still
    # waiting): none lost, none duplicated.
    assert everywhere == drawn(counts["cursor"])
    assert [r["step"] for r in metrics(run_dir)] == list(range(1, N + 1))


def test_b_killed_trainer_resumes_from_its_last_checkpoint(chaos):
    _run_dir, _db, events, out, err = chaos
    assert f"trainer (pid {events['trainer']}) died with killed by SIGKILL; restarting it" in err
    (resumed,) = re.findall(r"resumed from \S+: step (\d+)", out)
    redone = events["trainer_rows"] - int(resumed)
    assert 0 <= redone <= EVERY
    # What the lost trainer consumed after its checkpoint went back to the queue.
    assert re.search(r"\d+ consumed and \d+ taken prompts returned to the queue", out)


def test_c_killed_worker_lease_returns_and_is_served_again(chaos):
    _run_dir, db, events, _out, err = chaos
    assert f"worker-1 (pid {events['worker']}) died with killed by SIGKILL; restarting it" in err
    consumed, counts, others = places(db)
    assert counts["expired_leases"] >= len(events["worker_leases"]) > 0
    # Its prompts were served again: generated by a live worker and trained on, or
    # (when they came back late in the run) generated and waiting in the queue at the end.
    served_again = collections.Counter(consumed) + collections.Counter(others["queued"])
    assert not collections.Counter(events["worker_leases"]) - served_again


def test_d_killed_parameter_server_restarts_and_the_others_carry_on(chaos):
    run_dir, _db, events, _out, err = chaos
    ps = events["param_server"]
    assert f"param_server (pid {ps}) died with killed by SIGKILL; restarting it" in err
    # Only the processes that were killed were restarted: trainer and workers reconnected.
    deaths = re.findall(r"rlax: .* died with .*", err)
    assert len(deaths) == 3, "\n".join(deaths) + "\n" + err[-6000:]
    assert (run_dir / "param_server" / "weights").is_dir()


def test_each_restarted_role_records_its_way_back_to_work(chaos):
    # Issue 38: RUN/recovery.jsonl has one line per restart, its parts adding up to the time
    # from the kill (seen by the supervisor) to the role's first useful work after it.
    run_dir, _db, events, out, _err = chaos
    rows = {r["role"]: r for r in read_rows(run_dir)}
    assert set(rows) == {"worker-1", "param_server", "trainer"}
    parts = ("stop", "exit", "restart", "imports", "backend", "load", "restore", "weights")
    for role, row in rows.items():
        assert row["cause"] == "killed" and row["restarts"] == 1, row
        assert row["stop_s"] == row["exit_s"] == 0.0  # no notice: the clock starts at the exit
        total = sum(row[f"{p}_s"] for p in (*parts, "refill", "first_work"))
        assert total == pytest.approx(row["total_s"], abs=1e-3), role
    # The restarted trainer and worker read their predecessors' programs back from the
    # run's cache (a miss, named by its key, is a program of a shape not met before).
    for role in ("trainer", "worker-1"):
        assert rows[role]["compile_hits"] > 0
        assert rows[role]["compile_misses"] == len(rows[role]["compile_missed"])
    # The steps trained after the restored checkpoint were trained again, and said so.
    (resumed,) = re.findall(r"resumed from \S+: step (\d+)", out)
    assert rows["trainer"]["redone_steps"] == events["trainer_rows"] - int(resumed)
    # The trainer's first row after its restart carries the same figures, and only that row.
    with_figures = [r for r in metrics(run_dir) if "recovery/total_s" in r]
    assert [r["step"] for r in with_figures] == [int(resumed) + 1]
    assert with_figures[0]["recovery/total_s"] == pytest.approx(rows["trainer"]["total_s"], 1e-4)
    assert with_figures[0]["recovery/redone_steps"] == rows["trainer"]["redone_steps"]
