"""Builds the MoE quickstart's base policy: the quickstart's model with mixture-of-experts MLPs.

The same recipe as ``scripts/build_quickstart_base.py`` (a short supervised run
on the arithmetic task's training split), on ``TransformerConfig.tiny`` whose
MLPs are 8 routed experts of width 96, one per token, beside a shared expert of
width 96 every token goes through, its output gated (the Qwen2-MoE layout; top-1
routing as Llama 4's). One expert a token is the layout where a routing flip
sends a token through other weights entirely, so routing replay has something to
remove (benchmarks/moe.py, docs/models.md); the shared expert is what keeps it a
fast learner. 250 steps leave it weak (about 9% pass@1, 49% pass@8 held out), so
RL has room. Run from the repository root; deterministic on a given machine::

    python scripts/build_moe_quickstart_base.py        # writes assets/moe-quickstart-base
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import shutil

import numpy as np

from rlax.core.models.bundle import ModelBundle, new_model, save_model
from rlax.core.models.config import MoeConfig, TransformerConfig
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.trainer.sft import supervised_finetune
from rlax.plugins.tasks.arithmetic import ArithmeticTask

MOE = MoeConfig(
    num_experts=8,
    experts_per_token=1,
    expert_mlp_dim=96,
    normalize_topk=True,
    shared_mlp_dim=96,
    shared_gate=True,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="assets/moe-quickstart-base")
    parser.add_argument("--digits", type=int, default=2)
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--experts", type=int, default=MOE.num_experts)
    parser.add_argument("--experts-per-token", type=int, default=MOE.experts_per_token)
    parser.add_argument("--expert-mlp-dim", type=int, default=MOE.expert_mlp_dim)
    parser.add_argument(
        "--normalize-topk",
        action=argparse.BooleanOptionalAction,
        default=MOE.normalize_topk,
        help="gate weights renormalised over the chosen experts (off: the router's probabilities)",
    )
    parser.add_argument(
        "--shared-mlp-dim",
        type=int,
        default=MOE.shared_mlp_dim,
        help="width of a shared expert every token goes through (0: none)",
    )
    parser.add_argument(
        "--shared-gate",
        action=argparse.BooleanOptionalAction,
        default=MOE.shared_gate,
        help="the shared expert's output times sigmoid(x . w) (Qwen2-MoE)",
    )
    args = parser.parse_args()

    task = ArithmeticTask(digits=args.digits)
    tokenizer = CharTokenizer(task.alphabet)
    moe = dataclasses.replace(
        MOE,
        num_experts=args.experts,
        experts_per_token=args.experts_per_token,
        expert_mlp_dim=args.expert_mlp_dim,
        normalize_topk=args.normalize_topk,
        shared_mlp_dim=args.shared_mlp_dim,
        shared_gate=args.shared_gate,
    )
    cfg = dataclasses.replace(TransformerConfig.tiny(tokenizer.vocab_size), moe=moe)
    model = new_model(cfg, args.seed)

    def examples():
        for prompt in task.prompts("train", tokenizer=tokenizer, seed=args.seed + 1):
            target = np.append(tokenizer.encode(prompt.answer), tokenizer.eos_id)
            yield prompt, target.astype(np.int32)

    losses = supervised_finetune(
        model,
        examples(),
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
    )
    out = pathlib.Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    info = {
        "built_by": "scripts/build_moe_quickstart_base.py",
        **vars(args),
        "final_loss": losses[-1],
    }
    save_model(out, ModelBundle(model, tokenizer, info))
    print(f"wrote {out} (final sft loss {losses[-1]:.3f})")


if __name__ == "__main__":
    main()
