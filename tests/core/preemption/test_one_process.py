"""One process, two meshes, whole runs through ``rlax run`` (8 fake CPU devices): the
quickstart with ``rlax.placement.mode = 'one_process'`` (the rule's split: trainer 0-3,
sampler 4-7): the supervisor starts the parameter server and one trainer process that
hosts the sampler, no worker processes. The trainer is SIGKILLed (or SIGTERMed) while
its in-process worker holds leases; the supervisor starts it again and the run ends with
the accounting of ``--role all`` (test_chaos_recovery): every prompt drawn from the task
in exactly one place, none consumed twice, each step trained once, the stopped worker's
leased prompts served again; every version the restarted worker used came device to
device but perhaps its first. Colocated on 4 devices (the trainer and the sampler taking
turns on all of them), a run ends with every version handed over."""

from __future__ import annotations

import collections
import os
import re
import signal
import sqlite3
import time

import pytest
from cli_runs import fake_devices
from cluster import children, finish, metrics, small, start, wait_until
from test_chaos_recovery import drawn, places

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # kills a process on a clock

N = 8  # steps
PER_STEP = 16
HOSTS = r"(\w+): the trainer on devices \[([\d, ]+)\], 1 in-process worker\(s\) sampling on \[([\d, ]+)\]"
HANDED = r"in-process workers: (\d+) versions handed over device to device, (\d+) pulled"


def mode(name: str) -> str:
    return f"--gin.rlax.placement.mode='{name}'"


def started(run_dir, steps: int, placement: str, devices: int):
    """``rlax run`` (every role) of the small quickstart in ``placement`` on ``devices``
    fake devices."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XLA_FLAGS", fake_devices(devices))
        mp.setenv("JAX_PLATFORMS", "cpu")
        return start(run_dir, small(steps, mode(placement)))


def in_process_leases(db) -> list[tuple[str, str]]:
    """(worker, prompt id) of every lease an in-process worker holds."""
    from rlax.core.param_server import rlax_pb2 as pb

    if not db.exists():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT worker, prompt FROM leases WHERE worker LIKE 'in-process-%'")
        return [(w, pb.PromptMsg.FromString(p).id) for w, p in rows]


def frozen_with_leases(pid: int, db, proc, timeout: float = 120.0) -> list[tuple[str, str]]:
    """Stop ``pid`` (SIGSTOP) at a moment its in-process worker holds leases and return
    them: read while it is frozen, so no lease is submitted between the read and the
    signal that follows. Until then it is let run again and tried anew."""
    deadline = time.monotonic() + timeout
    while True:
        wait_until(lambda: in_process_leases(db), what="in-process leases", proc=proc)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.5)  # the stop has taken effect; a write in progress has landed
        held = in_process_leases(db)
        if held:
            return held
        os.kill(pid, signal.SIGCONT)
        assert time.monotonic() < deadline, "the in-process worker never held a lease"


@pytest.fixture(scope="module", params=["SIGKILL", "SIGTERM"])
def stopped_and_resumed(request, tmp_path_factory):
    """The run, its trainer process stopped by the signal mid-run and restarted."""
    sig = signal.Signals[request.param]
    run_dir = tmp_path_factory.mktemp(f"one_process_{sig.name}") / "run"
    db = run_dir / "param_server" / "queue.sqlite"
    proc = started(run_dir, N, "one_process", 8)
    wait_until(lambda: len(metrics(run_dir)) >= 3, what="step 3", proc=proc, timeout=400)
    pid = children(proc.pid)["trainer"]
    held = frozen_with_leases(pid, db, proc)
    os.kill(pid, sig)  # while frozen: what it holds cannot change before the signal
    if sig != signal.SIGKILL:
        os.kill(pid, signal.SIGCONT)  # the notice is handled once it runs again
    code, out, err = finish(proc, timeout=900)
    return (
        run_dir,
        db,
        {"signal": sig, "pid": pid, "held": held, "code": code, "out": out, "err": err},
    )


def test_the_trainer_hosts_the_sampler_on_its_own_devices(stopped_and_resumed):
    *_, events = stopped_and_resumed
    hosts = re.findall(HOSTS, events["out"])
    assert hosts == [("one_process", "0, 1, 2, 3", "4, 5, 6, 7")] * 2  # before and after
    assert "worker-0" not in events["err"]  # no worker process was started


def test_the_stopped_trainer_is_restarted_and_the_run_ends(stopped_and_resumed):
    run_dir, _db, events = stopped_and_resumed
    assert events["code"] == 0, events["err"][-4000:]
    how = "killed by SIGKILL" if events["signal"] == signal.SIGKILL else "preempted (status 75)"
    assert f"trainer (pid {events['pid']}) died with {how}; restarting it" in events["err"]
    assert len(re.findall(r"resumed from \S+: step (\d+)", events["out"])) == 1
    assert [r["step"] for r in metrics(run_dir)] == list(range(1, N + 1))


def test_every_prompt_is_accounted_for_exactly_once(stopped_and_resumed):
    _run_dir, db, events = stopped_and_resumed
    consumed, counts, others = places(db)
    assert len(consumed) == N * PER_STEP
    everywhere = collections.Counter(consumed + [i for ids in others.values() for i in ids])
    assert everywhere == drawn(counts["cursor"])
    held = [prompt for _, prompt in events["held"]]
    assert held
    if events["signal"] == signal.SIGKILL:  # the dead worker's leases expired
        assert counts["expired_leases"] >= len(held)
    # Its leased prompts were generated again (or submitted), then trained on or queued.
    served_again = collections.Counter(consumed) + collections.Counter(others["queued"])
    assert not collections.Counter(held) - served_again


def test_the_restarted_worker_took_its_versions_device_to_device(stopped_and_resumed):
    *_, events = stopped_and_resumed
    taken, pulled = map(int, re.findall(HANDED, events["out"])[-1])
    # Its first version may be the stopped trainer's, which the server serves before the
    # new trainer offers any (one pull); every later one came device to device.
    assert taken >= 2 and pulled <= 1


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    """The quickstart, colocated on 4 fake devices, run to its end."""
    run_dir = tmp_path_factory.mktemp("colocated") / "run"
    code, out, err = finish(started(run_dir, 4, "colocated", 4), timeout=600)
    return run_dir, code, out, err


def test_colocated_takes_turns_on_every_device_and_ends(colocated):
    run_dir, code, out, err = colocated
    assert code == 0, err[-4000:]
    assert re.findall(HOSTS, out) == [("colocated", "0, 1, 2, 3", "0, 1, 2, 3")]
    assert [r["step"] for r in metrics(run_dir)] == [1, 2, 3, 4]
    taken, pulled = map(int, re.findall(HANDED, out)[-1])
    assert taken >= 4 and pulled == 0  # a fresh run: every version handed over
