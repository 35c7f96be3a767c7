"""Verifier throughput: the math and code rewards scored serially vs. in a RewardPool.

Same run, same items, same machine. The workload:

- math: completions with boxed / ``####`` / "the answer is" answers against
  references, two thirds decided by the numeric stage, a third by the
  symbolic stage (math-verify), right and wrong;
- code: sandboxed programs against assert tests, passing and failing, plus
  ``--hostile`` programs that sleep inside the sandbox past the pool's
  ``--timeout`` (the sandbox's own wall limit is longer): serially each costs
  the sandbox's whole wall limit, in the pool each is killed at the timeout,
  scores 0, is counted, and the pool serves on.

Serial means ``reward.score`` called in a loop in this process, as a
training loop without a pool would. Scores/s is items over wall seconds,
math and code together; pool start-up (worker processes importing the
verifiers) is timed separately and not included.

    python benchmarks/rewards.py [--math N] [--code N] [--hostile N] [--workers W] [--timeout S]

Prints a table, then one JSON line:
``{"serial_scores_s", "pool_scores_s", "speedup", "timeouts_contained"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import numpy as np

from rlax.core.types import Prompt
from rlax.core.worker.reward_pool import RewardPool
from rlax.plugins.rewards.code_verifier import CodeReward
from rlax.plugins.rewards.math_verifier import MathReward

SYMBOLIC = [
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}"),
    (r"2\sqrt{2}", r"\sqrt{8}"),
    (r"x^2+2x+1", "(x+1)^2"),
    (r"(1, 2)", "(1,2)"),
    (r"[0, 1)", "[0,1)"),
    (r"3\pi/2", r"\frac{3\pi}{2}"),
]


def prompt(answer: object, i: int) -> Prompt:
    return Prompt(id=str(i), text="", tokens=np.zeros(1, np.int32), answer=answer)


def math_items(n: int, rng: random.Random) -> tuple[list[Prompt], list[str]]:
    prompts, texts = [], []
    for i in range(n):
        if i % 3 == 2:
            pred, gold = SYMBOLIC[i % len(SYMBOLIC)]
            text = f"Working... so the result is $\\boxed{{{pred}}}$."
        else:
            value = rng.randint(1, 10**6)
            gold = str(value)
            shown = f"{value + (i % 2):,}"  # half right, half off by one
            text = rng.choice(
                [f"... \\boxed{{{shown}}}", f"...\n#### {shown}", f"So the answer is {shown}."]
            )
        prompts.append(prompt(gold, i))
        texts.append(text)
    return prompts, texts


def code_items(n: int, hostile: int) -> tuple[list[Prompt], list[str]]:
    tests = ["assert f(3) == 9", "assert f(-2) == 4", "assert f(0) == 0"]
    good = "```python\ndef f(x):\n    return x * x\n```"
    bad = "```python\ndef f(x):\n    return 2 * x\n```"
    prompts = [prompt(tests, i) for i in range(n + hostile)]
    texts = [good if i % 2 else bad for i in range(n)]
    texts += ["```python\nimport time\ntime.sleep(3600)\n```"] * hostile
    return prompts, texts


def serial(reward, prompts, texts) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    scores = [float(reward.score(p, t).score) for p, t in zip(prompts, texts)]
    return time.perf_counter() - start, np.asarray(scores)


def pooled(reward, prompts, texts, workers, timeout) -> tuple[float, float, object]:
    start = time.perf_counter()
    pool = RewardPool(reward, workers=workers, timeout_s=timeout)
    started = time.perf_counter() - start
    try:
        start = time.perf_counter()
        result = pool.score(prompts, texts)
        return started, time.perf_counter() - start, result
    finally:
        pool.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--math", type=int, default=300, help="math items")
    parser.add_argument("--code", type=int, default=40, help="code items")
    parser.add_argument("--hostile", type=int, default=2, help="code items that hang")
    parser.add_argument("--workers", type=int, default=max(2, os.cpu_count() or 2))
    parser.add_argument("--timeout", type=float, default=2.0, help="pool per-call timeout, s")
    args = parser.parse_args()

    rng = random.Random(0)
    math_reward = MathReward(timeout_s=5.0)
    code_reward = CodeReward(cpu_s=2, wall_s=3 * args.timeout)  # the pool's timeout comes first
    workloads = {
        "math": (math_reward, *math_items(args.math, rng)),
        "code": (code_reward, *code_items(args.code, args.hostile)),
    }
    rows, totals = [], {"items": 0, "serial_s": 0.0, "pool_s": 0.0, "timeouts": 0}
    for name, (reward, prompts, texts) in workloads.items():
        serial_s, serial_scores = serial(reward, prompts, texts)
        start_s, pool_s, result = pooled(reward, prompts, texts, args.workers, args.timeout)
        ok = ~result.failed
        agree = bool(np.array_equal(serial_scores[ok], result.scores[ok]))
        rows.append((name, len(texts), serial_s, pool_s, start_s, result.timeouts, agree))
        totals["items"] += len(texts)
        totals["serial_s"] += serial_s
        totals["pool_s"] += pool_s
        totals["timeouts"] += result.timeouts
        if result.errors or not agree:
            print(f"{name}: {result.errors} errors; scores agree: {agree}", file=sys.stderr)

    print(f"reward verifier throughput, {args.workers} pool workers, timeout {args.timeout:g}s\n")
    print(f"{'':<6}{'items':>7}{'serial/s':>10}{'pool/s':>9}{'speedup':>9}"
          f"{'pool start':>12}{'timeouts':>10}{'same scores':>13}")  # fmt: skip
    for name, n, s, p, st, to, agree in rows:
        print(f"{name:<6}{n:>7}{n / s:>10.1f}{n / p:>9.1f}{s / p:>8.2f}x"
              f"{st:>11.2f}s{to:>10}{'yes' if agree else 'NO':>13}")  # fmt: skip
    figures = {
        "serial_scores_s": round(totals["items"] / totals["serial_s"], 1),
        "pool_scores_s": round(totals["items"] / totals["pool_s"], 1),
        "speedup": round(totals["serial_s"] / totals["pool_s"], 2),
        "timeouts_contained": totals["timeouts"],
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
