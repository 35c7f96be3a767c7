"""The quickstart under chaos: random roles get SIGTERM or SIGKILL every few seconds.

Runs the README's quickstart (``rlax run --gin configs/experiments/quickstart.gin``: parameter
server, trainer, two workers under the local supervisor) twice from the
repository root, with the same settings:

  clean   undisturbed
  chaos   every ``--interval`` seconds (uniform in [lo, hi]) one child chosen at
          random — parameter server, trainer or a worker, once it has run for
          a few seconds — gets SIGTERM (a preemption notice: it stops at its next
          safe point, exit status 75) or SIGKILL (no warning), until the trainer
          reaches its last step. The supervisor restarts it
          (``max_restarts`` is raised for this).

Both runs checkpoint every ``--checkpoint-every`` steps and give a dead
worker's leases ``--lease-ttl`` seconds (the quickstart's defaults are 100 steps
and 120 s: a long run's settings). Afterwards the chaos run's rollout queue
(``RUN/param_server/queue.sqlite``) is audited against the task's prompt
stream: every prompt drawn must be in exactly one place (consumed once, or
still waiting). ``prompts_lost`` counts drawn prompts found nowhere,
``prompts_duplicated`` prompts found more than once (consumed twice included).
pass@8 is the run's own held-out evaluation after training (eval.json).

    python benchmarks/chaos.py [--steps 600] [--interval 5 15] [--seed 0] [--gin.NAME=VALUE ...]

Prints a table, then one JSON line:
``{"preemptions", "restarts", "steps", "prompts_lost", "prompts_duplicated",
"pass8_after", "pass8_clean"}``.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import pathlib
import random
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROLES = ("param_server", "trainer", "worker-0", "worker-1")


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
        "--gin.rlax.local_cluster.max_restarts=100000",
        "--gin.rlax.train.progress=False",
        *extra,
    ]


def environment(cache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLAX_PS_")}
    # Restarted processes compile the same programs again: keep them in a shared cache.
    env.update(
        HF_HUB_OFFLINE="1",
        JAX_COMPILATION_CACHE_DIR=cache,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    )
    return env


def children(pid: int) -> dict[str, tuple[int, float]]:
    """Live children of the supervisor: role -> (pid, seconds alive)."""
    found = {}
    tick = os.sysconf("SC_CLK_TCK")
    uptime = float(pathlib.Path("/proc/uptime").read_text().split()[0])
    try:
        kids = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return found
    for child in kids:
        try:
            argv = pathlib.Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            env = pathlib.Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            started = int(
                pathlib.Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[19]
            )
        except (OSError, IndexError, ValueError):
            continue
        role = argv[argv.index(b"--role") + 1].decode() if b"--role" in argv else "?"
        if role == "worker":
            ids = [e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"RLAX_WORKER_ID=")]
            role = ids[0] if ids else role
        found[role] = (int(child), uptime - started / tick)
    return found


def rows(run_dir: pathlib.Path) -> int:
    path = run_dir / "metrics.jsonl"
    return sum(1 for _ in path.open()) if path.exists() else 0


def run_clean(run_dir, args, extra, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(run_dir, args, extra),
        cwd=ROOT,
        env=env,
        check=False,
        capture_output=True,
        text=True,
    )


def run_chaos(run_dir, args, extra, env) -> tuple[subprocess.Popen, list, str, str]:
    rng = random.Random(args.seed)
    log = run_dir.parent / "chaos.stderr"
    with log.open("w") as err, (run_dir.parent / "chaos.stdout").open("w") as out:
        proc = subprocess.Popen(
            command(run_dir, args, extra), cwd=ROOT, env=env, stdout=out, stderr=err
        )
        events = []
        next_at = time.monotonic() + rng.uniform(*args.interval)
        while proc.poll() is None:
            time.sleep(0.2)
            if time.monotonic() < next_at or rows(run_dir) >= args.steps:
                continue
            ready = {r: pid for r, (pid, age) in children(proc.pid).items() if age > args.min_age}
            if ready:
                role = rng.choice(sorted(ready))
                sig = rng.choice((signal.SIGTERM, signal.SIGKILL))
                try:
                    os.kill(ready[role], sig)
                    events.append((round(time.monotonic(), 1), role, sig.name, rows(run_dir)))
                    print(f"  step {events[-1][3]:>4}: {sig.name} -> {role}", flush=True)
                except ProcessLookupError:
                    pass
            next_at = time.monotonic() + rng.uniform(*args.interval)
    return proc, events, log.read_text(), (run_dir.parent / "chaos.stdout").read_text()


def audit(db: pathlib.Path) -> tuple[int, int, int]:
    """(lost, duplicated, consumed) against the quickstart task's prompt stream."""
    from rlax.core.models.bundle import load_model
    from rlax.core.param_server import rlax_pb2 as pb
    from rlax.plugins.tasks.arithmetic import ArithmeticTask

    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        counts = json.loads(conn.execute("SELECT value FROM meta WHERE key='counts'").fetchone()[0])
        found = [r[0] for r in conn.execute("SELECT prompt_id FROM consumed")]
        found += [pb.PromptMsg.FromString(r[0]).id for r in conn.execute("SELECT prompt FROM pool")]
        found += [
            pb.PromptMsg.FromString(r[0]).id for r in conn.execute("SELECT prompt FROM leases")
        ]
        for table in ("queued", "taken"):
            found += [
                pb.GroupMsg.FromString(r[0]).prompt.id
                for r in conn.execute(f"SELECT grp FROM {table}")
            ]
        consumed = conn.execute("SELECT COUNT(*) FROM consumed").fetchone()[0]
    # configs/experiments/quickstart.gin's task (the chaos run uses it unchanged), seed 0.
    task = ArithmeticTask(digits=2, operations="+", eval_fraction=0.1, num_eval=200)
    stream = task.prompts(
        "train", tokenizer=load_model(ROOT / "assets/quickstart-base").tokenizer, seed=0
    )
    drawn = collections.Counter(next(stream).id for _ in range(counts["cursor"]))
    places = collections.Counter(found)
    lost = sum((drawn - places).values())
    duplicated = sum((places - drawn).values())
    return lost, duplicated, consumed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--interval", type=float, nargs=2, default=(5.0, 15.0))
    parser.add_argument(
        "--min-age", type=float, default=8.0, help="spare processes younger than this"
    )
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--lease-ttl", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-clean", action="store_true", help="chaos run only")
    parser.add_argument("--keep", type=pathlib.Path, help="copy the chaos run's logs here")
    args, extra = parser.parse_known_args()

    with tempfile.TemporaryDirectory(prefix="rlax-chaos-") as tmp:
        tmp = pathlib.Path(tmp)
        env = environment(str(tmp / "jax-cache"))
        pass8_clean = math.nan
        if not args.skip_clean:
            start = time.perf_counter()
            clean = run_clean(tmp / "clean" / "run", args, extra, env)
            if clean.returncode != 0:
                print(clean.stderr[-3000:], file=sys.stderr)
                return 1
            clean_s = time.perf_counter() - start
            pass8_clean = json.loads((tmp / "clean/run/eval.json").read_text())["after"]["pass@8"]
        (tmp / "chaos").mkdir()
        start = time.perf_counter()
        proc, events, err, out = run_chaos(tmp / "chaos" / "run", args, extra, env)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            (args.keep / "chaos.stderr").write_text(err)
            (args.keep / "chaos.stdout").write_text(out)
        chaos_s = time.perf_counter() - start
        if proc.returncode != 0:
            print(err[-3000:], file=sys.stderr)
            return 1
        run_dir = tmp / "chaos" / "run"
        results = json.loads((run_dir / "eval.json").read_text())
        steps_done = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").open()]
        lost, duplicated, consumed = audit(run_dir / "param_server" / "queue.sqlite")

    restarts = len(re.findall(r"; restarting it \(", err))
    # Exits nobody asked for (a process failing on its own).
    crashes = re.findall(r"rlax: (\S+) \(pid \d+\) died with status \d+", err)
    pass8 = results["after"]["pass@8"]
    noise = 2 * math.sqrt(max(pass8_clean, 1e-3) * (1 - min(pass8_clean, 0.999)) / 200)
    by = collections.Counter((role.split("-")[0], sig) for _, role, sig, _ in events)
    print("\nchaos benchmark: the quickstart while random roles are preempted or killed")
    print(
        f"{'signals sent':<34}{len(events):>8}   "
        + ", ".join(f"{r} {s}: {n}" for (r, s), n in sorted(by.items()))
    )
    print(f"{'restarts by the supervisor':<34}{restarts:>8}")
    print(f"{'exits not caused by a signal':<34}{len(crashes):>8}   {', '.join(crashes)}")
    print(
        f"{'steps (each once in metrics)':<34}{len(set(steps_done)):>8}   "
        f"rows {len(steps_done)}, expected {args.steps}"
    )
    print(f"{'prompts consumed':<34}{consumed:>8}")
    print(f"{'prompts lost / duplicated':<34}{lost:>4} / {duplicated}")
    print(
        f"{'pass@8 after, chaos / clean':<34}{pass8:>8.3f} / {pass8_clean:.3f}   "
        f"(2 s.e. over 200 problems: {noise:.3f})"
    )
    if not args.skip_clean:
        print(f"{'wall time, chaos / clean':<34}{chaos_s:>7.0f}s / {clean_s:.0f}s")
    figures = {
        "preemptions": len(events),
        "restarts": restarts,
        "steps": len(set(steps_done)) if len(steps_done) == len(set(steps_done)) else -1,
        "prompts_lost": lost,
        "prompts_duplicated": duplicated,
        "pass8_after": round(pass8, 4),
        "pass8_clean": None if math.isnan(pass8_clean) else round(pass8_clean, 4),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
