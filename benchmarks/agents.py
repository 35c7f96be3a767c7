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

Then the same game through the other two APIs harnesses speak, for each of
``--harness-seeds``: ``agents.guess_responses`` (the Responses API) and
``agents.guess_messages`` (the Messages API, an ``anthropic`` client).

Then the model-sized workload (``--model-steps``, 0: skipped): SmolLM2 as the
policy, the agent ``agents_calculator`` (the calculator agent, plain ``openai``
code with a tool; turns of tens of tokens) and its environment twin
``environments_calculator`` (``environments.calculator``: the same conversation,
token for token, played in process; the same model, task, group, limits and
seed), same steps: ``endpoint_vs_env_model`` is the agent's wall over the
environment's, so what the endpoint, the HTTP client and the recording cost on
turns of a real model's size.

``server_cpu_ms_per_request``: the endpoint's own CPU per request, measured
in this process before the runs: guess conversations of 5 turns on the
quickstart's tokenizer and chat template, a sampler that costs nothing, each
request through the in-process transport (:mod:`rlax.core.rollout.agents.in_process`)
with its thread's CPU time around the call (the app, the turn, the recording;
not the ``openai`` client's own work).

    python benchmarks/agents.py [--seeds 0,1,2] [--harness-seeds 0,1] [--steps N]
        [--model-steps N] [--model-only] [--tiny] [--gin.NAME=VALUE ...]

``--tiny``: one seed of everything, 2 steps (the SmolLM2 pair 1 step): proves
the pieces run, measures nothing. Prints a table, then one JSON line::

    {"success_gain_min": <worst agent gain, points>, "max_wall_s": <worst agent wall>,
     "endpoint_vs_env": <sum of agent walls / sum of env walls>,
     "harness_gain_min": {"responses": ..., "messages": ...},
     "endpoint_vs_env_model": ..., "server_cpu_ms_per_request": ..., ...}
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import multiturn  # sibling script

GAIN_POINTS, WALL_LIMIT_S, RATIO_LIMIT, MODEL_RATIO_LIMIT, CPU_LIMIT_MS = 20, 600, 1.25, 1.15, 0.5
ENV, AGENT = "multiturn_quickstart", "agents_quickstart"
HARNESSES = {"responses": "@agents.guess_responses", "messages": "@agents.guess_messages"}
MODEL_ENV, MODEL_AGENT = "environments_calculator", "agents_calculator"
MODEL_GROUP = 4  # both runs' GROUP_SIZE, set here so a step's episodes are known


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


def server_cpu_ms_per_request(episodes: int = 200) -> float:
    """The endpoint's CPU per request (see the module docstring), in milliseconds."""
    import time

    import numpy as np

    from rlax.core.models.tokenizer import CharTokenizer
    from rlax.core.rollout.agents.chat_tokenizer import with_chat_template
    from rlax.core.rollout.agents.endpoint import AgentEndpoint
    from rlax.core.rollout.agents.in_process import http_package, transports
    from rlax.core.types import Completion
    from rlax.plugins.environments.guess import ALPHABET

    template = (
        "{{ bos_token }}{% for m in messages %}{{ m['content'] }}"
        "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
    )
    tok = with_chat_template(CharTokenizer(ALPHABET), template)
    reply = np.r_[tok.encode("16"), tok.eos_id].astype(np.int32)

    class Free:  # a sampler that costs nothing: the reply "16"
        temperature, max_new_tokens = 1.0, 3

        def generate(self, prompts, n, *, seed):
            c = Completion(reply, np.zeros(len(reply), np.float32), "16", "stop", 0)
            return [(c,) * n for _ in prompts]

    import openai

    http = http_package(openai.DefaultHttpxClient)
    endpoint = AgentEndpoint(sampler=Free(), tokenizer=tok, model="rlax-policy")
    inline, _ = transports(endpoint.app, http)
    messages: list[dict] = [{"role": "user", "content": "?"}]
    bodies = []
    for _ in range(5):
        bodies.append(json.dumps({"model": "rlax-policy", "messages": list(messages)}).encode())
        messages += [{"role": "assistant", "content": "16"}, {"role": "user", "content": "<"}]
    cpu, count = 0.0, 0
    for e in range(episodes + 20):  # the first 20: warm-up, not counted
        key = endpoint.open_episode(f"cpu/{e}")
        head = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        url = "http://in-process/v1/chat/completions"
        requests = [http.Request("POST", url, headers=head, content=b) for b in bodies]
        start = time.thread_time()
        for r in requests:
            if inline.handle_request(r).status_code != 200:
                raise RuntimeError("server_cpu_ms_per_request: a request was refused")
        if e >= 20:
            cpu, count = cpu + time.thread_time() - start, count + len(requests)
        endpoint.close_episode(key)
    return round(1000 * cpu / count, 3)


def harness_runs(seeds: list[int], steps: int | None, extra: list[str]) -> dict:
    """Each new harness's agent quickstart, per seed: {harness: [run, ...]}."""
    out: dict[str, list[dict]] = {}
    for name, agent in HARNESSES.items():
        for seed in seeds:
            run = one(AGENT, seed, steps, [f"--gin.samplers.agents.agent={agent}", *extra])
            out.setdefault(name, []).append({"seed": seed, **run})
            print(f"harness {name} seed {seed}: {run}", flush=True)
    return out


def model_runs(steps: int, extra: list[str]) -> dict:
    """The SmolLM2 pair, same steps: walls and their ratio, and how long a model turn is."""
    settings = [f"--gin.rlax.train.steps={steps}", f"--gin.GROUP_SIZE={MODEL_GROUP}", *extra]
    _, env_rows, env_wall = multiturn.run_quickstart(MODEL_ENV, settings)
    _, agent_rows, agent_wall = multiturn.run_quickstart(MODEL_AGENT, settings)
    print(f"model-sized: env {env_wall:.1f} s, agent {agent_wall:.1f} s", flush=True)

    def total(rows: list[dict], key: str) -> float:
        return float(sum(r.get(key, 0.0) for r in rows))

    def turn_tokens(rows: list[dict]) -> float:
        """Model tokens per turn: each episode's ids less its observations', per turn."""
        per_step = []
        for r in rows:
            episodes = r["groups_kept"] * MODEL_GROUP
            model = r["trained_tokens"] / episodes - r.get("observation_tokens_mean", 0.0)
            per_step.append(model / max(r.get("turns_mean", 1.0), 1e-9))
        return round(sum(per_step) / max(len(per_step), 1), 1)

    env_steps_s, agent_steps_s = total(env_rows, "step_s"), total(agent_rows, "step_s")
    return {
        "steps": steps,
        "env_wall_s": round(env_wall, 1),
        "agent_wall_s": round(agent_wall, 1),
        "endpoint_vs_env_model": round(agent_wall / env_wall, 3),
        # The RL steps alone (the trainer's step_s), without loading and evaluation.
        "env_steps_s": round(env_steps_s, 1),
        "agent_steps_s": round(agent_steps_s, 1),
        "endpoint_vs_env_model_steps": round(agent_steps_s / max(env_steps_s, 1e-9), 3),
        "env_turns_mean": round(total(env_rows, "turns_mean") / max(len(env_rows), 1), 3),
        "agent_turns_mean": round(total(agent_rows, "turns_mean") / max(len(agent_rows), 1), 3),
        "env_turn_tokens": turn_tokens(env_rows),
        "agent_turn_tokens": turn_tokens(agent_rows),
        "env_steps": len(env_rows),
        "agent_steps": len(agent_rows),
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
    if r["runs"]:
        guess_table(r)
    for name, gain in r.get("harness_gain_min", {}).items():
        print(f"harness {name}: worst gain {gain:+.1f} points (target >= +{GAIN_POINTS})")
    if "model" in r:
        m = r["model"]
        print(
            f"model-sized ({MODEL_AGENT} vs {MODEL_ENV}, {m['steps']} steps): "
            f"endpoint_vs_env_model {m['endpoint_vs_env_model']} (limit {MODEL_RATIO_LIMIT}); "
            f"RL steps alone {m['endpoint_vs_env_model_steps']}; turns per episode "
            f"{m['agent_turns_mean']} (agent) / {m['env_turns_mean']} (environment), "
            f"model tokens per turn {m['agent_turn_tokens']} / {m['env_turn_tokens']}"
        )
    print(
        f"server CPU per request {r['server_cpu_ms_per_request']} ms (limit {CPU_LIMIT_MS}; "
        "taken on this machine as it is: quote it only from a quiet one)"
    )


def guess_table(r: dict) -> None:
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
        f"{r['endpoint_vs_env']} (information)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--harness-seeds", default="0,1", help="seeds of each new harness")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (config's: 100)")
    parser.add_argument(
        "--model-steps", type=int, default=0, help="steps of the SmolLM2 pair (0: skipped)"
    )
    parser.add_argument(
        "--model-only",
        action="store_true",
        help="only the SmolLM2 pair (and the server's CPU): no guess runs",
    )
    parser.add_argument("--tiny", action="store_true", help="one seed, 2 steps: runs, not results")
    args, extra = parser.parse_known_args()
    bad = [a for a in extra if not a.startswith("--gin.")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (only --gin.NAME=VALUE passes on)")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        harness_seeds = [int(s) for s in args.harness_seeds.split(",") if s.strip()]
    except ValueError:
        parser.error("--seeds / --harness-seeds: comma-separated integers")
    if not seeds:
        parser.error("--seeds: at least one seed")
    steps, model_steps = args.steps, args.model_steps
    if args.tiny:
        seeds, harness_seeds, steps, model_steps = (
            seeds[:1],
            harness_seeds[:1],
            2,
            model_steps and 1,
        )
    if args.model_only and not model_steps:
        parser.error("--model-only: give --model-steps N")
    cpu = server_cpu_ms_per_request(50 if args.tiny else 200)
    try:
        r: dict = {"runs": []}
        if not args.model_only:
            r = measure(seeds, steps, extra)
            harness = harness_runs(harness_seeds, steps, extra)
            r["harness_runs"] = harness
            r["harness_gain_min"] = {k: min(x["gain"] for x in v) for k, v in harness.items()}
        if model_steps:
            r["model"] = model_runs(model_steps, extra)
            r["endpoint_vs_env_model"] = r["model"]["endpoint_vs_env_model"]
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    r["server_cpu_ms_per_request"] = cpu
    r["tiny"] = args.tiny
    table(r)
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
