"""Builds the multi-turn quickstart's base policy: a tiny transformer taught the guessing game.

The base policy must know the format (a guess is decimal digits and the stop
id; a hint ``>`` or ``<`` follows) and play sensibly but not well, so RL has
something to improve. A short supervised run on games of a *consistent
random* player gives that: each guess is uniform among the numbers the hints
so far still allow (about half of the games of ``[0, 32)`` end within five
guesses when played exactly; halving the interval wins almost all). Secrets
are drawn from the training stream's seed; the held-out measure is every
secret once. Run from the repository root; it is deterministic on a given
machine and takes about a minute on two CPU cores::

    python scripts/build_multiturn_base.py            # writes assets/multiturn-base
"""

from __future__ import annotations

import argparse
import pathlib
import shutil

import numpy as np

from rlax.core.models.bundle import ModelBundle, new_model, save_model
from rlax.core.models.config import TransformerConfig
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.trainer.sft import supervised_finetune
from rlax.plugins.environments.guess import GuessTask


def consistent_random_game(secret: int, size: int, turns: int, rng, tok) -> np.ndarray:
    """The ids after the prompt of one game: guess, stop id, hint, guess, ..."""
    lo, hi, ids = 0, size - 1, []
    for _ in range(turns):
        guess = int(rng.integers(lo, hi + 1))
        ids += [*tok.encode(str(guess)).tolist(), tok.eos_id]
        if guess == secret:
            break
        hint = ">" if secret > guess else "<"
        lo, hi = (guess + 1, hi) if hint == ">" else (lo, guess - 1)
        ids += tok.encode(hint).tolist()
    return np.asarray(ids, np.int32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="assets/multiturn-base")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    task = GuessTask(size=args.size)
    tokenizer = CharTokenizer(task.alphabet)
    model = new_model(TransformerConfig.tiny(tokenizer.vocab_size), args.seed)
    rng = np.random.default_rng(args.seed)

    def examples():
        for prompt in task.prompts("train", tokenizer=tokenizer, seed=args.seed + 1):
            yield (
                prompt,
                consistent_random_game(prompt.answer, args.size, args.turns, rng, tokenizer),
            )

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
    info = {"built_by": "scripts/build_multiturn_base.py", **vars(args), "final_loss": losses[-1]}
    save_model(out, ModelBundle(model, tokenizer, info))
    print(f"wrote {out} (final sft loss {losses[-1]:.3f})")


if __name__ == "__main__":
    main()
