"""One process, two meshes, whole runs (8 fake CPU devices): the quickstart with
``rlax.placement.mode = 'one_process'`` (the rule's split: trainer 0-3, sampler 4-7) as
``rlax run`` runs it in that placement -- the parameter server and one trainer process,
no worker processes. The trainer is SIGKILLed (or SIGTERMed) while its in-process worker
holds leases and started again on the run directory: the run ends, with the accounting of
``--role all`` (test_chaos_recovery): every prompt drawn from the task in exactly one
place, none consumed twice, each step trained once, the dead worker's leases served
again; and every version the in-process worker used after the restart was handed over
device to device. Colocated on 4 devices (the trainer and the sampler taking turns on
all of them), a run ends with every version handed over."""

from __future__ import annotations

import collections
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from cli_runs import fake_devices
from cluster import ROOT, metrics, small, wait_until
from test_chaos_recovery import drawn, places

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # kills a process on a clock

N = 8  # steps
PER_STEP = 16
ONE_PROCESS = "--gin.rlax.placement.mode='one_process'"


def role(
    run_dir, role_name: str, env: dict, name: str, mode: str = ONE_PROCESS, steps: int = N
) -> subprocess.Popen:
    """``rlax run --role ROLE`` on the run directory, its output in files beside it."""
    cmd = [sys.executable, "-m", "rlax.core.cli", "run", *small(steps, mode)]
    cmd += ["--run-dir", str(run_dir), "--role", role_name]
    out = open(run_dir.parent / f"{name}.out", "w")  # noqa: SIM115 -- the child's
    err = open(run_dir.parent / f"{name}.err", "w")  # noqa: SIM115
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)


def in_process_leases(db) -> list[tuple[str, str]]:
    """(worker, prompt id) of every lease an in-process worker holds."""
    from rlax.core.param_server import rlax_pb2 as pb

    if not db.exists():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT worker, prompt FROM leases WHERE worker LIKE 'in-process-%'")
        return [(w, pb.PromptMsg.FromString(p).id) for w, p in rows]


@pytest.fixture(scope="module", params=["SIGKILL", "SIGTERM"])
def killed_and_resumed(request, tmp_path_factory):
    """The run, its trainer stopped by the signal mid-run and started again."""
    sig = signal.Signals[request.param]
    run_dir = tmp_path_factory.mktemp(f"one_process_{sig.name}") / "run"
    run_dir.mkdir()
    db = run_dir / "param_server" / "queue.sqlite"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLAX_PS_")}
    address = f"127.0.0.1:{_free_port()}"
    env.update(RLAX_PS_ADDRESS=address, RLAX_PS_TOKEN="one-process", JAX_PLATFORMS="cpu")
    server = role(run_dir, "param_server", env, "ps")
    trainer_env = dict(env, XLA_FLAGS=fake_devices(8))
    events: dict = {}
    try:
        first = role(run_dir, "trainer", trainer_env, "trainer1")
        wait_until(lambda: len(metrics(run_dir)) >= 3, what="step 3", proc=first, timeout=400)
        wait_until(lambda: in_process_leases(db), what="in-process leases", proc=first)
        if sig == signal.SIGKILL:
            os.kill(first.pid, signal.SIGSTOP)  # what it holds cannot change before the kill
            time.sleep(0.5)
        events["signal"], events["held"] = sig, in_process_leases(db)
        os.kill(first.pid, sig)
        events["first_code"] = first.wait(120)
        events["rows"] = len(metrics(run_dir))  # the steps it logged before it stopped
        second = role(run_dir, "trainer", trainer_env, "trainer2")
        second.wait(500)
        events["code"] = second.returncode
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    events["out"] = (run_dir.parent / "trainer2.out").read_text()
    events["err"] = (run_dir.parent / "trainer2.err").read_text()
    events["out1"] = (run_dir.parent / "trainer1.out").read_text()
    return run_dir, db, events


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_trainer_hosts_the_sampler_on_its_own_devices(killed_and_resumed):
    _run_dir, _db, events = killed_and_resumed
    for out in (events["out1"], events["out"]):
        assert "one_process: the trainer on devices [0, 1, 2, 3], 1 in-process worker(s) " in out
        assert "sampling on [4, 5, 6, 7]" in out


def test_the_killed_run_resumes_and_ends(killed_and_resumed):
    run_dir, _db, events = killed_and_resumed
    assert events["code"] == 0, events["err"][-4000:]
    (resumed,) = re.findall(r"resumed from \S+: step (\d+)", events["out"])
    assert 0 <= events["rows"] - int(resumed) <= 2  # checkpointing.every = 2 in `small`
    assert [r["step"] for r in metrics(run_dir)] == list(range(1, N + 1))


def test_every_prompt_is_accounted_for_exactly_once(killed_and_resumed):
    _run_dir, db, events = killed_and_resumed
    consumed, counts, others = places(db)
    assert len(consumed) == N * PER_STEP
    everywhere = collections.Counter(consumed + [i for ids in others.values() for i in ids])
    assert everywhere == drawn(counts["cursor"])
    held = [prompt for _, prompt in events["held"]]
    assert held
    if events["signal"] == signal.SIGKILL:  # the dead worker's leases expired
        assert counts["expired_leases"] >= len(held)
    else:  # the notice let it finish and submit its batch: nothing to expire
        assert events["first_code"] == 75  # preempted, checkpointed
    # Either way its prompts were generated again or submitted, and trained on or queued.
    served_again = collections.Counter(consumed) + collections.Counter(others["queued"])
    assert not collections.Counter(held) - served_again


def test_the_resumed_worker_took_its_versions_device_to_device(killed_and_resumed):
    _run_dir, _db, events = killed_and_resumed
    (taken, pulled) = re.findall(
        r"in-process workers: (\d+) versions handed over device to device, (\d+) pulled",
        events["out"],
    )[0]
    # Its first version may be the dead trainer's, served by the server before the new
    # trainer offers any (one pull); every later one came device to device.
    assert int(taken) >= 2 and int(pulled) <= 1


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    """The quickstart, colocated on 4 host devices, run to its end (no kill)."""
    run_dir = tmp_path_factory.mktemp("colocated") / "run"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLAX_PS_")}
    env.update(
        RLAX_PS_ADDRESS=f"127.0.0.1:{_free_port()}", RLAX_PS_TOKEN="colocated", JAX_PLATFORMS="cpu"
    )
    mode = "--gin.rlax.placement.mode='colocated'"
    server = role(run_dir, "param_server", env, "ps", mode, steps=4)
    try:
        trainer = role(run_dir, "trainer", dict(env, XLA_FLAGS=fake_devices(4)), "t", mode, steps=4)
        trainer.wait(500)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    out, err = ((run_dir.parent / f"t.{s}").read_text() for s in ("out", "err"))
    return run_dir, trainer.returncode, out, err


def test_colocated_takes_turns_on_every_device_and_ends(colocated):
    run_dir, code, out, err = colocated
    assert code == 0, err[-4000:]
    assert "colocated: the trainer on devices [0, 1, 2, 3], 1 in-process worker(s) " in out
    assert "sampling on [0, 1, 2, 3]" in out
    assert [r["step"] for r in metrics(run_dir)] == [1, 2, 3, 4]
    (taken, pulled) = re.findall(r"(\d+) versions handed over device to device, (\d+) pulled", out)[
        0
    ]
    assert int(taken) >= 4 and int(pulled) == 0  # a fresh run: every version handed over
