"""How long the code reward's trusted side takes to judge a hostile answer of about 4 MiB.

Each answer is a channel the sandboxed program could write (deep nesting,
millions of elements or tiny containers, huge decimal and hex ints, dict keys
and set members that share a hash against expected values as long, junk and
blank lines, a right 4 MiB string) and is judged by
``sandbox_verdict.judge`` in this process, as ``CodeReward`` judges it.
Prints a table, then one JSON line: the slowest case and whether every case
stayed within the issue's bound (0.5 s)::

    python benchmarks/decode_bound.py [--mib 4] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import time

from rlax.plugins.rewards.code.plan import plan_tests
from rlax.plugins.rewards.code.verdict import judge

BOUND_S = 0.5
HASH_MODULUS = 2**61 - 1  # ints equal modulo it share a hash, whatever the seed


def answers(size: int) -> dict[str, tuple[str, object]]:
    """name -> (channel of about ``size`` bytes, expected value of test 0)."""

    def answer(value: str) -> str:
        return '{"i": 0, "value": ' + value + "}"

    def filled(prefix: str, unit: str, suffix: str) -> str:
        return prefix + unit * ((size - 20 - len(prefix) - len(suffix)) // len(unit)) + suffix

    keys = max(1, size // 30)  # "[k * M, 1], " is about 30 bytes
    members = max(1, size // 25)
    pairs = ", ".join(f"[{k * HASH_MODULUS}, 1]" for k in range(keys))
    items = ", ".join(str(k * HASH_MODULUS) for k in range(members))
    text = "ab[{" * ((size - 40) // 4)
    return {
        "nested deep": ("[" * size, 3),
        "many ints": (answer(filled("[", "0,", "0]")), [0, 0, 0]),
        "many empty lists": (answer(filled("[", "[],", "[]]")), [[]] * 3),
        "shallow towers": (answer(filled("[", "[[[[]]]],", "0]")), 3),
        "decimal digits": (answer("9" * (size - 20)), 3),
        "hex digits": (answer('{"int": "' + "f" * (size - 40) + '"}'), 3),
        "dict keys sharing a hash": (
            answer('{"dict": [' + pairs + "]}"),
            dict.fromkeys(range(keys), 1),
        ),
        "set members sharing a hash": (answer('{"set": [' + items + "]}"), set(range(members))),
        "junk lines": ("x\n" * (size // 2), 3),
        "blank lines": ("\n" * size, 3),
        "a right string (passes)": (answer(json.dumps(text)), text),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=4.0, help="size of each answer")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (the best counts)")
    args = parser.parse_args()
    if not 0 < args.mib <= 4:
        parser.error(f"--mib: the channel carries at most 4 MiB, got {args.mib}")
    if args.repeat < 1:
        parser.error(f"--repeat: at least 1, got {args.repeat}")
    size = int(args.mib * 2**20) - 64
    rows = []
    for name, (channel, expected) in answers(size).items():
        plan = plan_tests({"calls": [{"function": "f", "args": [], "expected": expected}]})
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            verdict = judge(plan, channel, deadline=time.monotonic() + 60)
            best = min(best, time.perf_counter() - start)
        rows.append((name, len(channel) / 2**20, best, verdict.passed, verdict.failure))
    print(f"{'answer':<32}{'MiB':>6}{'s':>8}  verdict")
    for name, mib, seconds, passed, failure in rows:
        print(f"{name:<32}{mib:>6.2f}{seconds:>8.3f}  {'passed' if passed else failure}")
    slowest = max(rows, key=lambda row: row[2])
    print(
        json.dumps(
            {
                "benchmark": "decode_bound",
                "mib": args.mib,
                "cases": len(rows),
                "slowest": slowest[0],
                "slowest_s": round(slowest[2], 4),
                "bound_s": BOUND_S,
                "within_bound": slowest[2] <= BOUND_S,
            }
        )
    )


if __name__ == "__main__":
    main()
