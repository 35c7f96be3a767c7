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

from rlax.core.trainer.phases import WALL_CLOCK

ROOT = pathlib.Path(__file__).resolve().parents[3]
BASE = ROOT / "assets" / "quickstart-base"
TIMING = {"take_wait_s", "weight_sync_s", "weight_sync_mb_s", "worker_idle_fraction",
          "worker_generate_s", "worker_score_s",
          "queue_depth", *WALL_CLOCK}  # fmt: skip


def small(steps: int, *extra: str) -> list[str]:
    return [
        "--gin", str(ROOT / "configs" / "quickstart.gin"),
        f"--gin.INIT_CHECKPOINT='{BASE}'", f"--gin.rlax.train.steps={steps}",
        "--gin.PROMPTS_PER_STEP=16", "--gin.rlax.worker.prompts_per_lease=8",
        "--gin.tasks.arithmetic.num_eval=16", "--gin.rlax.train.eval_samples=2",
        "--gin.rlax.train.eval_ks=(1,)", "--gin.rlax.train.progress=False",
        "--gin.rlax.train.checkpoint_every=2", "--gin.rlax.param_server.lease_ttl_s=5.0",
        *extra,
    ]  # fmt: skip


# One persistent JAX compilation cache for every process of this test session: each role
# compiles the same programs, and restarted processes compile them again.
JAX_CACHE = tempfile.mkdtemp(prefix="rlax-test-jax-cache-")

DETERMINISTIC = (
    "--gin.MAX_STALENESS=0",
    "--gin.rlax.train.deterministic=True",
    "--gin.rlax.worker.deterministic=True",
)


def start(run_dir: pathlib.Path, args: list[str], role: str = "all") -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLAX_PS_")}
    env.update(
        JAX_COMPILATION_CACHE_DIR=JAX_CACHE,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    cmd = [sys.executable, "-m", "rlax.core.cli", "run", *args, "--run-dir", str(run_dir)]
    if role != "all":
        cmd += ["--role", role]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


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


def metrics(run_dir: pathlib.Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_until(condition, timeout: float = 240, what: str = "condition", proc=None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"run ended (status {proc.returncode}) before {what}:\n"
                                 + proc.stderr.read()[-3000:])  # fmt: skip
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def final_params(run_dir: pathlib.Path) -> dict[str, np.ndarray]:
    from flax import nnx

    from rlax.core.models.bundle import load_model

    state = nnx.to_pure_dict(nnx.state(load_model(run_dir / "checkpoint").model))
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}


def training_metrics(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]
