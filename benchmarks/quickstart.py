"""The quickstart, measured: held-out pass@1 / pass@8 before and after RL, and wall time.

Runs exactly the README's command (``rlax run --gin configs/quickstart.gin``) in
a subprocess, from the repository root, into a fresh run directory. The
baseline is the same run's "before" row: the base policy evaluated on the same
held-out problems with the same sampler settings. Wall time covers everything
after installation: interpreter start, JAX compilation, both evaluations, RL.

    python benchmarks/quickstart.py [--gin.NAME=VALUE ...]

Prints a table, then one JSON line:
``{"pass1_before", "pass1_after", "pass8_before", "pass8_after", "wall_s", "steps"}``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> int:
    extra = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="rlax-quickstart-") as tmp:
        run_dir = pathlib.Path(tmp) / "run"
        cmd = [sys.executable, "-m", "rlax.core.cli", "run", "--gin", "configs/quickstart.gin",
               "--run-dir", str(run_dir), *extra]  # fmt: skip
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        start = time.perf_counter()
        proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            print(f"quickstart failed with exit status {proc.returncode}", file=sys.stderr)
            return proc.returncode
        results = json.loads((run_dir / "eval.json").read_text())
        steps = sum(1 for _ in (run_dir / "metrics.jsonl").open())

    before, after = results["before"], results["after"]
    print("\nquickstart benchmark (held-out problems, unbiased pass@k)")
    print(f"{'':<14}{'base policy':>12}{'after RL':>10}{'change':>9}")
    for k in ("pass@1", "pass@8"):
        b, a = 100 * before[k], 100 * after[k]
        print(f"{k:<14}{b:>11.1f}%{a:>9.1f}%{a - b:>+9.1f}")
    print(f"{'wall time':<14}{wall:>11.1f}s   ({steps} RL steps, limit 300 s)")
    figures = {
        "pass1_before": round(before["pass@1"], 4),
        "pass1_after": round(after["pass@1"], 4),
        "pass8_before": round(before["pass@8"], 4),
        "pass8_after": round(after["pass@8"], 4),
        "wall_s": round(wall, 1),
        "steps": steps,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
