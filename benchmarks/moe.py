"""Routing replay (R3) on the MoE quickstart's base: how far the trainer's logprobs are from
the sampler's with replay off and on, under an injected sampler/trainer numeric difference.

Real deployments sample in bf16 and train in fp32 (or run other kernels and batch
shapes): that difference flips close top-k choices, so a token is routed to other
experts by the trainer than by the sampler. This benchmark injects it: the sampler
(``samplers.jax``) runs the MoE quickstart base's weights cast to bfloat16, the trainer's
forward runs them in float32. On the same sampled rows it measures, per completion token,
|trainer logprob - sampler logprob| with the trainer routing each token itself (off) and
by the sampler's recorded experts (on), and the fraction of tokens the trainer would route
to another expert set in some layer.

    python benchmarks/moe.py [--prompts 64] [--samples 8] [--seeds 0 1 2]

The learning figure (GRPO with R3 on, pass@8 gain over seeds) is a whole quickstart run a
seed: ``python benchmarks/quickstart.py --config moe_quickstart --runs 3`` (its
``min_pass8_gain``); it is not run here and is reported as null.

Prints one JSON line: ``{"seeds", "mismatch_p99_off", "mismatch_p99_on",
"mismatch_mean_off", "mismatch_mean_on", "routing_differs_off", "mismatch_p99_ratio",
"mismatch_p99_ratio_worst", "tokens", "injected", "pass8_gain_min_on"}`` (p99s and
fractions are the worst over the seeds; the ratio is per seed, p99 on over p99 off, and
its worst the largest).
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlax.core.models.bundle import load_model
from rlax.core.models.routing_replay import replayed_logprobs
from rlax.core.models.transformer import causal_mask, positions_from_mask, sequence_logprobs
from rlax.core.trainer.batches import make_batch
from rlax.core.types import Group
from rlax.plugins.samplers.jax_sampler import JaxSampler
from rlax.plugins.tasks.arithmetic import ArithmeticTask

BASE = pathlib.Path(__file__).resolve().parents[1] / "assets" / "moe-quickstart-base"


def measure(seed: int, prompts: int, samples: int, base: pathlib.Path = BASE) -> dict[str, float]:
    bundle = load_model(base)
    model, tokenizer = bundle.model, bundle.tokenizer
    task = ArithmeticTask(digits=2)
    batch_prompts = [
        p for p, _ in zip(task.prompts("train", tokenizer=tokenizer, seed=seed), range(prompts))
    ]
    sampler = JaxSampler(max_new_tokens=4, temperature=1.0)
    sampler.setup(model, tokenizer)
    state = nnx.state(model)
    sampler.load_weights(jax.tree.map(lambda x: x.astype(jnp.bfloat16), state), 1)  # injected
    out = sampler.generate(batch_prompts, samples, seed=seed)
    groups = [Group(p, cs, np.zeros(samples, np.float32)) for p, cs in zip(batch_prompts, out)]
    batch = make_batch(groups, np.zeros((len(groups), samples)), completion_len=4)
    mask = batch.loss_mask > 0
    own, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, 1.0)
    replayed, _ = replayed_logprobs(
        model, batch.tokens, batch.attention_mask, batch.routes, 1.0, 1024
    )
    off = np.abs(np.asarray(own) - batch.old_logprobs)[mask]
    on = np.abs(np.asarray(replayed) - batch.old_logprobs)[mask]
    attention = jnp.asarray(batch.attention_mask)
    _, _, routes = model.routed_hidden_states(
        jnp.asarray(batch.tokens), positions_from_mask(attention), causal_mask(attention)
    )
    # The completion tokens' experts (the ones whose logprobs are compared).
    fed = batch.routes >= 0
    real = batch.attention_mask & fed.all((-1, -2))
    differs = np.any(
        np.sort(np.asarray(routes.ids), -1)[real] != np.sort(batch.routes, -1)[real], axis=(-1, -2)
    )
    return {
        "p99_off": float(np.percentile(off, 99)),
        "p99_on": float(np.percentile(on, 99)),
        "mean_off": float(off.mean()),
        "mean_on": float(on.mean()),
        "differs": float(differs.mean()),
        "tokens": int(mask.sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--base", type=pathlib.Path, default=BASE, help="the MoE base policy")
    args = parser.parse_args()
    runs = [measure(s, args.prompts, args.samples, args.base) for s in args.seeds]
    for s, r in zip(args.seeds, runs):
        print(f"seed {s}: {r}")
    print(
        json.dumps(
            {
                "seeds": args.seeds,
                "mismatch_p99_off": max(r["p99_off"] for r in runs),
                "mismatch_p99_on": max(r["p99_on"] for r in runs),
                "mismatch_mean_off": max(r["mean_off"] for r in runs),
                "mismatch_mean_on": max(r["mean_on"] for r in runs),
                "routing_differs_off": max(r["differs"] for r in runs),
                # per seed, p99 on over p99 off; the worst (largest) of the seeds
                "mismatch_p99_ratio": [round(r["p99_on"] / r["p99_off"], 4) for r in runs],
                "mismatch_p99_ratio_worst": max(r["p99_on"] / r["p99_off"] for r in runs),
                "tokens": sum(r["tokens"] for r in runs),
                "injected": "sampler weights in bfloat16, trainer forward in float32",
                "pass8_gain_min_on": None,
            }
        )
    )


if __name__ == "__main__":
    main()
