"""The quickstart, measured over seeds: held-out pass@1 / pass@8 before and after RL, and wall time.

Runs exactly the README's first command, ``rlax run --gin quickstart`` (the
packaged config, found by name), ``--runs`` times with ``--gin.SEED=0``,
``1``, ... one after another, each in a subprocess whose working directory is
a fresh temporary directory outside the repository (so it proves the packaged
config and base policy work from anywhere), into a fresh run directory there.
The held-out problems are the same for every seed; the seed changes the
training stream, the initial sampling and the evaluation's samples. Each run's
baseline is its own "before" row: the base policy on the same held-out
problems with the same sampler settings. Wall time covers everything after
installation: interpreter start, JAX compilation, both evaluations, RL. It
is only meaningful on an otherwise idle machine.

    python benchmarks/quickstart.py [--runs N] [--config NAME] [--gin.NAME=VALUE ...]

``--config`` runs another packaged experiment the same way (``moe_quickstart``: the
figure of ``benchmarks/moe.py``'s ``pass8_gain_min_on``).

Prints a table of every run and the minimum gain, then one JSON line::

    {"runs": [{"seed", "pass1_before", "pass1_after", "pass8_before", "pass8_after",
               "pass1_gain", "pass8_gain", "wall_s", "steps"}, ...],
     "min_pass8_gain", "min_pass1_gain", "max_wall_s"}

pass@k values are fractions; gains are in percentage points.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

WALL_LIMIT_S = 300


def _rlax_command() -> list[str]:
    """The ``rlax`` console script beside this interpreter, else the CLI module."""
    script = pathlib.Path(sys.executable).with_name("rlax")
    if script.exists():
        return [str(script)]
    found = shutil.which("rlax")
    return [found] if found else [sys.executable, "-m", "rlax.core.cli"]


def run_once(seed: int, extra: list[str], config: str = "quickstart") -> dict:
    """One run of the packaged ``config`` with ``SEED = seed``; returns its figures (raises on
    failure)."""
    with tempfile.TemporaryDirectory(prefix="rlax-quickstart-") as tmp:
        run_dir = pathlib.Path(tmp) / "run"
        cmd = [
            *_rlax_command(),
            "run",
            "--gin",
            config,
            "--run-dir",
            str(run_dir),
            f"--gin.SEED={seed}",
            *extra,
        ]
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        start = time.perf_counter()
        proc = subprocess.run(cmd, check=False, cwd=tmp, env=env)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"seed {seed}: quickstart failed with exit status {proc.returncode}")
        results = json.loads((run_dir / "eval.json").read_text())
        with (run_dir / "metrics.jsonl").open() as lines:
            steps = sum(1 for _ in lines)
    return {"seed": seed, **pass_figures(results), "wall_s": round(wall, 1), "steps": steps}


def pass_figures(results: dict) -> dict:
    """pass@1 / pass@8 before and after (fractions) and their gains (points) of a run's
    ``eval.json``."""
    before, after = results["before"], results["after"]
    return {
        "pass1_before": round(before["pass@1"], 4),
        "pass1_after": round(after["pass@1"], 4),
        "pass8_before": round(before["pass@8"], 4),
        "pass8_after": round(after["pass@8"], 4),
        "pass1_gain": round(100 * (after["pass@1"] - before["pass@1"]), 1),
        "pass8_gain": round(100 * (after["pass@8"] - before["pass@8"]), 1),
    }


def format_table(runs: list[dict]) -> str:
    head = (
        f"{'seed':>4}  {'pass@1 before':>13} {'after':>6} {'change':>7}   "
        f"{'pass@8 before':>13} {'after':>6} {'change':>7}   {'wall s':>6} {'steps':>5}"
    )
    rows = [head]
    for r in runs:
        rows.append(
            f"{r['seed']:>4}  {100 * r['pass1_before']:>12.1f}% {100 * r['pass1_after']:>5.1f}% "
            f"{r['pass1_gain']:>+7.1f}   {100 * r['pass8_before']:>12.1f}% "
            f"{100 * r['pass8_after']:>5.1f}% {r['pass8_gain']:>+7.1f}   "
            f"{r['wall_s']:>6.1f} {r['steps']:>5}"
        )
    rows.append(
        f"{'min':>4}  {'':>20} {min(r['pass1_gain'] for r in runs):>+7.1f}   {'':>20} "
        f"{min(r['pass8_gain'] for r in runs):>+7.1f}   {max(r['wall_s'] for r in runs):>6.1f}"
        f"  (max; limit {WALL_LIMIT_S} s)"
    )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="how many seeds (0, 1, ...)")
    parser.add_argument(
        "--config", default="quickstart", help="a packaged experiment (e.g. moe_quickstart)"
    )
    args, extra = parser.parse_known_args()
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    bad = [a for a in extra if not a.startswith("--gin.")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (only --gin.NAME=VALUE passes on)")
    runs = []
    for seed in range(args.runs):
        try:
            runs.append(run_once(seed, extra, args.config))
        except RuntimeError as err:
            print(err, file=sys.stderr)
            return 1
    print(f"\n{args.config} benchmark: held-out problems, unbiased pass@k, gains in points")
    print(format_table(runs))
    print(
        json.dumps(
            {
                "runs": runs,
                "min_pass8_gain": min(r["pass8_gain"] for r in runs),
                "min_pass1_gain": min(r["pass1_gain"] for r in runs),
                "max_wall_s": max(r["wall_s"] for r in runs),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
