"""Long reasoning (issue 56): context parallelism's memory, prefix sharing's speed, and the
activation memory estimate, in one run on 8 fake CPU devices.

- **memory** (``cp_memory_ratio_4``): one row of ``--length`` (2,048) tokens through the
  forward and backward pass of a 4-layer model (D 128, 4 heads, 2 KV heads, F 512), its
  sequence split over a ``context`` axis of 1, 2 and 4 devices: XLA's compiled
  temporary memory per device (``compiled.memory_analysis()``: the activations;
  parameters and gradients are arguments and outputs), degree 4 over degree 1. Also
  each degree's peak per device (``peak_mb_c1/2/4``).
- **prefix** (``prefix_vs_packed``): a prompt-heavy GRPO workload, ``--groups`` (2)
  prompts of 1,024 tokens x 8 completions of 64-256 tokens (uniform, seeded), one
  device, ``Trainer.step`` with ``packing="packed"`` (flat) against ``"prefix"``, both
  one microbatch and both with training attention in blocks of ``--block`` (128,
  ``attention_block``: a tree's masked branch blocks are skipped, not computed); the
  median of ``--steps`` (5) steps after a warm-up step each, alternated, flat seconds
  over prefix seconds. CPU seconds of the steps beside it (``prefix_vs_packed_cpu``),
  which a busy machine's other work moves less. The same with dense attention in both
  (``prefix_vs_packed_dense``), and prefix sharing in blocks against flat packing with
  dense attention, the defaults (``prefix_blocks_vs_packed_dense``).
- **estimate** (``memory_estimate_error``): the largest relative error of the trainer's
  estimate (:func:`rlax.core.trainer.memory.activation_bytes`) against the measured
  peak per device of *memory*, over the three degrees and degree 1 with attention in
  blocks (``peak_mb_c1_blocks``; ``blocks_memory_ratio`` is its peak over dense's).

The JSON last line holds these keys. Timings from a shared machine are noise-prone:
quote them with the load they ran under.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.parallel.mesh import MeshConfig, make_mesh, single_device_mesh, tree_shardings
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.memory import activation_bytes
from rlax.core.trainer.microbatch import wrap_blocks
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.trainer.step import Trainer, batch_arrays
from rlax.core.types import Completion, Group, Prompt
from rlax.plugins.algorithms.grpo import grpo

MEMORY_CFG = TransformerConfig(
    vocab_size=256,
    num_layers=4,
    embed_dim=128,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    mlp_dim=512,
)
STEP_CFG = TransformerConfig(
    vocab_size=512,
    num_layers=2,
    embed_dim=128,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    mlp_dim=384,
)


def peak_per_device(context: int, length: int, block: int = 0) -> int:
    """XLA's temporary bytes per device of one row's forward and backward pass (attention in
    ``block`` x ``block`` blocks, or dense)."""
    mesh = make_mesh(MeshConfig(1, 1, 1, context=context), jax.devices()[:context])
    graphdef, params = nnx.split(Transformer(MEMORY_CFG, rngs=nnx.Rngs(0)))
    params = jax.device_put(params, tree_shardings(params, mesh))

    def loss(p, tokens, segments):
        model = wrap_blocks(nnx.merge(graphdef, p), "none", mesh, block)
        return sequence_logprobs(model, tokens, segments)[0].sum()

    spec = P(None, "context") if context > 1 else P()
    tokens = jax.device_put(jnp.ones((1, length), jnp.int32), NamedSharding(mesh, spec))
    compiled = jax.jit(jax.grad(loss)).lower(params, tokens, tokens).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def prompt_heavy(groups: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``groups`` prompts of 1,024 tokens x 8 completions of 64-256 tokens, padded."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        prompt = Prompt(str(g), "", rng.integers(1, 512, 1024).astype(np.int32), "")
        completions = tuple(
            Completion(
                rng.integers(1, 512, n).astype(np.int32),
                -rng.random(n).astype(np.float32),
                "",
                "stop",
                0,
            )
            for n in rng.integers(64, 257, 8)
        )
        out.append(Group(prompt, completions, rng.random(8).astype(np.float32)))
    algorithm = grpo()
    advantages = algorithm.advantages(np.stack([g.rewards for g in out]))
    return batch_arrays(make_batch(out, advantages, completion_len=256))


def step_times(
    arrays: dict[str, np.ndarray], steps: int, block: int
) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds of a step per layout and attention (dense; in ``block``
    blocks), all four alternated."""
    budget = len(arrays["tokens"]) * arrays["tokens"].shape[1]  # one microbatch either way
    trainers = {}
    for mode, attention in (("packed", 0), ("prefix", 0), ("packed", block), ("prefix", block)):
        settings = TrainerSettings(
            packing=mode, microbatch_tokens=budget, attention_block=attention
        )
        model = Transformer(STEP_CFG, rngs=nnx.Rngs(0))
        name = mode + ("_blocks" if attention else "")
        trainers[name] = Trainer(
            model, grpo(), optax.sgd(1e-3), mesh=single_device_mesh(), settings=settings
        )
        trainers[name].step(arrays)  # warm-up: compile
    wall: dict[str, list[float]] = {m: [] for m in trainers}
    cpu: dict[str, list[float]] = {m: [] for m in trainers}
    for _ in range(steps):
        for mode, trainer in trainers.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            trainer.step(arrays)
            wall[mode].append(time.perf_counter() - start)
            cpu[mode].append(time.process_time() - start_cpu)
    return {m: (statistics.median(wall[m]), statistics.median(cpu[m])) for m in trainers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--block", type=int, default=128, help="attention_block of the arms")
    args = parser.parse_args()
    result: dict[str, float] = {}
    peaks = {c: peak_per_device(c, args.length) for c in (1, 2, 4)}
    errors = []
    for c, peak in peaks.items():
        estimate = activation_bytes(MEMORY_CFG, 1, args.length, c).total
        result[f"peak_mb_c{c}"] = round(peak / 1e6, 1)
        result[f"estimate_mb_c{c}"] = round(estimate / 1e6, 1)
        errors.append(abs(estimate / peak - 1))
    blocks_peak = peak_per_device(1, args.length, args.block)
    blocks_estimate = activation_bytes(MEMORY_CFG, 1, args.length, 1, "none", "float32", args.block)
    result["peak_mb_c1_blocks"] = round(blocks_peak / 1e6, 1)
    result["estimate_mb_c1_blocks"] = round(blocks_estimate.total / 1e6, 1)
    errors.append(abs(blocks_estimate.total / blocks_peak - 1))
    result["cp_memory_ratio_4"] = round(peaks[4] / peaks[1], 3)
    result["blocks_memory_ratio"] = round(blocks_peak / peaks[1], 3)
    result["memory_estimate_error"] = round(max(errors), 3)
    arrays = prompt_heavy(args.groups)
    times = step_times(arrays, args.steps, args.block)
    for name, (wall, _cpu) in times.items():
        result[f"{name}_step_s"] = round(wall, 3)

    def ratio(a: str, b: str, k: int = 0) -> float:
        return round(times[a][k] / times[b][k], 2)

    # The figure: both layouts with attention in blocks (the way to run prefix sharing).
    result["prefix_vs_packed"] = ratio("packed_blocks", "prefix_blocks")
    result["prefix_vs_packed_cpu"] = ratio("packed_blocks", "prefix_blocks", 1)
    result["prefix_vs_packed_dense"] = ratio("packed", "prefix")  # dense attention, both
    result["prefix_vs_packed_dense_cpu"] = ratio("packed", "prefix", 1)
    result["prefix_blocks_vs_packed_dense"] = ratio("packed", "prefix_blocks")  # vs the default
    result["load_1min"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
