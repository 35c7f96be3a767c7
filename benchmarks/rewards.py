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

Then the red-team table: every program of
``tests/plugins/rewards/hostile/cases.py`` run once through the code reward
(the minimal world), each counted as *contained* (score 0, no process of the
sandbox uid left, no trace in the host's temp dir, the target dir, canary and
loopback listener untouched), *forged* (a forging program scored above 0),
*escaped* (a containment program scored above 0 or left a process) and *host
touched* (a file or connection on the host side).

Then the cost of the sandbox's isolation per program: the same right program
through today's sandbox (its own user namespace, the system-call filter, the
run's cgroup) and through the sandbox of ``--isolation-baseline`` (a git
revision: root's namespaces only), interleaved, medians of
``--isolation-runs`` each.

    python benchmarks/rewards.py [--math N] [--code N] [--hostile N] [--workers W] [--timeout S]
                                 [--no-red-team] [--math-timeout S] [--isolation-runs N]
                                 [--isolation-baseline REV] [--isolation-before REV]

Prints the tables, then one JSON line: ``{"serial_scores_s", "pool_scores_s",
"speedup", "timeouts_contained", "isolation_s_per_program",
"baseline_s_per_program", "isolation_cost_ratio", "isolation_baseline",
"red_team", "contained", "forged", "escaped", "host_touched",
"math_adversarial", "math_adversarial_within_timeout", "slowest_math_input",
"slowest_math_s", "slowest_math_of_timeout", "before_call_s_per_program",
"after_call_s_per_program", "issue54_call_cost_ratio", "before_stdio_s_per_program",
"after_stdio_s_per_program", "issue54_stdio_cost_ratio", "isolation_before",
"pool_code_scores_s_before", "pool_code_scores_s_after", "pool_throughput_ratio",
"agreement"}``.

Issue 54's cost: a call-style and a stdin/stdout program through today's
sandbox and through ``--isolation-before``'s (default ``7cd40cf``, before the
argument-level filter and the per-case sweep), interleaved; and the code reward's pool throughput with each sandbox
(``pool_throughput_ratio``, today's over the older's). ``agreement``:
the verifiers' agreement with every labelled table of the tests, by table
(``math_table``, its ``math_units_and_forms`` rows, ``math_verify_failures``,
``code_honest``, ``code_right``).

Last, the adversarial math inputs of ``tests/plugins/rewards/math_adversarial.py``
(power towers, huge factorials, 100 k characters of boxes...) scored in this
process under ``--math-timeout``: the slowest and how many returned within it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import runpy
import socket
import sys
import tempfile
import time

import numpy as np

from rlax.core.rollout.reward_pool import RewardPool
from rlax.core.types import Prompt
from rlax.plugins.rewards.code.verifier import CodeReward
from rlax.plugins.rewards.math.verifier import MathReward

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


CASES = pathlib.Path(__file__).resolve().parents[1] / "tests/plugins/rewards/hostile/cases.py"
ADVERSARIAL = (
    pathlib.Path(__file__).resolve().parents[1] / "tests/plugins/rewards/math_adversarial.py"
)


def _uid_traces(uid: int) -> list[str]:
    """Live processes of ``uid`` and entries it owns in the host's temp dir."""
    found = [f"process {pid}" for pid in runpy.run_path(str(CASES))["processes_of"](uid)]
    for entry in os.scandir(tempfile.gettempdir()):
        try:
            if entry.stat(follow_symlinks=False).st_uid == uid or "rlax-hostile" in entry.name:
                found.append(f"file {entry.name}")
        except OSError:
            continue
    return found


def red_team() -> tuple[list[tuple], dict[str, int]]:
    """Every hostile program of the suite, once, through the code reward."""
    cases = runpy.run_path(str(CASES))
    reward = CodeReward(**cases["LIMITS"])  # the limits the table is written against
    rows, counts = [], {"contained": 0, "forged": 0, "escaped": 0, "host_touched": 0}
    with tempfile.TemporaryDirectory(prefix="rlax-red-team-") as hostdir:
        canary = pathlib.Path(hostdir) / "canary.txt"
        canary.write_text("do not touch")
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        fills = {
            "PORT": str(server.getsockname()[1]),
            "HOSTDIR": hostdir,
            "CANARY": str(canary),
            "PROJECT": str(CASES.parents[4]),
            "SECRET": repr("red-team-secret"),
        }
        for name, (kind, problem, source) in cases["HOSTILE"].items():
            for key, value in fills.items():
                source = source.replace(key, value)
            task = prompt(cases["TESTS"][problem], 0)
            start = time.perf_counter()
            result = reward.run(task, source)
            score, elapsed = reward.judge(result).score, time.perf_counter() - start
            touched = _uid_traces(result.uid)
            try:
                server.accept()[0].close()
                touched.append("loopback connection")
            except BlockingIOError:
                pass
            if canary.read_text() != "do not touch" or len(os.listdir(hostdir)) != 1:
                touched.append("target dir")
            wrong = score > 0 or any(t.startswith("process") for t in touched)
            # A decode case that scores is a forged verdict too (the caller was stalled or fooled).
            forged = wrong and kind in ("forge", "decode")
            escaped = wrong and kind == "contain"
            counts["forged"] += forged
            counts["escaped"] += escaped
            counts["host_touched"] += bool(touched)
            counts["contained"] += not (forged or escaped or touched)
            rows.append((name, kind, score, result.status, elapsed, ", ".join(touched)))
        server.close()
    return rows, counts


def print_red_team(rows: list[tuple], counts: dict[str, int]) -> None:
    print(f"\nred team: {len(rows)} hostile programs in the minimal world\n")
    print(f"{'program':<48}{'kind':>8}{'score':>7}{'status':>12}{'s':>7}  host touched")
    for name, kind, score, status, elapsed, touched in rows:
        print(f"{name[:47]:<48}{kind:>8}{score:>7.1f}{status:>12}{elapsed:>7.2f}  {touched or '-'}")
    print(
        f"contained {counts['contained']}/{len(rows)}, forged {counts['forged']}, "
        f"escaped {counts['escaped']}, host touched {counts['host_touched']}"
    )


def _package_at(rev: str, into: pathlib.Path) -> str:
    """Extracts git ``rev``'s ``plugins/rewards`` under ``into`` as a package of its own (its
    ``rlax.plugins.rewards`` imports pointed there); returns the package's name."""
    import io
    import subprocess
    import tarfile

    root = CASES.parents[4]
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", rev, "plugins/rewards"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    package = f"rlax_rewards_{rev}_{into.name}".replace("-", "_")  # one per extraction
    folder = (into / "plugins" / "rewards").rename(into / package)
    for path in folder.rglob("*.py"):
        path.write_text(path.read_text().replace("rlax.plugins.rewards.", f"{package}."))
    return package


def _sandbox_at(rev: str, into: pathlib.Path):
    """The code sandbox as it was at git ``rev``: that revision's ``plugins/rewards`` folder,
    imported as a package of its own, so its own supervisor, world and harness run. Returns
    its ``run_tests`` and ``plan_tests``."""
    import importlib

    package = _package_at(rev, into)
    sys.path.insert(0, str(into))
    try:  # the flat layout (before the verifiers' sub-packages) or today's
        sandbox = importlib.import_module(f"{package}.code_sandbox")
        plan = importlib.import_module(f"{package}.code_tests")
    except ModuleNotFoundError:
        sandbox = importlib.import_module(f"{package}.code.sandboxed")
        plan = importlib.import_module(f"{package}.code.plan")
    finally:
        sys.path.remove(str(into))
    return sandbox.run_tests, plan.plan_tests


PROGRAMS = {  # a right program per harness mode: its tests, its source
    "call": (
        {"asserts": ["assert f(3) == 9", "assert f(-2) == 4"]},
        "def f(x):\n    return x * x\n",
    ),
    "stdio": (
        {"stdio": [["1 2 3\n", "6\n"], ["10 -3\n", "7\n"], ["5\n", "5\n"]]},
        "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n",
    ),
}


def isolation_cost(n: int, baseline: str, mode: str = "call") -> dict[str, object]:
    """Seconds per program through today's sandbox and through ``baseline``'s, interleaved.

    Today's adds to every run a user namespace, the system-call filter and the
    run's cgroup; ``baseline`` (default: the sandbox before them) had root's
    namespaces only. Same program, tests and limits, one after the other.
    """
    from rlax.plugins.rewards.code.plan import plan_tests
    from rlax.plugins.rewards.code.sandboxed import run_tests

    asserts, program = PROGRAMS[mode]
    with tempfile.TemporaryDirectory(prefix="rlax-baseline-") as where:
        try:
            old_run, old_plan = _sandbox_at(baseline, pathlib.Path(where))
        except Exception as exc:  # noqa: BLE001 -- no git, no such revision: say so, go on
            print(f"\nisolation cost: no baseline {baseline!r} ({exc})")
            return {"isolation_s_per_program": None, "isolation_cost_ratio": None}
        runs = {"today": (run_tests, plan_tests(asserts)), "baseline": (old_run, old_plan(asserts))}
        times: dict[str, list[float]] = {"today": [], "baseline": []}
        for i in range(2 * n + 2):  # the first of each warms up
            which = ("today", "baseline")[i % 2]
            run, plan = runs[which]
            start = time.perf_counter()
            result = run(program, plan)
            if result.status != "passed":
                raise RuntimeError(f"isolation cost: {which} sandbox: {result}")
            if i >= 2:
                times[which].append(time.perf_counter() - start)
            if which == "today":
                peak = result.isolation.get("memory_peak_mb")
    today, before = float(np.median(times["today"])), float(np.median(times["baseline"]))
    print(
        f"\nisolation cost per {mode} program (median of {n}): today {today * 1e3:.0f} ms, "
        f"{baseline} {before * 1e3:.0f} ms, ratio {today / before:.2f}x (last peak {peak} MB)"
    )
    return {
        "isolation_s_per_program": round(today, 4),
        "baseline_s_per_program": round(before, 4),
        "isolation_cost_ratio": round(today / before, 3),
        "isolation_baseline": baseline,
    }


def pool_before_after(n: int, rev: str, workers: int, rounds: int = 3) -> dict[str, object]:
    """The code reward's pool throughput (scores/s) with today's sandbox and ``rev``'s,
    interleaved, medians of ``rounds`` each: the same items, workers and timeout."""
    import importlib

    prompts, texts = code_items(n, 0)
    with tempfile.TemporaryDirectory(prefix="rlax-pool-") as where:
        try:
            package = _package_at(rev, pathlib.Path(where))
            sys.path.insert(0, where)  # the pool's workers unpickle the old reward from there
            old = importlib.import_module(f"{package}.code.verifier").CodeReward
        except Exception as exc:  # noqa: BLE001 -- no git, no such revision: say so, go on
            print(f"\npool throughput: no revision {rev!r} ({exc})")
            return {}
        try:
            rewards = {"after": CodeReward(cpu_s=2, wall_s=10), "before": old(cpu_s=2, wall_s=10)}
            rates: dict[str, list[float]] = {"after": [], "before": []}
            for i in range(2 * rounds):
                which = ("after", "before")[i % 2]
                _, seconds, result = pooled(rewards[which], prompts, texts, workers, 30.0)
                if result.errors or result.timeouts:
                    raise RuntimeError(f"pool throughput: {which}: {result.reasons[:3]}")
                rates[which].append(n / seconds)
        finally:
            sys.path.remove(where)
    after, before = float(np.median(rates["after"])), float(np.median(rates["before"]))
    print(
        f"\ncode pool throughput (median of {rounds}, {workers} workers): today {after:.1f}/s, "
        f"{rev} {before:.1f}/s, ratio {after / before:.2f}x"
    )
    return {
        "pool_code_scores_s_before": round(before, 2),
        "pool_code_scores_s_after": round(after, 2),
        "pool_throughput_ratio": round(after / before, 3),
    }


def labelled_agreement() -> dict[str, float]:
    """The verifiers' agreement with every labelled table of the tests, table by table.

    Math: ``math_table.py``'s ``TABLE`` (with, counted apart, issue 54's
    ``UNITS_AND_FORMS``) and ``test_math_reward.py``'s math-verify failures,
    scored in this process; code: the hostile table's honest programs (right
    scores 1, wrong 0) and right programs (1), through the sandbox.
    """
    tests = CASES.parents[1]
    sys.path.insert(0, str(tests))
    try:
        table = runpy.run_path(str(tests / "math_table.py"))
        failures = runpy.run_path(str(tests / "test_math_reward.py"))["MATH_VERIFY_FAILURES"]
    finally:
        sys.path.remove(str(tests))
    math_reward = MathReward(timeout_s=10.0)

    def math_agree(rows) -> float:
        hits = [
            (math_reward.score(prompt(gold, 0), text).score == 1.0) == ok for text, gold, ok in rows
        ]
        return sum(hits) / len(hits)

    cases = runpy.run_path(str(CASES))
    code_reward = CodeReward(**cases["LIMITS"])

    def code_score(tests_: object, text: str) -> float:
        return code_reward.score(prompt(tests_, 0), text).score

    honest = [
        code_score(cases["TESTS"][problem], right) == 1.0
        and code_score(cases["TESTS"][problem], wrong) == 0.0
        for problem, (right, wrong) in cases["HONEST"].items()
    ]
    right = [code_score(t, p) == 1.0 for t, p in cases["RIGHT"].values()]
    agreement = {
        "math_table": math_agree(table["TABLE"]),
        "math_units_and_forms": math_agree(table["UNITS_AND_FORMS"]),
        "math_verify_failures": math_agree(failures),
        "code_honest": sum(honest) / len(honest),
        "code_right": sum(right) / len(right),
    }
    print("\nagreement with the labelled tables\n")
    for name, value in agreement.items():
        print(f"{name:<24}{value:>8.1%}")
    return {name: round(value, 4) for name, value in agreement.items()}


def adversarial_math(timeout_s: float) -> dict[str, object]:
    """Every adversarial math input of the tests, scored in this process under ``timeout_s``.

    The baseline is the deadline itself: an input that ran past it would mean
    a deadline some library swallowed (the pool's process kill is not used).
    """
    rows = runpy.run_path(str(ADVERSARIAL))["score_adversarial"](timeout_s)
    print(f"\nadversarial math inputs, in-process, timeout {timeout_s:g}s\n")
    print(f"{'input':<40}{'chars':>9}{'score':>7}{'s':>7}")
    inputs = runpy.run_path(str(ADVERSARIAL))
    every = [*inputs["ADVERSARIAL"], *inputs.get("NOTATIONS", [])]
    lengths = {name: len(text) for name, text, _ in every}
    for name, score, seconds, _ in rows:
        print(f"{name[:39]:<40}{lengths[name]:>9}{score:>7.1f}{seconds:>7.2f}")
    name, _, seconds, _ = max(rows, key=lambda row: row[2])
    within = sum(s <= timeout_s for _, _, s, _ in rows)
    print(
        f"slowest: {name} {seconds:.2f}s = {seconds / timeout_s:.2f} of the timeout; "
        f"{within}/{len(rows)} within it"
    )
    return {
        "math_adversarial": len(rows),
        "math_adversarial_within_timeout": within,
        "slowest_math_input": name,
        "slowest_math_s": round(seconds, 3),
        "slowest_math_of_timeout": round(seconds / timeout_s, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--math", type=int, default=300, help="math items")
    parser.add_argument("--code", type=int, default=40, help="code items")
    parser.add_argument("--hostile", type=int, default=2, help="code items that hang")
    parser.add_argument("--workers", type=int, default=max(2, os.cpu_count() or 2))
    parser.add_argument("--timeout", type=float, default=2.0, help="pool per-call timeout, s")
    parser.add_argument("--no-red-team", action="store_true", help="skip the red-team table")
    parser.add_argument(
        "--math-timeout",
        type=float,
        default=2.0,
        help="in-process timeout of the adversarial math inputs, s",
    )
    parser.add_argument(
        "--isolation-runs", type=int, default=20, help="programs per sandbox for the cost"
    )
    parser.add_argument(
        "--isolation-baseline",
        default="96aa647",
        help="git revision whose sandbox the isolation cost is measured against "
        "(default: the last one with root's namespaces only, before issue 35)",
    )
    parser.add_argument(
        "--isolation-before",
        default="7cd40cf",
        help="git revision of the sandbox before issue 54 (argument filter, per-case sweep)",
    )
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
    print(
        f"{'':<6}{'items':>7}{'serial/s':>10}{'pool/s':>9}{'speedup':>9}"
        f"{'pool start':>12}{'timeouts':>10}{'same scores':>13}"
    )
    for name, n, s, p, st, to, agree in rows:
        print(
            f"{name:<6}{n:>7}{n / s:>10.1f}{n / p:>9.1f}{s / p:>8.2f}x"
            f"{st:>11.2f}s{to:>10}{'yes' if agree else 'NO':>13}"
        )
    figures = {
        "serial_scores_s": round(totals["items"] / totals["serial_s"], 1),
        "pool_scores_s": round(totals["items"] / totals["pool_s"], 1),
        "speedup": round(totals["serial_s"] / totals["pool_s"], 2),
        "timeouts_contained": totals["timeouts"],
    }
    if args.isolation_runs > 0:
        figures |= isolation_cost(args.isolation_runs, args.isolation_baseline)
        for mode in PROGRAMS:  # issue 54's cost: the argument filter, the per-case sweep
            cost = isolation_cost(args.isolation_runs, args.isolation_before, mode)
            figures |= {
                f"before_{mode}_s_per_program": cost.get("baseline_s_per_program"),
                f"after_{mode}_s_per_program": cost.get("isolation_s_per_program"),
                f"issue54_{mode}_cost_ratio": cost.get("isolation_cost_ratio"),
            }
        figures["isolation_before"] = args.isolation_before
        figures |= pool_before_after(args.code, args.isolation_before, args.workers)
    figures |= {"agreement": labelled_agreement()}
    if not args.no_red_team:
        red_rows, counts = red_team()
        print_red_team(red_rows, counts)
        figures |= {"red_team": len(red_rows), **counts}
    figures |= adversarial_math(args.math_timeout)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
