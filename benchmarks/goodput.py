"""What preemptions cost: each role's recovery time, in parts, and the run's goodput.

Runs the quickstart (``configs/experiments/quickstart.gin``: parameter server, trainer,
two workers under the local supervisor) once per scenario, from the repository root,
with the same settings, in one invocation:

  clean            undisturbed: the reference
  trainer_preempt  the trainer gets SIGTERM (a preemption notice) every ``--every`` s
  worker_preempt   a worker gets SIGTERM every ``--every`` s (worker-0, worker-1, ...)
  kills            SIGKILL, no warning, every ``--every`` s: trainer, parameter server,
                   worker-0 in turn
  clean_again      the clean run once more, last (whenever another scenario ran)

The first signal goes ``--every`` s after the first step. Every run is shorter than the
quickstart (``--steps``, default 500 of its 800: about three minutes, so that the signals
come at their rate over the whole run rather than once near its end, as 300 steps
gave) and evaluates one sample per held-out
problem, never during the run: the figures are about training, not evaluation. Each
run checkpoints every ``--checkpoint-every`` steps and gives a dead worker's leases
``--lease-ttl`` s (the run's settings; the quickstart keeps 100 and 120).

Every scenario uses one compilation cache (``rlax.compile_cache.path``), filled first by a
discarded clean run of the same steps: the figures are those of a long run's steady
state, where a restarted role finds what its predecessors compiled. Without it a 300-step
run spends ~20 s of its ~130 compiling its first programs, at moments that differ from
run to run, which moved the goodput ratio by several points either way. ``--cold`` gives
each run its own empty cache (in its run directory) instead; so does a
``--gin.rlax.compile_cache.path=...`` of your own (``False`` for none: the "before").

Figures:

- recovery: from the notice (or the exit of a killed process, seen by the supervisor
  within 0.2 s) to the first useful work after the restart -- the trainer's next
  completed step, a worker's next submitted group -- in parts, as the roles record them
  (``RUN/recovery.jsonl``, the trainer's ``recovery/*`` metrics;
  :mod:`rlax.core.runtime.recovery`). The parameter server's: from its kill to the
  trainer's next completed step, of which ``serve`` is the restarted server answering.
- redone: steps trained again (completed after the checkpoint the trainer restored),
  and prompts generated again (leases that expired with their worker).
- goodput: trained tokens per wall second from the first step's start to the last
  step's end (steps done again count once), divided by the clean runs': the mean of the
  first and the last run of the invocation, both clean. Two runs of the same settings
  differ in steady pace by a few percent (the batches' shapes, the machine), as much as
  a preemption a minute costs; measuring the reference twice, around the others, halves
  what one unlucky clean run can do to every ratio (``clean_again_vs_clean`` says how
  far apart the two were).
- recompiled_after_restart: programs a restarted trainer or worker compiled before its
  first useful work although the run's compilation cache held them when it started (the
  cache's files are watched). ``new_programs_after_restart``: the programs it compiled
  that no earlier process had (a batch of a new shape).
- prompts_lost / prompts_duplicated: each run's rollout queue audited against the
  task's prompt stream (as ``benchmarks/chaos.py`` does).

    python benchmarks/goodput.py [--steps 500] [--every 60] [--scenarios ...] [--gin.NAME=VALUE ...]

Prints a table, then one JSON line: ``{"trainer_recovery_s", "worker_recovery_s",
"ps_recovery_s", "recompiled_after_restart", "goodput_trainer_60s",
"goodput_workers_60s", "prompts_lost", "prompts_duplicated", ...}`` (the goodput keys
are named after ``--every``; the recovery times are means over the preemptions, the
parameter server's over its kills).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from chaos import audit, children  # the queue audit, the process finder

from rlax.core.runtime.recovery import PARTS, read_rows
from rlax.core.runtime.run_dir import RunDir, read_json_lines

SCENARIOS: dict[str, list[tuple[str, signal.Signals]]] = {
    "clean": [],
    "trainer_preempt": [("trainer", signal.SIGTERM)],
    "worker_preempt": [("worker-0", signal.SIGTERM), ("worker-1", signal.SIGTERM)],
    "kills": [
        ("trainer", signal.SIGKILL),
        ("param_server", signal.SIGKILL),
        ("worker-0", signal.SIGKILL),
    ],
}
# The clean run again, last: the reference is the mean of the two (see the module doc).
CLEAN_AGAIN = "clean_again"


def command(run_dir: pathlib.Path, args: argparse.Namespace, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rlax.core.cli",
        "run",
        "--gin",
        "configs/experiments/quickstart.gin",
        "--run-dir",
        str(run_dir),
        f"--gin.rlax.train.steps={args.steps}",
        f"--gin.rlax.checkpointing.every={args.checkpoint_every}",
        f"--gin.rlax.param_server.lease_ttl_s={args.lease_ttl}",
        "--gin.rlax.local_cluster.max_restarts=1000",
        "--gin.rlax.train.progress=False",
        "--gin.EVAL_SAMPLES=1",
        "--gin.EVAL_KS=(1,)",
        "--gin.rlax.watch.eval_every=0",
        *extra,
    ]


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLAX_PS_", "JAX_"))}
    env["HF_HUB_OFFLINE"] = "1"
    return env


def metric_rows(run_dir: pathlib.Path) -> list[dict]:
    return read_json_lines(RunDir(run_dir).metrics)


def shared_cache(base: pathlib.Path, args, extra: list[str]) -> pathlib.Path | None:
    """The compilation cache every scenario shares, or None (``--cold``, or set in ``extra``)."""
    if args.cold or any("compile_cache.path" in e for e in extra):
        return None
    return base / "compile_cache"


def run_scenario(name: str, run_dir: pathlib.Path, args, extra) -> dict:
    """Runs one scenario; its events (time, role, signal) and what it left behind."""
    targets = SCENARIOS.get(name, [])
    cache_dir = shared_cache(run_dir.parents[1], args, extra)
    if cache_dir is not None:
        extra = [*extra, f"--gin.rlax.compile_cache.path='{cache_dir}'"]
    watched = cache_dir or RunDir(run_dir).compile_cache
    log = run_dir.parent / f"{name}.stderr"
    events: list[tuple[float, str, str]] = []
    start = time.time()
    with log.open("w") as err, (run_dir.parent / f"{name}.stdout").open("w") as out:
        proc = subprocess.Popen(
            command(run_dir, args, extra), cwd=ROOT, env=environment(), stdout=out, stderr=err
        )
        next_at, turn = None, 0
        cache: dict[str, float] = {}  # each compile-cache entry: when it was first seen
        while proc.poll() is None:
            time.sleep(0.25)
            see_entries(watched, cache)
            if not targets:
                continue
            done = len(metric_rows(run_dir))
            if next_at is None:
                next_at = time.time() + args.every if done else None
                continue
            if time.time() < next_at or done >= args.steps - args.checkpoint_every:
                continue
            role, sig = targets[turn % len(targets)]
            ready = {r: p for r, (p, age) in children(proc.pid).items() if age > args.min_age}
            if role not in ready:
                continue  # still starting after the last restart: try again shortly
            try:
                os.kill(ready[role], sig)
            except ProcessLookupError:
                continue
            events.append((time.time(), role, sig.name))
            print(f"  {name}: step {done:>4}: {sig.name} -> {role}", flush=True)
            turn += 1
            next_at = time.time() + args.every
    wall = time.time() - start
    if proc.returncode != 0:
        print(log.read_text()[-3000:], file=sys.stderr)
        raise SystemExit(f"{name}: the run failed with status {proc.returncode}")
    return {"events": events, "wall_s": wall, "stderr": log.read_text(), "cache": cache}


def see_entries(folder: pathlib.Path, seen: dict[str, float]) -> None:
    try:
        names = [p.name.removesuffix("-cache") for p in folder.iterdir()]
    except OSError:
        return
    now = time.time()
    for name in names:
        seen.setdefault(name, now)


def recompiled(rows: list[dict], cache: dict[str, float]) -> int:
    """Programs a restarted trainer or worker compiled that were in the cache before it
    started (a miss on them would be a compilation its predecessors had already done)."""
    count = 0
    for r in rows:
        if r["role"] == "param_server":
            continue
        started = r["time"] - r["total_s"] + r["stop_s"] + r["exit_s"] + r["restart_s"]
        count += sum(1 for key in r.get("compile_missed", []) if cache.get(key, started) < started)
    return count


def goodput(rows: list[dict]) -> tuple[float, float, float]:
    """(trained tokens, training wall seconds, tokens per second) of a run's final rows."""
    tokens = float(sum(r.get("trained_tokens", 0) for r in rows))
    window = rows[-1]["time"] - (rows[0]["time"] - rows[0]["step_s"])
    return tokens, window, tokens / window


def excess_s(rows: list[dict]) -> float:
    """Wall seconds a run spent beyond its own steady pace: its window less its tokens at the
    median seconds per token of its steps. Differenced against the clean run's, per signal,
    it is what each signal cost, free of the few percent by which two runs' steady pace
    differs (batch shapes, the machine) that moves the goodput ratio."""
    walls = [b["time"] - a["time"] for a, b in itertools.pairwise(rows)]
    paces = [w / r["trained_tokens"] for w, r in zip(walls, rows[1:]) if r.get("trained_tokens")]
    tokens = sum(r.get("trained_tokens", 0) for r in rows[1:])
    return sum(walls) - statistics.median(paces) * tokens


def recoveries(name: str, run_dir: pathlib.Path, events, rows) -> list[dict]:
    """The run's recovery rows, each with the scenario; the parameter server's with the
    time from its kill to the trainer's first step completed after the restarted server
    answered (a step can complete just after the kill on what it had already sent)."""
    out = []
    kills = [t for t, role, _ in events if role == "param_server"]
    for r in read_rows(run_dir):
        r = dict(r, scenario=name)
        if r["role"] == "param_server" and kills:
            killed = max((t for t in kills if t <= r["time"]), default=None)
            serving = r["time"]  # written once the restarted server answered
            after = [row["time"] for row in rows if killed is not None and row["time"] > serving]
            if after:
                r["serve_s"] = r["total_s"]
                r["total_s"] = after[0] - killed
        out.append(r)
    return out


def kind(r: dict) -> str:
    role = r["role"].split("-")[0]
    return f"{role} {r['cause']}"


def _mean(rs: list[dict], key: str) -> float:
    return statistics.fmean(r.get(key, 0.0) for r in rs)


def table(all_recoveries: list[dict]) -> list[str]:
    shown = [p for p in PARTS if any(r.get(f"{p}_s", 0) >= 0.05 for r in all_recoveries)]
    head = f"{'recovery (mean s)':<24}{'n':>3}{'total':>8}" + "".join(f"{p[:9]:>10}" for p in shown)
    lines = [head + f"{'compile':>9}{'misses':>7}{'redone':>8}"]
    for k in sorted({kind(r) for r in all_recoveries}):
        rs = [r for r in all_recoveries if kind(r) == k]
        mean = functools.partial(_mean, rs)
        cells = "".join(f"{mean(f'{p}_s'):>10.2f}" for p in shown)
        redone = f"{mean('redone_steps'):.1f} st" if k.startswith("trainer") else "-"
        serve = f"   (serving again after {mean('serve_s'):.1f} s)" if "serve_s" in rs[0] else ""
        lines.append(
            f"{k:<24}{len(rs):>3}{mean('total_s'):>8.2f}{cells}{mean('compile_s'):>9.2f}"
            f"{sum(r.get('compile_misses', 0) for r in rs):>7}{redone:>8}{serve}"
        )
    return lines


def expired_leases(run_dir: pathlib.Path) -> int:
    import sqlite3

    db = RunDir(run_dir).param_server / "queue.sqlite"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        counts = json.loads(conn.execute("SELECT value FROM meta WHERE key='counts'").fetchone()[0])
    return int(counts.get("expired_leases", 0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--every", type=float, default=60.0, help="seconds between signals")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--min-age", type=float, default=5.0, help="spare younger processes")
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--lease-ttl", type=float, default=20.0)
    parser.add_argument("--keep", type=pathlib.Path, help="keep the run directories here")
    parser.add_argument("--cold", action="store_true", help="no shared, pre-filled cache")
    args, extra = parser.parse_known_args()
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        # Its run directories would be resumed, not run: figures of two invocations mixed.
        print(f"goodput.py: --keep {args.keep}: not empty; give a new directory", file=sys.stderr)
        return 2
    names = ["clean", *[s for s in args.scenarios if s != "clean"]]
    if len(names) > 1:
        names.append(CLEAN_AGAIN)

    with tempfile.TemporaryDirectory(prefix="rlax-goodput-") as tmp:
        base = args.keep or pathlib.Path(tmp)
        results, all_recoveries = {}, []
        lost = duplicated = 0
        if shared_cache(base, args, extra) is not None:
            print("  warm-up: a clean run fills the shared compilation cache", flush=True)
            (base / "warm-up").mkdir(parents=True, exist_ok=True)
            run_scenario("warm-up", base / "warm-up" / "run", args, extra)
        for name in names:
            run_dir = base / name / "run"
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            got = run_scenario(name, run_dir, args, extra)
            rows = metric_rows(run_dir)
            steps = [r["step"] for r in rows]
            if steps != list(range(1, args.steps + 1)):
                raise SystemExit(f"{name}: metrics rows are not steps 1..{args.steps} once each")
            got["tokens"], got["window_s"], got["goodput"] = goodput(rows)
            got["excess_s"] = excess_s(rows)
            got["lost"], got["duplicated"], got["consumed"] = audit(
                RunDir(run_dir).param_server / "queue.sqlite"
            )
            got["expired_leases"] = expired_leases(run_dir)
            got["recoveries"] = recoveries(name, run_dir, got["events"], rows)
            got["restarts"] = got["stderr"].count("; restarting it (")
            got["recompiled"] = recompiled(got["recoveries"], got["cache"])
            lost += got["lost"]
            duplicated += got["duplicated"]
            all_recoveries += got["recoveries"]
            results[name] = got

    cleans = [results[n] for n in ("clean", CLEAN_AGAIN) if n in results]
    clean = statistics.fmean(c["goodput"] for c in cleans)
    clean_excess = statistics.fmean(c["excess_s"] for c in cleans)

    def cost(name: str) -> float | None:
        got = results.get(name)
        if not got or not got["events"]:
            return None
        return round((got["excess_s"] - clean_excess) / len(got["events"]), 2)

    print(
        f"\ngoodput benchmark: the quickstart ({args.steps} steps), a signal every {args.every:g} s"
    )
    print(
        f"{'scenario':<18}{'signals':>8}{'restarts':>9}{'train s':>9}{'tokens':>9}"
        f"{'tok/s':>8}{'goodput':>9}{'s/signal':>9}{'redone':>8}{'re-gen':>7}{'lost/dup':>10}"
    )
    for name, got in results.items():
        redone = sum(r.get("redone_steps", 0) for r in got["recoveries"])
        print(
            f"{name:<18}{len(got['events']):>8}{got['restarts']:>9}{got['window_s']:>9.1f}"
            f"{got['tokens']:>9.0f}{got['goodput']:>8.0f}{got['goodput'] / clean:>9.3f}"
            f"{cost(name) if got['events'] else 0:>9.1f}"
            f"{redone:>8.0f}{got['expired_leases']:>7}{got['lost']:>6}/{got['duplicated']}"
        )
    print(
        "(goodput: against the mean of the two clean runs, first and last; "
        "s/signal: wall beyond the run's steady pace, less the clean runs', per signal; "
        "redone: steps trained again; re-gen: leases expired, prompts generated again)\n"
    )
    for line in table(all_recoveries):
        print(line)

    def mean_total(role: str, cause: str | None = None) -> float | None:
        rs = [
            r["total_s"]
            for r in all_recoveries
            if r["role"].startswith(role) and (cause is None or r["cause"] == cause)
        ]
        return round(statistics.fmean(rs), 2) if rs else None

    def ratio(name: str) -> float | None:
        return round(results[name]["goodput"] / clean, 4) if name in results else None

    tag = f"{args.every:g}s"
    restarted = [r for r in all_recoveries if r["role"] != "param_server"]
    new_programs = sum(int(r.get("compile_misses", 0)) for r in restarted)
    print(
        f"\nafter restarts: {new_programs} programs compiled (shapes no earlier process had "
        f"met), {sum(g['recompiled'] for g in results.values())} compiled again"
    )
    figures = {
        "trainer_recovery_s": mean_total("trainer", "preempted"),
        "worker_recovery_s": mean_total("worker", "preempted"),
        "ps_recovery_s": mean_total("param_server"),
        "trainer_kill_recovery_s": mean_total("trainer", "killed"),
        "worker_kill_recovery_s": mean_total("worker", "killed"),
        "recompiled_after_restart": sum(g["recompiled"] for g in results.values()),
        "new_programs_after_restart": new_programs,
        f"goodput_trainer_{tag}": ratio("trainer_preempt"),
        f"goodput_workers_{tag}": ratio("worker_preempt"),
        "trainer_preemption_cost_s": cost("trainer_preempt"),
        "worker_preemption_cost_s": cost("worker_preempt"),
        f"goodput_kills_{tag}": ratio("kills"),
        "prompts_lost": lost,
        "prompts_duplicated": duplicated,
        "clean_again_vs_clean": (
            round(cleans[-1]["goodput"] / cleans[0]["goodput"], 4) if len(cleans) > 1 else None
        ),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
