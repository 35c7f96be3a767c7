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

Then the learning figure, in the same run: for each seed, the MoE quickstart
(``rlax run --gin moe_quickstart``: parameter server, trainer, two workers) with R3 off
and with R3 on, the same injection in the whole system (``rlax.ps_settings.wire_dtype =
'bfloat16'``: the workers sample with the published weights rounded to bfloat16, the
trainer trains in float32), held-out pass@1 / pass@8 before and after, and the trainer's
own per-step mismatch (``mismatch_abs_logp_p99``, its median over the steps).
``--no-learn`` skips it (null figures); ``--steps`` shortens the runs.

    python benchmarks/moe.py [--base PATH] [--prompts 256] [--samples 8] [--seeds 0 1 2]
                             [--no-learn] [--steps N]

Prints a table, then one JSON line: ``{"seeds", "mismatch_p99_off", "mismatch_p99_on",
"mismatch_mean_off", "mismatch_mean_on", "routing_differs_off", "mismatch_p99_ratio",
"mismatch_p99_ratio_worst", "tokens", "injected", "learning": [{"seed", "replay",
"pass1_before", "pass1_after", "pass8_before", "pass8_after", "pass1_gain", "pass8_gain",
"train_mismatch_p99", "wall_s", "steps"}, ...], "pass8_gain_min_on", "pass8_gain_min_off",
"train_mismatch_p99_ratio_worst"}`` (p99s and fractions are the worst over the seeds; the
ratios are per seed, on over off, and their worst the largest).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

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

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import multiturn  # sibling script: runs a packaged experiment in a fresh directory
import quickstart  # sibling script: a run's pass@k figures

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


INJECTED = (
    "sampler weights in bfloat16, trainer forward in float32 "
    "(GRPO runs: rlax.ps_settings.wire_dtype = 'bfloat16', the workers' weights rounded)"
)
WIRE_BF16 = "--gin.rlax.ps_settings.wire_dtype='bfloat16'"  # the same injection, whole system


def learn(seed: int, replay: str, base: pathlib.Path, steps: int | None) -> dict:
    """One MoE quickstart run with routing replay ``replay`` ('off' or 'rollout')."""
    settings = [
        f"--gin.SEED={seed}",
        f"--gin.INIT_CHECKPOINT='{base.resolve()}'",
        f"--gin.rlax.trainer_settings.routing_replay='{replay}'",
        WIRE_BF16,
    ]
    if steps is not None:
        settings.append(f"--gin.rlax.train.steps={steps}")
    results, rows, wall = multiturn.run_quickstart("moe_quickstart", settings)
    p99s = [r["mismatch_abs_logp_p99"] for r in rows if "mismatch_abs_logp_p99" in r]
    return {
        "seed": seed,
        "replay": replay,
        **quickstart.pass_figures(results),
        "train_mismatch_p99": float(np.median(p99s)) if p99s else None,
        "wall_s": round(wall, 1),
        "steps": len(rows),
    }


def table(runs: list[dict], learning: list[dict], seeds: list[int]) -> str:
    rows = [
        "mismatch on the same rows, sampler in bf16, trainer in fp32 (|dlogp| per token)",
        f"{'seed':>4} {'p99 off':>9} {'p99 on':>9} {'on/off':>7} {'routed apart':>13} {'tokens':>7}",
    ]
    for s, r in zip(seeds, runs):
        rows.append(
            f"{s:>4} {r['p99_off']:>9.4f} {r['p99_on']:>9.4f} {r['p99_on'] / r['p99_off']:>7.3f}"
            f" {100 * r['differs']:>12.2f}% {r['tokens']:>7}"
        )
    if learning:
        rows += [
            "",
            "GRPO on the MoE quickstart, workers on bf16 weights (wire), held-out pass@k",
            (
                f"{'seed':>4} {'replay':>8} {'pass@1':>15} {'pass@8':>15} {'gain@8':>7}"
                f" {'train p99':>10} {'wall s':>7}"
            ),
        ]
        for r in learning:
            rows.append(
                f"{r['seed']:>4} {r['replay']:>8} "
                f"{100 * r['pass1_before']:>6.1f}->{100 * r['pass1_after']:>5.1f}% "
                f"{100 * r['pass8_before']:>6.1f}->{100 * r['pass8_after']:>5.1f}% "
                f"{r['pass8_gain']:>+7.1f} {r['train_mismatch_p99'] or float('nan'):>10.4f}"
                f" {r['wall_s']:>7.1f}"
            )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--base", type=pathlib.Path, default=BASE, help="the MoE base policy")
    parser.add_argument(
        "--learn",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the GRPO runs, R3 off and on, a pair per seed (minutes each)",
    )
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (the config's)")
    args = parser.parse_args()
    if not (args.base / "model.json").is_file():
        parser.error(f"--base {args.base}: no model.json there (a model directory rlax wrote)")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    runs = [measure(s, args.prompts, args.samples, args.base) for s in args.seeds]
    learning = []
    if args.learn:
        for s in args.seeds:
            for replay in ("off", "rollout"):
                learning.append(learn(s, replay, args.base, args.steps))
    print(table(runs, learning, args.seeds))

    def worst_gain(replay: str) -> float | None:
        gains = [r["pass8_gain"] for r in learning if r["replay"] == replay]
        return min(gains) if gains else None

    train_ratios = [
        on["train_mismatch_p99"] / off["train_mismatch_p99"]
        for off, on in zip(learning[::2], learning[1::2])
        if off["train_mismatch_p99"] and on["train_mismatch_p99"] is not None
    ]
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
                "injected": INJECTED,
                "base": str(args.base),
                "learning": learning,
                "pass8_gain_min_on": worst_gain("rollout"),
                "pass8_gain_min_off": worst_gain("off"),
                "train_mismatch_p99_ratio_worst": max(train_ratios) if train_ratios else None,
            }
        )
    )


if __name__ == "__main__":
    main()
