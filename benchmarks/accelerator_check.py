"""The accelerator check: train step and sampler in bf16 with MFU, peak device memory, RL steps.

Run through ``benchmarks/accelerator_check.sh`` (one command, a time limit,
one JSON line). On a GPU or TPU the default shape is the Qwen2.5-0.5B one
(hidden 896, 24 layers, 14 heads / 2 KV, MLP 4864, vocab 151936, tied head)
with random weights; on a CPU, or with ``--shape tiny``, a tiny decoder, so
the whole path runs anywhere in a minute.

- ``peak_tflops``: the best rate of a chain of large bf16 matmuls, measured
  in the same run on the same device (the MFU's denominator).
- ``train_tok_s`` / ``train_mfu``: rlax's jitted GRPO step (clipped adam,
  ``compute_dtype="bfloat16"``, fp32 master weights) on ``--rows`` x ``--seq``
  tokens; model FLOPs per token ``6 N + 12 L n h T`` (as benchmarks/train_step.py).
- ``sample_tok_s`` / ``sample_mfu``: ``samplers.jax`` on bf16 weights,
  ``--rows`` prompts x ``--new`` tokens (no early stop); FLOPs per generated
  token ``2 N + 4 L n h S`` with S the mean cache length.
- ``peak_device_gb``: the device allocator's peak (``memory_stats``;
  null where the backend keeps none, as on the CPU).
- ``rl_*``: ``rlax run`` of ``--rl-config`` for ``--rl-steps`` steps in a
  subprocess (the SmolLM2 config for 20 steps on an accelerator; the
  quickstart's tiny model for 2 on a CPU, ``--role inline`` with a small
  held-out set): the seconds it took and the mean
  reward of its first and last steps (from the run's ``metrics.jsonl``).
- ``modes``, ``handoff_s``, ``ps_push_pull_s``, ``handoff_vs_ps``: each placement mode's
  step and sampling, and the device-to-device weight handoff against a parameter
  server's push + pull (``benchmarks/accelerator_modes.py``; ``--no-modes`` skips them).

Usage: python benchmarks/accelerator_check.py [--shape auto|tiny|qwen0.5b] [--rl-steps N]
The last line of output is the JSON result.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from train_step import flops_per_token, make_batch

from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer
from rlax.core.parallel.host_memory import reuse_freed_memory
from rlax.core.trainer.microbatch import cast_floats
from rlax.core.trainer.step import Trainer, TrainerSettings
from rlax.core.types import Prompt
from rlax.plugins.algorithms.grpo import grpo
from rlax.plugins.samplers.jax_sampler import JaxSampler

TINY = TransformerConfig(
    vocab_size=512,
    num_layers=2,
    embed_dim=64,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    mlp_dim=128,
    qkv_bias=True,
)


TINY_RL_BINDINGS = (
    "--gin.EVAL_SAMPLES=1",
    "--gin.EVAL_KS=(1,)",
    "--gin.PROMPTS_PER_STEP=8",
    "--gin.tasks.arithmetic.num_eval=8",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=["auto", "tiny", "qwen0.5b"], default="auto")
    p.add_argument("--rows", type=int, default=0, help="0: 16 (accelerator) / 4 (tiny)")
    p.add_argument("--seq", type=int, default=0, help="train tokens a row; 0: 1024 / 32")
    p.add_argument("--new", type=int, default=0, help="sampled tokens a row; 0: 256 / 8")
    p.add_argument("--repeats", type=int, default=3, help="timed calls of each probe (best kept)")
    p.add_argument("--rl-config", default="", help="0-arg default: smollm2 / quickstart")
    p.add_argument("--rl-steps", type=int, default=-1, help="-1: 20 (accelerator) / 2 (tiny)")
    p.add_argument("--rl-role", default="", help="'': all roles (accelerator) / inline (tiny)")
    p.add_argument("--rl-timeout-s", type=float, default=300.0)
    p.add_argument("--no-modes", dest="modes", action="store_false", help="skip mode figures")
    return p.parse_args(argv)


def settle(a: argparse.Namespace, backend: str) -> argparse.Namespace:
    """Fills the defaults that depend on the shape."""
    tiny = a.shape == "tiny" or (a.shape == "auto" and backend == "cpu")
    a.shape = "tiny" if tiny else "qwen0.5b"
    a.rows = a.rows or (4 if tiny else 16)
    a.seq = a.seq or (32 if tiny else 1024)
    a.new = a.new or (8 if tiny else 256)
    if a.rl_steps < 0:
        a.rl_steps = 2 if tiny else 20
    if not a.rl_config:
        a.rl_config = (
            "configs/experiments/quickstart.gin"
            if tiny
            else "configs/experiments/smollm2_arithmetic.gin"
        )
    a.rl_role = a.rl_role or ("inline" if tiny else "all")
    # Tiny: one process and a small held-out set, so the whole check takes a minute or two.
    a.rl_bindings = TINY_RL_BINDINGS if tiny else ()
    return a


def best_seconds(fn, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_peak_flops(size: int, repeats: int) -> float:
    """The best FLOP/s of a chain of bf16 [size, size] matmuls on the default device."""
    x = jnp.ones((size, size), jnp.bfloat16) / size
    chain = 8

    @jax.jit
    def run(x):
        for _ in range(chain):
            x = x @ x
        return x

    run(x).block_until_ready()
    return chain * 2 * size**3 / best_seconds(lambda: run(x).block_until_ready(), repeats)


def matmul_params(cfg: TransformerConfig) -> int:
    d, n, k, h, f = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    return cfg.num_layers * (d * (n + 2 * k) * h + n * h * d + 3 * d * f) + d * cfg.vocab_size


def train_probe(cfg: TransformerConfig, a: argparse.Namespace) -> dict:
    settings = TrainerSettings(compute_dtype="bfloat16", post_update_kl=False)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-5))
    trainer = Trainer(Transformer(cfg, rngs=nnx.Rngs(0)), grpo(), optimizer, settings=settings)
    shape = argparse.Namespace(batch=a.rows, seq=a.seq, prompt=a.seq // 4, vocab=cfg.vocab_size)
    arrays = trainer.device_batch(make_batch(shape))
    start = time.perf_counter()
    loss = trainer.step(arrays)["loss"]  # compiles
    compile_s = time.perf_counter() - start
    seconds = best_seconds(lambda: trainer.step(arrays), a.repeats)
    tokens = a.rows * a.seq
    return {
        "train_loss": loss,
        "train_compile_s": compile_s,
        "train_s": seconds,
        "train_flops": flops_per_token(cfg, a.seq) * tokens,
        "train_tok_s": tokens / seconds,
    }


class _Ids:
    """The least a sampler needs of a tokenizer, for random weights."""

    eos_id = 0

    def decode(self, ids) -> str:
        return " ".join(str(int(i)) for i in ids)


def sample_probe(cfg: TransformerConfig, a: argparse.Namespace) -> dict:
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    sampler = JaxSampler(max_new_tokens=a.new, prompt_bucket=16, stop_at_eos=False)
    sampler.setup(model, _Ids())
    sampler.load_weights(cast_floats(nnx.split(model)[1], jnp.bfloat16), 1)
    rng = np.random.default_rng(0)
    prompt_len = a.seq // 4
    prompts = [
        Prompt(str(i), "", rng.integers(1, cfg.vocab_size, size=prompt_len).astype(np.int32), "")
        for i in range(a.rows)
    ]
    start = time.perf_counter()
    out = sampler.generate(prompts, 1, seed=0)  # compiles
    compile_s = time.perf_counter() - start
    generated = sum(len(c.tokens) for g in out for c in g)
    seconds = best_seconds(lambda: sampler.generate(prompts, 1, seed=1), a.repeats)
    cache = prompt_len + a.new / 2
    per_token = 2 * matmul_params(cfg) + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * cache
    return {
        "sample_compile_s": compile_s,
        "sample_s": seconds,
        "sample_tokens": generated,
        "sample_flops": per_token * generated,
        "sample_tok_s": generated / seconds,
    }


def peak_device_bytes() -> int | None:
    stats = jax.local_devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rl_probe(a: argparse.Namespace) -> dict:
    """``rlax run`` of the RL config for ``rl_steps`` steps: seconds and first/last rewards."""
    if a.rl_steps == 0:
        return {"rl_steps": 0}
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix="rlax-accel-")) / "run"
    cmd = [
        sys.executable,
        "-m",
        "rlax.core.cli",
        "run",
        "--gin",
        a.rl_config,
        f"--gin.rlax.train.steps={a.rl_steps}",
        "--run-dir",
        str(run_dir),
        "--role",
        a.rl_role,
        *a.rl_bindings,
    ]
    env = dict(os.environ, RLAX_PS_ADDRESS=f"127.0.0.1:{free_port()}")
    start = time.perf_counter()
    out = subprocess.run(
        cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=False, timeout=a.rl_timeout_s
    )
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"rlax run failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in rows if "reward" in r]
    return {
        "rl_steps": len(rows),
        "rl_s": round(seconds, 1),
        "rl_reward_first": round(rewards[0], 4) if rewards else None,
        "rl_reward_last": round(rewards[-1], 4) if rewards else None,
    }


def main(argv: list[str]) -> dict:
    reuse_freed_memory()
    backend = jax.default_backend()
    a = settle(parse_args(argv), backend)
    cfg = TINY if a.shape == "tiny" else TransformerConfig.qwen2_5_0_5b()
    peak = matmul_peak_flops(512 if backend == "cpu" else 8192, a.repeats)
    train, sample = train_probe(cfg, a), sample_probe(cfg, a)
    device_peak = peak_device_bytes()
    result = {
        "backend": backend,
        "device": jax.local_devices()[0].device_kind,
        "shape": a.shape,
        "params": cfg.num_params(),
        "peak_tflops": round(peak / 1e12, 3),
        "train_tok_s": round(train["train_tok_s"], 1),
        "train_mfu": round(train["train_flops"] / train["train_s"] / peak, 4),
        "train_compile_s": round(train["train_compile_s"], 1),
        "sample_tok_s": round(sample["sample_tok_s"], 1),
        "sample_mfu": round(sample["sample_flops"] / sample["sample_s"] / peak, 4),
        "peak_device_gb": None if device_peak is None else round(device_peak / 1e9, 2),
        "train_loss_finite": bool(np.isfinite(train["train_loss"])),
    }
    if a.modes:
        import accelerator_modes  # here: it imports this module's probes

        result.update(accelerator_modes.probe(cfg, a))
    result.update(rl_probe(a))
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
