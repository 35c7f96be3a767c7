"""Helpers for the preemption tests: start `rlax run` (role all), find and signal its children."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from cli_runs import IN_PROCESS_REWARDS, NO_CURVES, SMALL_SIZES

from rlax.core.trainer.phases import WALL_CLOCK

ROOT = pathlib.Path(__file__).resolve().parents[3]
BASE = ROOT / "assets" / "quickstart-base"
TIMING = {
    "take_wait_s",
    "weight_sync_s",
    "weight_sync_mb_s",
    "worker_idle_fraction",
    "worker_generate_s",
    "worker_score_s",
    "queue_depth",
    *WALL_CLOCK,
}


def small(steps: int, *extra: str) -> list[str]:
    return [
        "--gin",
        str(ROOT / "configs/experiments/quickstart.gin"),
        f"--gin.INIT_CHECKPOINT='{BASE}'",
        f"--gin.rlax.train.steps={steps}",
        *SMALL_SIZES,
        IN_PROCESS_REWARDS,
        "--gin.rlax.train.progress=False",
        NO_CURVES,
        "--gin.rlax.checkpointing.every=2",
        "--gin.rlax.param_server.lease_ttl_s=5.0",
        *extra,
    ]


DETERMINISTIC = (
    "--gin.MAX_STALENESS=0",
    "--gin.rlax.run.deterministic=True",
)


def start(run_dir: pathlib.Path, args: list[str], role: str = "all") -> subprocess.Popen:
    """``rlax run ARGS --run-dir RUN_DIR`` started; its stdout and stderr go to files beside
    the run directory (a pipe nobody reads while the test waits could fill and block it),
    read with :func:`output` at any time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLAX_PS_")}
    cmd = [sys.executable, "-m", "rlax.core.cli", "run", *args, "--run-dir", str(run_dir)]
    if role != "all":
        cmd += ["--role", role]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    logs = tempfile.mkdtemp(prefix=f"{run_dir.name}-output-", dir=run_dir.parent)
    with open(f"{logs}/stdout", "w") as out, open(f"{logs}/stderr", "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
    proc.logs = pathlib.Path(logs)  # type: ignore[attr-defined]
    return proc


def output(proc: subprocess.Popen) -> tuple[str, str]:
    """What ``proc`` (from :func:`start`) has written so far: (stdout, stderr)."""
    logs = proc.logs  # type: ignore[attr-defined]
    return (logs / "stdout").read_text(), (logs / "stderr").read_text()


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    proc.wait(timeout=timeout)
    return proc.returncode, *output(proc)


def children(pid: int) -> dict[str, int]:
    """The supervisor's live children by role name (param_server, trainer, worker-0, ...)."""
    found = {}
    for child in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            argv = pathlib.Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            env = pathlib.Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        role = argv[argv.index(b"--role") + 1].decode()
        if role == "worker":
            role = next(
                e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"RLAX_WORKER_ID=")
            )
        found[role] = int(child)
    return found


def kill(supervisor: subprocess.Popen, role: str, sig: signal.Signals) -> int:
    pid = children(supervisor.pid)[role]
    os.kill(pid, sig)
    return pid


def leases_of(db: pathlib.Path, worker: str) -> list[str]:
    """The ids of the prompts ``worker`` holds leases on, read off the queue's database."""
    import sqlite3

    from rlax.core.param_server import rlax_pb2 as pb

    if not db.exists():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT prompt FROM leases WHERE worker = ?", (worker,))
        return [pb.PromptMsg.FromString(r[0]).id for r in rows]


def metrics(run_dir: pathlib.Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_until(
    condition, timeout: float = 240, what: str = "condition", proc=None, every: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"run ended (status {proc.returncode}) before {what}:\n" + output(proc)[1][-3000:]
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def final_params(run_dir: pathlib.Path) -> dict[str, np.ndarray]:
    from flax import nnx

    from rlax.core.models.bundle import load_model

    state = nnx.to_pure_dict(nnx.state(load_model(run_dir / "checkpoint").model))
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}


def training_metrics(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]
