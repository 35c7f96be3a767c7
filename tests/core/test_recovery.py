"""What a restart costs (issue 38, item 1): the recovery clock's parts, the notice a stopping
process leaves for the supervisor, what the supervisor tells the restarted process, and
the trainer's first row after a restart.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from rlax.core.errors import EXIT_PREEMPTED, Preempted, RunFinished
from rlax.core.launch.local_cluster import _Child
from rlax.core.runtime import recovery
from rlax.core.runtime.preemption import Preemption
from rlax.core.runtime.recovery import PARTS, RecoveryClock, read_rows
from rlax.core.runtime.run_dir import RunDir


class FakeTime:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock_time(monkeypatch):
    fake = FakeTime(0.0)
    monkeypatch.setattr(recovery.time, "time", fake)
    return fake


def test_a_preempted_trainer_s_parts_add_up_to_the_time_since_its_notice(clock_time, tmp_path):
    # Notice at 100; stopped (checkpointed) at 103; exit seen at 103.5; new process at 105.
    said = {"status": EXIT_PREEMPTED, "noticed_at": 100.0, "stopped_at": 103.0}
    said |= {"exited_at": 103.5, "restarts": 2}
    clock = RecoveryClock("trainer", 105.0, said, RunDir(tmp_path))
    for at, part in [(106.25, "imports"), (107.0, "backend"), (109.0, "load"), (109.5, "restore")]:
        clock_time.now = at
        clock.mark(part)
    clock_time.now = 111.0
    clock.mark("weights")
    clock_time.now = 114.0  # the first step's row: 2 s of it waited for rollouts
    row = clock.finish({"refill": 2.0}, redone_steps=0.0, redone_tokens=0.0)

    assert row["cause"] == "preempted" and row["restarts"] == 2
    want = {"stop": 3.0, "exit": 0.5, "restart": 1.5, "imports": 1.25, "backend": 0.75}
    want |= {"load": 2.0, "restore": 0.5, "weights": 1.5, "refill": 2.0, "first_work": 1.0}
    assert {p: row[f"{p}_s"] for p in PARTS} == want
    assert row["total_s"] == 14.0 == sum(want.values())
    assert read_rows(tmp_path) == [json.loads(json.dumps(row))]  # one line in RUN/recovery.jsonl


def test_a_killed_worker_counts_from_its_exit_and_a_refill_never_exceeds_the_interval(
    clock_time, tmp_path
):
    # Killed: no notice, so the clock starts at the exit the supervisor saw (200).
    said = {"status": -9, "exited_at": 200.0, "restarts": 1, "run_dir": str(tmp_path)}
    clock = RecoveryClock("worker-0", 201.0, said)  # the run directory comes from the supervisor
    clock_time.now = 204.0
    clock.mark("imports")
    clock_time.now = 205.0
    row = clock.finish({"refill": 9.0})  # more than the 1 s since the last mark: capped

    assert row["cause"] == "killed" and row["stop_s"] == row["exit_s"] == 0.0
    assert (row["restart_s"], row["imports_s"], row["refill_s"]) == (1.0, 3.0, 1.0)
    assert row["first_work_s"] == 0.0 and row["total_s"] == 5.0
    assert [r["role"] for r in read_rows(tmp_path)] == ["worker-0"]
    assert RecoveryClock("x", 0.0, {"status": 1, "exited_at": 0.0}).cause == "crashed"
    assert RecoveryClock("x", 0.0).cause == "resume" and not RecoveryClock("x", 0.0).is_restart


@pytest.mark.parametrize("notice", [False, True])
def test_moments_out_of_order_across_clocks_still_add_up(clock_time, notice):
    """The process start comes from /proc's 10 ms ticks, the exit from the supervisor's
    clock: a child started within a tick of the exit can read as started before it (a CI
    run: parts summing to 4.6 ms more than the total). Each moment is taken no earlier
    than the one before it, so the parts stay back to back and add up exactly."""
    said = {"status": EXIT_PREEMPTED if notice else -9, "exited_at": 300.0}
    if notice:  # "stopped" written a little before the notice by another clock, too
        said |= {"noticed_at": 298.0, "stopped_at": 297.99}
    clock = RecoveryClock("worker-1", 299.995, said)  # the start read 5 ms before the exit
    clock_time.now = 303.0
    clock.mark("imports")
    row = clock.finish()
    parts = {p: row[f"{p}_s"] for p in PARTS}
    assert all(s >= 0.0 for s in parts.values())
    assert parts["restart"] == 0.0 and parts["imports"] == 3.0  # counted from the exit
    assert (parts["stop"], parts["exit"]) == ((0.0, 2.0) if notice else (0.0, 0.0))
    assert row["total_s"] == sum(parts.values()) == (5.0 if notice else 3.0)


def test_a_stopping_process_tells_the_supervisor_when_its_notice_came(tmp_path, monkeypatch):
    notice = tmp_path / "trainer.notice"
    monkeypatch.setenv(recovery.NOTICE_FILE_ENV, str(notice))
    stop = Preemption([], role="trainer")
    stop.notify("SIGTERM")
    with pytest.raises(Preempted):
        stop.stop_now()
    said = json.loads(notice.read_text())
    assert said["noticed_at"] == stop.noticed_at and said["reason"] == "SIGTERM"
    assert said["noticed_at"] <= said["stopped_at"]

    notice.unlink()  # the run's end (the supervisor's FINISH_SIGNAL) is no preemption
    done = Preemption([], role="trainer")
    done._finish(0, None)
    with pytest.raises(RunFinished):
        done.stop_now()
    assert not notice.exists()


ECHO = (
    "import os, pathlib, sys; pathlib.Path(sys.argv[1]).write_text(os.environ.get(sys.argv[2], ''))"
)


def test_a_restarted_child_hears_how_the_last_one_ended(tmp_path):
    out, reports = tmp_path / "env.txt", tmp_path / "reports"
    reports.mkdir()
    argv = [sys.executable, "-c", ECHO, str(out), recovery.RESTART_ENV, "--run-dir", "RUN"]
    child = _Child("trainer", argv, dict(os.environ), None, reports)
    child.proc.wait()
    assert out.read_text() == ""  # the first start is no restart
    assert child.env[recovery.NOTICE_FILE_ENV] == str(reports / "trainer.notice")

    notice = {"noticed_at": 10.0, "stopped_at": 12.5, "reason": "SIGTERM"}
    (reports / "trainer.notice").write_text(json.dumps(notice))
    child.restarts = 1
    said = child.what_happened(EXIT_PREEMPTED, 13.0)
    child.start(said)
    child.proc.wait()
    assert json.loads(out.read_text()) == {
        "status": EXIT_PREEMPTED,
        "exited_at": 13.0,
        "restarts": 1,
        "run_dir": "RUN",
        **notice,
    }
    assert not (reports / "trainer.notice").exists()  # a later kill is not read as a notice
    assert "noticed_at" not in child.what_happened(-9, 20.0)


def test_a_process_s_start_is_before_now_and_after_boot():
    import time

    started = recovery.process_started_at()
    stat = pathlib.Path("/proc/stat").read_text().splitlines()
    boot = next(int(line.split()[1]) for line in stat if line.startswith("btime "))
    assert boot <= started <= time.time()


def test_rlax_show_lists_the_run_s_restarts_with_their_recovery_times(tmp_path, capsys):
    from rlax.core import cli

    run = RunDir(tmp_path)
    run.operative_config.write_text("")
    run.metrics.write_text(json.dumps({"step": 7, "reward": 0.5}) + "\n")
    zero = {f"{p}_s": 0.0 for p in PARTS}
    rows = [
        {**zero, "role": "trainer", "cause": "preempted", "time": 0.0, "total_s": 14.0}
        | {"stop_s": 6.0, "imports_s": 3.0, "first_work_s": 2.5, "restore_s": 0.01}
        | {"redone_steps": 0.0, "compile_misses": 0},
        {**zero, "role": "worker-1", "cause": "killed", "time": 60.0, "total_s": 9.5}
        | {"imports_s": 3.5, "weights_s": 1.0, "first_work_s": 5.0, "compile_misses": 1},
        {**zero, "role": "trainer", "cause": "killed", "time": 120.0, "total_s": 8.0}
        | {"first_work_s": 8.0, "redone_steps": 3.0},
    ]
    run.recovery.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn')
    assert cli.main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("preemptions and restarts: 3, 31.5 s until useful again in all")
    lines = [line.split("  ", 2)[2] for line in out[at + 1 : at + 4]]  # without the hour
    assert lines == [
        "trainer      preempted useful again after 14.0 s (stop 6.0, imports 3.0, first_work 2.5)",
        (
            "worker-1     killed    useful again after 9.5 s (first_work 5.0, imports 3.5, "
            "weights 1.0); compiled 1"
        ),
        "trainer      killed    useful again after 8.0 s (first_work 8.0); 3 steps redone",
    ]


def test_exit_promptly_keeps_what_a_normal_exit_does_for_the_program(tmp_path):
    # A non-daemon thread still writing, an atexit function, buffered output and a
    # logging handler: all finish before the process ends with the status given.
    program = f"""
import atexit, logging, threading, time
from rlax.core.runtime import recovery
out = {str(tmp_path)!r}
def late():
    time.sleep(0.3)
    open(out + "/thread", "w").write("done")
threading.Thread(target=late).start()
atexit.register(lambda: open(out + "/atexit", "w").write("ran"))
handler = logging.FileHandler(out + "/log", delay=True)
logging.getLogger("t").addHandler(handler)
logging.getLogger("t").warning("logged")
print("buffered", end="")
recovery.exit_promptly(75)
print("never")
"""
    done = subprocess.run(
        [sys.executable, "-c", program], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 75
    assert done.stdout == "buffered"
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "log").read_text() == "logged\n"


def test_a_role_process_exits_with_main_s_status():
    # python -m rlax.core.cli (how the supervisor starts every role) ends through
    # exit_promptly: a usage error still exits 2 with its one-line message.
    done = subprocess.run(
        [sys.executable, "-m", "rlax.core.cli", "run", "--gin", "no_such_config"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "no_such_config: no such gin file" in done.stderr
