"""The multi-turn quickstart, measured: held-out success before and after RL, and wall time.

Runs ``rlax run --gin multiturn_quickstart`` (the packaged config, found by
name) in a subprocess whose working directory is a fresh temporary directory,
into a fresh run directory there: the parameter server, the trainer and two
workers playing higher/lower episodes. The baseline is the run's own
"before" row: the base policy on every secret, same sampler settings.
Success is held-out pass@1 (the share of games won). ``turns_mean`` and
``tool_calls_mean`` are per episode, averaged over the run's steps.

``retokenized_tokens`` is measured, not assumed: after the run, the trained
policy plays the held-out games once more with a recorder around the inner
sampler, and every id of every turn's prompt that is not the episode's own id
at that position (prompt + what came before) is counted, as is every id of the
trainer's batch that differs from the episode's ids.

    python benchmarks/multiturn.py [--gin.NAME=VALUE ...]

Prints a table, then one JSON line (rates as fractions)::

    {"success_before", "success_after", "turns_mean", "tool_calls_mean",
     "retokenized_tokens": 0, "wall_s"}
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

WALL_LIMIT_S = 600
GAIN_POINTS = 20


def _rlax_command() -> list[str]:
    script = pathlib.Path(sys.executable).with_name("rlax")
    if script.exists():
        return [str(script)]
    found = shutil.which("rlax")
    return [found] if found else [sys.executable, "-m", "rlax.core.cli"]


class Recorder:
    """Wraps the inner sampler: keeps each turn's prompt ids."""

    def __init__(self, inner):
        self.inner, self.prompts = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompts, n, *, seed):
        self.prompts += [p.tokens.copy() for p in prompts for _ in range(n)]
        return self.inner.generate(prompts, n, seed=seed)


def retokenized(checkpoint: pathlib.Path) -> int:
    """Ids that differ between the sampler's turns, the episodes and the trainer's batch."""
    from rlax.core.models.bundle import load_model
    from rlax.core.trainer.batches import make_batch
    from rlax.core.types import Group
    from rlax.plugins.environments.guess import GuessEnvironment, GuessTask
    from rlax.plugins.environments.runner import EpisodeSampler
    from rlax.plugins.samplers.jax_sampler import JaxSampler

    bundle = load_model(str(checkpoint))
    recorder = Recorder(JaxSampler(max_new_tokens=3, temperature=1.0))
    sampler = EpisodeSampler(sampler=recorder, environment=GuessEnvironment())
    sampler.setup(bundle.model, bundle.tokenizer)
    prompts = list(GuessTask().prompts("eval", tokenizer=bundle.tokenizer, seed=0))
    out = sampler.generate(prompts, 4, seed=1)
    episodes = [np.r_[p.tokens, c.tokens].tolist() for p, cs in zip(prompts, out) for c in cs]
    differing = 0
    for ids in recorder.prompts:  # each turn's prompt is some episode's prefix, id for id
        ids = ids.tolist()
        best = max(sum(a == b for a, b in zip(e, ids)) for e in episodes)
        differing += len(ids) - best
    groups = [Group(p, cs, np.zeros(len(cs), np.float32)) for p, cs in zip(prompts, out)]
    batch = make_batch(groups, np.zeros((len(groups), 4)), completion_len=sampler.max_new_tokens)
    for row, ids in enumerate(episodes):
        real = batch.tokens[row][batch.attention_mask[row]].tolist()
        differing += sum(a != b for a, b in zip(real, ids)) + abs(len(real) - len(ids))
    return differing


def run_quickstart(gin: str, extra: list[str], *, after=None) -> tuple[dict, list[dict], float]:
    """Runs ``rlax run --gin <gin>`` in a fresh directory: (eval.json, metrics rows, wall s).

    ``after(run_dir)`` is called before the directory goes; its value is dropped.
    """
    with tempfile.TemporaryDirectory(prefix=f"rlax-{gin}-") as tmp:
        run_dir = pathlib.Path(tmp) / "run"
        cmd = [*_rlax_command(), "run", "--gin", gin, "--run-dir", str(run_dir), *extra]
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        start = time.perf_counter()
        proc = subprocess.run(cmd, check=False, cwd=tmp, env=env)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{gin} failed with status {proc.returncode}")
        results = json.loads((run_dir / "eval.json").read_text())
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        if after is not None:
            after(run_dir)
    return results, rows, wall


def run(extra: list[str]) -> dict:
    found: list[int] = []
    results, rows, wall = run_quickstart(
        "multiturn_quickstart", extra, after=lambda d: found.append(retokenized(d / "checkpoint"))
    )
    differing = found[0]

    def mean(key: str) -> float:
        return round(float(np.mean([r[key] for r in rows if key in r])), 3)

    return {
        "success_before": round(results["before"]["pass@1"], 4),
        "success_after": round(results["after"]["pass@1"], 4),
        "turns_mean": mean("turns_mean"),
        "tool_calls_mean": mean("tool_calls_mean"),
        "retokenized_tokens": differing,
        "wall_s": round(wall, 1),
        "steps": len(rows),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _, extra = parser.parse_known_args()
    bad = [a for a in extra if not a.startswith("--gin.")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (only --gin.NAME=VALUE passes on)")
    try:
        r = run(extra)
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    gain = 100 * (r["success_after"] - r["success_before"])
    print("\nmulti-turn quickstart: held-out success (pass@1 over every secret)")
    print(f"{'baseline (base policy)':<28} {100 * r['success_before']:>6.1f}%")
    print(
        f"{'after RL (ours)':<28} {100 * r['success_after']:>6.1f}%   {gain:+.1f} points "
        f"(target >= +{GAIN_POINTS})"
    )
    print(
        f"{'turns / tool calls per ep.':<28} {r['turns_mean']:>6.2f} / {r['tool_calls_mean']:.2f}"
    )
    print(f"{'re-tokenised ids':<28} {r['retokenized_tokens']:>6d}")
    print(f"{'wall s, steps':<28} {r['wall_s']:>6.1f}   {r['steps']} (limit {WALL_LIMIT_S} s)")
    keys = (
        "success_before",
        "success_after",
        "turns_mean",
        "tool_calls_mean",
        "retokenized_tokens",
        "wall_s",
    )
    print(json.dumps({k: r[k] for k in keys}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
