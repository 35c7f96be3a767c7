"""Whole runs of the command line as the tests start them (imported by tests as ``cli_runs``)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUICKSTART_BASE = ROOT / "assets" / "quickstart-base"
CLUSTER_STEPS = 12
# The sizes every whole quickstart run of the suite shares (the local cluster, bad input,
# the preemption tests), so that what one run compiles -- a worker's sampler over a
# lease of 8 prompts x 8, the evaluation's over 16 problems x 2, the train step over 16
# groups of 8 -- the next takes from JAX's persistent cache instead of compiling again.
# (The quickstart's own sizes, 32 prompts in leases of 16 and 24 problems x 16 samples,
# cost a cold run 88 CPU-s against these sizes' 63.)
SMALL_SIZES = (
    "--gin.PROMPTS_PER_STEP=16",
    "--gin.rlax.worker.prompts_per_lease=8",
    "--gin.tasks.arithmetic.num_eval=16",
    "--gin.rlax.held_out.samples=2",
    "--gin.rlax.held_out.ks=(1,)",
)
# Scoring in each worker's own process, for runs whose subject is not the reward pool
# (tests/core/test_reward_pool.py's is): the quickstart's one verifier process per worker
# costs a run two more interpreters, 4 of its 36 CPU-s. The installed quickstart
# (test_packaging) keeps them.
IN_PROCESS_REWARDS = "--gin.rlax.worker.reward_workers=0"
# No curves.png, for runs whose tests do not look at it (test_experiment and
# test_observability do): drawing it costs a trainer 1.3-1.7 s of a CPU core at the end of
# every run and at every preemption.
NO_CURVES = "--gin.rlax.watch.curves=False"
# XLA's flags for every process of the suite (tests/conftest.py sets them before JAX is
# imported; children inherit them). LLVM's optimisation level 1 instead of its default 2:
# the suite compiles thousands of small programs and runs each a few times, so compiling
# is most of its time. Level 1 compiles them in two thirds of the time (the train step of
# test_trainer's model: 3.2 s -> 2.1 s) and computes the same numbers (a 30-step inline
# quickstart run: every metric and both evaluations equal to the last bit at levels 1 and
# 2). Level 0 is faster still but changes results (test_logprobs' chunked gradients).
# The installed quickstart (test_packaging) runs at XLA's defaults.
XLA_FLAGS = "--xla_backend_optimization_level=1"


def fake_devices(count: int) -> str:
    """The suite's XLA_FLAGS for a CPU process that sees ``count`` devices."""
    return f"{XLA_FLAGS} --xla_force_host_platform_device_count={count}"


def rlax_process(
    *args: str, cwd: pathlib.Path = ROOT, env: dict[str, str] | None = None, timeout: float = 600
):
    """``python -m rlax.core.cli ARGS`` as a process, with no parameter-server address or
    token of the caller's (only those in ``env``, which is added to this environment); its
    CompletedProcess (text)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RLAX_PS_")}, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rlax.core.cli", *args],
        check=False,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def quickstart_cluster(steps: int, *extra: str) -> list[str]:
    """``run`` arguments: the quickstart's processes (--role all) from its base policy,
    ``steps`` steps, at the suite's shared sizes (:data:`SMALL_SIZES`), scoring in the
    workers (:data:`IN_PROCESS_REWARDS`)."""
    return [
        "run",
        "--gin",
        str(ROOT / "configs/experiments/quickstart.gin"),
        f"--gin.INIT_CHECKPOINT='{QUICKSTART_BASE}'",
        f"--gin.rlax.train.steps={steps}",
        *SMALL_SIZES,
        IN_PROCESS_REWARDS,
        NO_CURVES,
        "--gin.rlax.train.progress=False",
        *extra,
    ]
