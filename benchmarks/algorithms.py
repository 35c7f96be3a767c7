"""Every algorithm of the suite on the quickstart task, with the same budget.

Runs ``rlax run --role inline --gin configs/experiments/<algorithm>.gin`` (GRPO's
experiment is ``quickstart.gin``) one after another, each in a subprocess from
the quickstart's base policy, with the same number of RL steps, prompts per
step, group size, learning rate, seed and held-out evaluation (200 problems
never trained on, 16 samples each, unbiased pass@k). ``--role inline`` keeps
the sampler in the trainer's process, so the runs measure the algorithms,
not the parameter server. The baseline is each run's own "before" row (the
base policy, same problems and sampler).

``grpo_2x4`` is GRPO with several updates per rollout batch
(``rlax.trainer_settings.epochs = 2``, ``minibatches = 4``: 8 optimiser
updates per batch on minibatches of whole groups, old logprobs fixed for the
batch), reported against ``grpo`` (one update per batch) at the same number of
rollouts: the same steps, prompts and samples, so the same sampling work. It
trains at a quarter of the budget's learning rate (``LEARNING_RATE_SCALE``):
eight updates per batch at the one-update rate over-sharpen the policy.

    python benchmarks/algorithms.py [--steps N] [--prompts N] [--only NAME ...]
                                    [--eval-problems N] [--eval-samples N]
                                    [--gin.NAME=VALUE ...]

Prints a table, then one JSON line: ``{"budget": {...}, "base": {"pass@1",
"pass@8"}, "algorithms": {NAME: {"pass@1", "pass@8", "pass8_gain", "wall_s",
"tokens_per_s", "updates", "learning_rate"}}, "epochs_vs_one_update": {"pass8_gain_delta",
"wall_ratio", "updates_ratio"} (when both GRPO rows ran), "all_improve_pass8": bool}``.
Exit status 1 if a run failed or an algorithm did not improve held-out pass@8.
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

EXPERIMENTS = {
    "grpo": "quickstart.gin",
    "dapo": "dapo.gin",
    "drgrpo": "drgrpo.gin",
    "gspo": "gspo.gin",
    "cispo": "cispo.gin",
    "rloo": "rloo.gin",
    "reinforcepp": "reinforcepp.gin",
    "reinforcepp_baseline": "reinforcepp_baseline.gin",
    "ppo": "ppo.gin",
    "grpo_2x4": "quickstart.gin",
}
# Extra gin bindings of a row (beside the budget's).
SETTINGS = {
    "grpo_2x4": [
        "--gin.rlax.train.trainer_settings=@rlax.trainer_settings()",
        "--gin.rlax.trainer_settings.epochs=2",
        "--gin.rlax.trainer_settings.minibatches=4",
    ],
}
# A row's learning rate as a fraction of the budget's. 8 Adam updates per batch at the one-update
# rate collapse the policy: at 2e-4, 260 steps x 64 prompts, grpo_2x4 ended at held-out pass@8
# 46.1% (-14.9 points) while grpo gained +5.4. A quarter of it (5e-5) gained +10.2, an eighth
# (2.5e-5) +6.0 (seed 0, one run each).
LEARNING_RATE_SCALE = {"grpo_2x4": 0.25}
# Held-out pass@8 first dips while RL sharpens the policy, then rises with pass@1; the budget
# must pass the dip for every algorithm. Measured here (two shared CPU cores): at 64 prompts x
# 160 steps GRPO, GSPO, DAPO, PPO, REINFORCE++ and Dr.GRPO were above the base policy's pass@8
# and CISPO, RLOO and REINFORCE++-baseline still below it; at 260 steps those three were above
# it too. About 3 minutes per algorithm on a loaded machine. A later full run at 260 steps, with
# DAPO refilling its batches (dynamic sampling: one extra round per step, so about twice the
# sampling): all nine above the base's 61.0%, from DAPO +15.9 and REINFORCE++ +10.4 points
# down to REINFORCE++-baseline +2.5 and Dr.GRPO +0.2 — the last within the evaluation's noise
# (200 problems). With --gin.SEED=1 (same code and budget) Dr.GRPO gained +5.0 and GRPO +9.3
# (+9.8 at seed 0): seed-to-seed spread of a few points, so read single gains of that size with
# care. 5-15 minutes per algorithm on two CPU cores shared with other work.
STEPS = 260
PROMPTS = 64
EVAL_PROBLEMS = 200
EVAL_SAMPLES = 16
LEARNING_RATE = 2e-4


def row_learning_rate(name: str, learning_rate: float) -> float:
    """The learning rate ``name`` trains at: the budget's, scaled by ``LEARNING_RATE_SCALE``."""
    return learning_rate * LEARNING_RATE_SCALE.get(name, 1.0)


def run_one(
    name: str,
    steps: int,
    prompts: int,
    learning_rate: float,
    extra: list[str],
    tmp: pathlib.Path,
    eval_problems: int = EVAL_PROBLEMS,
    eval_samples: int = EVAL_SAMPLES,
):
    """One experiment in a subprocess; returns its figures, or None if it failed."""
    run_dir = tmp / name
    cmd = [
        sys.executable,
        "-m",
        "rlax.core.cli",
        "run",
        "--role",
        "inline",
        "--gin",
        str(ROOT / "configs" / "experiments" / EXPERIMENTS[name]),
        "--run-dir",
        str(run_dir),
        f"--gin.INIT_CHECKPOINT='{ROOT / 'assets' / 'quickstart-base'}'",
        f"--gin.rlax.train.steps={steps}",
        f"--gin.PROMPTS_PER_STEP={prompts}",
        f"--gin.LEARNING_RATE={row_learning_rate(name, learning_rate):g}",
        f"--gin.tasks.arithmetic.num_eval={eval_problems}",
        f"--gin.rlax.held_out.samples={eval_samples}",
        "--gin.rlax.train.progress=False",
        "--gin.rlax.evaluate.progress=False",
        *SETTINGS.get(name, []),
        *extra,
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    start = time.perf_counter()
    # cwd outside the checkout: a stale *.egg-info at its root would shadow the entry points.
    proc = subprocess.run(cmd, check=False, cwd=tmp, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        print(f"{name}: exit status {proc.returncode}\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    results = json.loads((run_dir / "eval.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updated = [r for r in rows if r.get("groups_kept")]
    return {
        "before": results["before"],
        "after": results["after"],
        "wall_s": wall,
        "tokens_per_s": sum(r["tokens_per_s"] for r in rows) / max(len(rows), 1),
        # Optimiser updates: one per step that kept a group, times the updates per batch.
        "updates": int(sum(r.get("updates", 1) for r in updated)),
    }


def _epochs_vs_one(out: dict[str, dict]) -> dict[str, float] | None:
    """GRPO with 2 epochs x 4 minibatches against one update per batch (None: a row missing)."""
    if "grpo" not in out or "grpo_2x4" not in out:
        return None
    one, several = out["grpo"], out["grpo_2x4"]
    return {
        "pass8_gain_delta": round(several["pass8_gain"] - one["pass8_gain"], 4),
        "wall_ratio": round(several["wall_s"] / max(one["wall_s"], 1e-9), 3),
        "updates_ratio": round(several["updates"] / max(one["updates"], 1), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--prompts", type=int, default=PROMPTS, help="prompts per step")
    parser.add_argument("--learning-rate", type=float, default=LEARNING_RATE)
    parser.add_argument("--eval-problems", type=int, default=EVAL_PROBLEMS)
    parser.add_argument("--eval-samples", type=int, default=EVAL_SAMPLES)
    parser.add_argument("--only", nargs="+", choices=sorted(EXPERIMENTS), default=list(EXPERIMENTS))
    args, extra = parser.parse_known_args()
    if args.eval_samples < 8:  # the table and the JSON are pass@1 and pass@8
        parser.error(f"--eval-samples: pass@8 needs at least 8 samples, got {args.eval_samples}")
    figures: dict[str, dict] = {}
    failed = []
    with tempfile.TemporaryDirectory(prefix="rlax-algorithms-") as tmp:
        for name in args.only:
            print(f"running {name} ({args.steps} steps) ...", flush=True)
            result = run_one(
                name,
                args.steps,
                args.prompts,
                args.learning_rate,
                extra,
                pathlib.Path(tmp),
                args.eval_problems,
                args.eval_samples,
            )
            if result is None:
                failed.append(name)
            else:
                figures[name] = result
    if not figures:
        return 1
    base = next(iter(figures.values()))["before"]
    print(
        f"\nalgorithms on the quickstart task: {args.steps} steps x {args.prompts} prompts x 8 "
        f"samples, lr {args.learning_rate:g} (a row's own lr where shown); held-out pass@k ({args.eval_problems} problems, "
        f"{args.eval_samples} samples)"
    )
    print(
        f"{'':<22}{'pass@1':>8}{'pass@8':>8}{'Δpass@8':>9}{'wall s':>8}{'tok/s':>8}{'updates':>9}"
        f"{'lr':>9}"
    )
    print(f"{'base policy':<22}{100 * base['pass@1']:>7.1f}%{100 * base['pass@8']:>7.1f}%")
    out = {}
    for name, f in figures.items():
        a = f["after"]
        gain = a["pass@8"] - f["before"]["pass@8"]
        print(
            f"{name:<22}{100 * a['pass@1']:>7.1f}%{100 * a['pass@8']:>7.1f}%{100 * gain:>+8.1f} "
            f"{f['wall_s']:>7.0f}{f['tokens_per_s']:>8.0f}{f['updates']:>9}"
            f"{row_learning_rate(name, args.learning_rate):>9.2g}"
        )
        out[name] = {
            "pass@1": round(a["pass@1"], 4),
            "pass@8": round(a["pass@8"], 4),
            "pass8_gain": round(gain, 4),
            "wall_s": round(f["wall_s"], 1),
            "tokens_per_s": round(f["tokens_per_s"], 1),
            "updates": f["updates"],
            "learning_rate": row_learning_rate(name, args.learning_rate),
        }
    improved = all(v["pass8_gain"] > 0 for v in out.values()) and not failed
    epochs = _epochs_vs_one(out)
    if epochs:
        print(
            f"\ngrpo_2x4 vs grpo (same rollouts): Δpass@8 {100 * epochs['pass8_gain_delta']:+.1f}"
            f" points, wall x{epochs['wall_ratio']:.2f}, updates x{epochs['updates_ratio']:.1f}"
        )
    summary = {
        "budget": {
            "steps": args.steps,
            "prompts_per_step": args.prompts,
            "group_size": 8,
            "learning_rate": args.learning_rate,
            "eval_problems": args.eval_problems,
            "eval_samples": args.eval_samples,
        },
        "base": {k: round(v, 4) for k, v in base.items()},
        "algorithms": out,
        **({"epochs_vs_one_update": epochs} if epochs else {}),
        "failed": failed,
        "all_improve_pass8": improved,
    }
    print(json.dumps(summary))
    return 0 if improved else 1


if __name__ == "__main__":
    sys.exit(main())
