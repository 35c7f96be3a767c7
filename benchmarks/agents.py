"""The agent quickstart, measured: held-out success before and after RL, and the endpoint's cost.

For each seed, runs ``rlax run --gin multiturn_quickstart`` (higher/lower played
by the in-process ``guess`` Environment) and then ``rlax run --gin
agents_quickstart`` (the same game played by ``agents.guess``, plain
``openai``-client code, over the OpenAI-compatible endpoint), same steps, same
settings, same seed, interleaved (env s0, agent s0, env s1, ...) so the load of
the machine falls on both alike. Each run is a subprocess in a fresh temporary
directory (:func:`multiturn.run_quickstart`): parameter server, trainer, two
workers. Success is held-out pass@1 over every secret, from the run's own
"before" and "after" evaluation rows.

    python benchmarks/agents.py [--seeds 0,1,2] [--steps N] [--gin.NAME=VALUE ...]

Prints a table, then one JSON line::

    {"success_gain_min": <worst agent gain, points>, "max_wall_s": <worst agent wall>,
     "endpoint_vs_env": <sum of agent walls / sum of env walls>, ...}
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import multiturn  # sibling script

GAIN_POINTS, WALL_LIMIT_S, RATIO_LIMIT = 20, 600, 1.25
ENV, AGENT = "multiturn_quickstart", "agents_quickstart"


def one(gin: str, seed: int, steps: int | None, extra: list[str]) -> dict:
    settings = [f"--gin.SEED={seed}", *extra]
    if steps is not None:
        settings.append(f"--gin.rlax.train.steps={steps}")
    results, rows, wall = multiturn.run_quickstart(gin, settings)
    before, after = results["before"]["pass@1"], results["after"]["pass@1"]
    return {
        "before": round(100 * before, 1),
        "after": round(100 * after, 1),
        "gain": round(100 * (after - before), 1),
        "wall_s": round(wall, 1),
        "steps": len(rows),
    }


def measure(seeds: list[int], steps: int | None, extra: list[str]) -> dict:
    runs = []
    for seed in seeds:
        env = one(ENV, seed, steps, extra)
        agent = one(AGENT, seed, steps, extra)
        runs.append({"seed": seed, "env": env, "agent": agent})
        print(f"seed {seed}: env {env}  agent {agent}", flush=True)
    agent_wall = sum(r["agent"]["wall_s"] for r in runs)
    env_wall = sum(r["env"]["wall_s"] for r in runs)
    return {
        "success_gain_min": min(r["agent"]["gain"] for r in runs),
        "max_wall_s": max(r["agent"]["wall_s"] for r in runs),
        "endpoint_vs_env": round(agent_wall / env_wall, 3),
        "env_gain_min": min(r["env"]["gain"] for r in runs),
        "seeds": seeds,
        "steps": runs[0]["agent"]["steps"],
        "runs": runs,
    }


def table(r: dict) -> None:
    print("\nagent quickstart: held-out success (pass@1 over every secret, %), wall s")
    head = ("seed", "before", "after", "gain", "wall", "env gain", "env wall", "ratio")
    print("".join(f"{h:>10}" for h in head))
    for run in r["runs"]:
        a, e = run["agent"], run["env"]
        cells = (run["seed"], a["before"], a["after"], a["gain"], a["wall_s"])
        cells += (e["gain"], e["wall_s"], round(a["wall_s"] / e["wall_s"], 3))
        print("".join(f"{c:>10}" for c in cells))
    print(
        f"worst gain {r['success_gain_min']:+.1f} points (target >= +{GAIN_POINTS}); "
        f"worst wall {r['max_wall_s']} s (limit {WALL_LIMIT_S}); endpoint / env "
        f"{r['endpoint_vs_env']} (limit {RATIO_LIMIT})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (config's: 100)")
    args, extra = parser.parse_known_args()
    bad = [a for a in extra if not a.startswith("--gin.")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (only --gin.NAME=VALUE passes on)")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    if not seeds:
        parser.error("--seeds: at least one seed")
    try:
        r = measure(seeds, args.steps, extra)
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    table(r)
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
