"""Whole runs of the command line as the tests start them (imported by tests as ``cli_runs``)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUICKSTART_BASE = ROOT / "assets" / "quickstart-base"
CLUSTER_STEPS = 12


def rlax_process(
    *args: str, cwd: pathlib.Path = ROOT, env: dict[str, str] | None = None, timeout: float = 600
):
    """``python -m rlax.core.cli ARGS`` as a process, with no parameter-server address or
    token of the caller's (only those in ``env``, which is added to this environment); its
    CompletedProcess (text)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RLAX_PS_")}, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rlax.core.cli", *args], check=False, cwd=cwd, env=env,
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def quickstart_cluster(steps: int, *extra: str) -> list[str]:
    """``run`` arguments: the quickstart's processes (--role all) from its base policy,
    ``steps`` steps, held-out evaluation on 24 problems."""
    return ["run", "--gin", str(ROOT / "configs" / "quickstart.gin"),
            f"--gin.INIT_CHECKPOINT='{QUICKSTART_BASE}'", f"--gin.rlax.train.steps={steps}",
            "--gin.tasks.arithmetic.num_eval=24", "--gin.rlax.train.progress=False",
            *extra]  # fmt: skip
