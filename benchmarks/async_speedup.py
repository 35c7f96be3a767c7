"""Synchronous vs asynchronous RL on the quickstart: time and learning, same steps.

Runs ``rlax run --gin configs/experiments/quickstart.gin`` twice — ``MAX_STALENESS = 0``
(on-policy: workers wait for each new version) and ``MAX_STALENESS = 2``
(workers run up to two versions ahead) — with the trainer pinned to CPU core
0 and both workers to core 1 in both runs, as if they were separate
machines. The time compared is the RL phase (the sum of the trainer's step
times); start-up and the two evaluations are the same work in both runs.

    python benchmarks/async_speedup.py [--steps 600]

Prints a table, then one JSON line:
``{"sync_s", "async_s", "speedup", "pass8_sync", "pass8_async"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(max_staleness: int, steps: int, tmp: pathlib.Path) -> dict:
    run_dir = tmp / f"staleness-{max_staleness}"
    cmd = [
        sys.executable,
        "-m",
        "rlax.core.cli",
        "run",
        "--gin",
        "configs/experiments/quickstart.gin",
        "--run-dir",
        str(run_dir),
        f"--gin.rlax.train.steps={steps}",
        f"--gin.MAX_STALENESS={max_staleness}",
        "--gin.RELOAD_STALENESS=0",
        "--gin.rlax.placement.trainer_cores=(0,)",
        "--gin.rlax.placement.worker_cores=(1,)",
        "--gin.rlax.train.progress=False",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLAX_PS_")}
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    result = json.loads((run_dir / "eval.json").read_text())
    stale = sum(
        v for r in rows for k, v in r.items() if k.startswith("staleness_") and k != "staleness_0"
    )
    return {
        "rl_s": sum(r["step_s"] for r in rows),
        "wall_s": wall,
        "pass8": result["after"]["pass@8"],
        "pass8_before": result["before"]["pass@8"],
        "dropped": sum(r["dropped_stale"] for r in rows),
        "off_policy_groups": stale,
        "groups": sum(r["groups_kept"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("async_speedup needs two CPU cores to pin the trainer and the workers apart")
    with tempfile.TemporaryDirectory(prefix="rlax-async-") as tmp:
        sync = run(0, args.steps, pathlib.Path(tmp))
        async_ = run(2, args.steps, pathlib.Path(tmp))
    speedup = sync["rl_s"] / async_["rl_s"]
    print(f"\nquickstart, {args.steps} steps, trainer on core 0, 2 workers on core 1")
    print(f"{'':<22}{'RL time':>9}{'wall':>8}{'pass@8':>8}{'off-policy groups':>19}{'dropped':>9}")
    for name, r in (("max_staleness = 0", sync), ("max_staleness = 2", async_)):
        print(
            f"{name:<22}{r['rl_s']:>8.1f}s{r['wall_s']:>7.1f}s{100 * r['pass8']:>7.1f}%"
            f"{r['off_policy_groups']:>13.0f} / {r['groups']:<5}{r['dropped']:>7}"
        )
    print(
        f"speedup of the RL phase: {speedup:.2f}x   (base policy pass@8 {100 * sync['pass8_before']:.1f}%)"
    )
    print(
        json.dumps(
            {
                "sync_s": round(sync["rl_s"], 1),
                "async_s": round(async_["rl_s"], 1),
                "speedup": round(speedup, 3),
                "pass8_sync": round(sync["pass8"], 4),
                "pass8_async": round(async_["pass8"], 4),
            }
        )
    )


if __name__ == "__main__":
    main()
