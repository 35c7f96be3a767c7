"""The experiment loop behind ``rlax run`` and ``rlax eval``.

``train`` wires the plugins chosen in gin into the loop of DESIGN.md §2 —
task → sampler → reward → curation → algorithm → optax update → new weights
to the sampler — and writes a run directory::

    RUN/operative_config.gin   the gin config as it was used
    RUN/metrics.jsonl          one line per step
    RUN/curves.png             learning curves
    RUN/eval.json              held-out pass@k before and after
    RUN/checkpoint/            the final policy (a model directory)

The loop never branches on which algorithm, reward or sampler it runs; their
contracts are the Protocols in ``core/rollout.py`` and ``core/trainer.py``.
"""

from __future__ import annotations

import functools
import itertools
import json
import pathlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import optax
from tqdm import tqdm

from rlax.core.batching import make_batch
from rlax.core.errors import ConfigError
from rlax.core.metrics import MetricsLog, mean_pass_at_k
from rlax.core.models.bundle import ModelBundle, load_model, save_model
from rlax.core.plot import plot_curves
from rlax.core.rollout import generated_tokens, rollout
from rlax.core.trainer import Trainer
from rlax.core.types import Prompt


class _NoHooks:
    """Stands in for a plugin manager's hook relay when none is given."""

    def __getattr__(self, name: str):
        return lambda **kwargs: []


def make_run_dir(run_root: str | pathlib.Path, run_name: str) -> pathlib.Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in itertools.count():
        path = pathlib.Path(run_root) / (f"{run_name}-{stamp}" + (f"-{i}" if i else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def _load_policy(path: str | pathlib.Path, setting: str) -> ModelBundle:
    try:
        return load_model(path)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"{setting}: {err}") from err


def _save_config(run_dir: pathlib.Path) -> None:
    from rlax.core import config  # the CLI's gin front; library code below never reads gin

    (run_dir / "operative_config.gin").write_text(config.operative_config_text())


def evaluate_pass_at_k(
    sampler: Any,
    reward: Any,
    prompts: Sequence[Prompt],
    *,
    samples: int,
    ks: Sequence[int],
    seed: int,
    batch_prompts: int = 64,
    progress: bool = True,
) -> dict[str, float]:
    """pass@k over ``prompts`` from ``samples`` completions each (unbiased estimator)."""
    correct = []
    chunks = range(0, len(prompts), batch_prompts)
    for i in tqdm(chunks, desc="eval", disable=not progress, leave=False):
        groups = rollout(prompts[i : i + batch_prompts], sampler, reward, samples, seed + i)
        correct.extend(g.rewards >= 1.0 for g in groups)
    return mean_pass_at_k(np.array(correct), ks)


def format_eval_table(rows: dict[str, dict[str, float]]) -> str:
    """Rows like {"before": {"pass@1": .1, ...}, "after": {...}} as an aligned text table."""
    keys = list(next(iter(rows.values())))
    lines = [f"{'':<8}" + "".join(f"{k:>10}" for k in keys)]
    for name, values in rows.items():
        lines.append(f"{name:<8}" + "".join(f"{100 * values[k]:>9.1f}%" for k in keys))
    if len(rows) == 2:
        before, after = rows.values()
        lines.append(
            f"{'change':<8}" + "".join(f"{100 * (after[k] - before[k]):>+9.1f} " for k in keys)
        )
    return "\n".join(lines)


def _batches(stream: Iterator[Prompt], size: int) -> Iterator[list[Prompt]]:
    while True:
        yield list(itertools.islice(stream, size))


def _train_step(step, prompts, *, sampler, reward, curation, trainer, group_size, seed):
    """One rollout + update; returns the step's metrics (no update if every group was filtered)."""
    start = time.perf_counter()
    groups = rollout(prompts, sampler, reward, group_size, seed=seed * 1_000_003 + step)
    rewards = np.stack([g.rewards for g in groups])
    metrics = {
        "step": step,
        "reward": float(rewards.mean()),
        "pass_rate": float((rewards >= 1.0).mean()),
        "policy_version": sampler.version,
    }
    kept = groups
    for f in curation:
        kept = f.online(kept)
    metrics["groups_kept"] = len(kept)
    if kept:
        advantages = trainer.algorithm.advantages(np.stack([g.rewards for g in kept]))
        metrics.update(
            trainer.step(
                make_batch(
                    kept,
                    advantages,
                    row_multiple=8 * group_size,
                    completion_len=sampler.max_new_tokens,
                )
            )
        )
        sampler.load_weights(trainer.state.params, trainer.state.step)
    elapsed = time.perf_counter() - start
    metrics["tokens_per_s"] = generated_tokens(groups) / elapsed
    metrics["step_s"] = elapsed
    return metrics


def train(
    *,
    hook: Any = None,
    run_dir: pathlib.Path | None = None,
    task: Any,
    reward: Any,
    sampler: Any,
    algorithm: Any,
    optimizer: optax.GradientTransformation,
    init_checkpoint: str,
    curation: Sequence[Any] = (),
    steps: int = 100,
    prompts_per_step: int = 16,
    group_size: int = 8,
    seed: int = 0,
    eval_samples: int = 8,
    eval_ks: Sequence[int] = (1, 8),
    run_root: str = "runs",
    run_name: str = "run",
    progress: bool = True,
) -> int:
    """Runs RL from ``init_checkpoint`` for ``steps`` steps; returns the exit code (0)."""
    hook = hook or _NoHooks()
    bundle = _load_policy(init_checkpoint, "rlax.train.init_checkpoint")
    run_dir = pathlib.Path(run_dir) if run_dir else make_run_dir(run_root, run_name)
    run_dir.mkdir(parents=True, exist_ok=True)
    _save_config(run_dir)
    sampler.setup(bundle.model, bundle.tokenizer)
    trainer = Trainer(bundle.model, algorithm, optimizer, temperature=sampler.temperature)
    eval_prompts = list(task.prompts("eval", tokenizer=bundle.tokenizer, seed=seed))
    evaluate_now = functools.partial(
        evaluate_pass_at_k, sampler, reward, eval_prompts,
        samples=eval_samples, ks=eval_ks, seed=seed + 1, progress=progress,
    )  # fmt: skip
    results = {"before": evaluate_now()}
    print(
        f"held-out pass@k of the base policy ({len(eval_prompts)} problems x {eval_samples} "
        f"samples)\n{format_eval_table(results)}",
        flush=True,
    )
    log = MetricsLog(run_dir / "metrics.jsonl")
    stream = _batches(
        task.prompts("train", tokenizer=bundle.tokenizer, seed=seed), prompts_per_step
    )
    bar = tqdm(range(steps), desc="rl", disable=not progress)
    for step in bar:
        metrics = _train_step(
            step, next(stream), sampler=sampler, reward=reward, curation=curation,
            trainer=trainer, group_size=group_size, seed=seed,
        )  # fmt: skip
        log.write(metrics)
        bar.set_postfix(
            reward=f"{metrics['reward']:.2f}", kl=f"{metrics.get('kl_old', 0):.1e}", refresh=False
        )
        hook.rlax_on_step_end(step=step, metrics=metrics)
        hook.rlax_on_weights_published(version=trainer.state.step)
    results["after"] = evaluate_now()
    _finish(run_dir, hook, trainer, bundle, log, results)
    return 0


def _finish(run_dir, hook, trainer, bundle, log, results) -> None:
    ckpt = save_model(
        run_dir / "checkpoint",
        ModelBundle(trainer.model(), bundle.tokenizer, {"step": trainer.state.step}),
    )
    hook.rlax_on_checkpoint(step=trainer.state.step, path=str(ckpt))
    (run_dir / "eval.json").write_text(json.dumps(results, indent=2) + "\n")
    if log.rows:
        plot_curves(log.rows, run_dir / "curves.png", title=run_dir.name)
    print("\nheld-out pass@k (unbiased estimator)\n" + format_eval_table(results))
    print(f"\nrun directory: {run_dir}", flush=True)


def evaluate(
    *,
    hook: Any = None,
    checkpoint: pathlib.Path,
    task: Any,
    reward: Any,
    sampler: Any,
    seed: int = 0,
    eval_samples: int = 8,
    eval_ks: Sequence[int] = (1, 8),
    progress: bool = True,
) -> int:
    """Prints the held-out pass@k table of the model in ``checkpoint``; returns 0."""
    bundle = _load_policy(checkpoint, "--checkpoint")
    sampler.setup(bundle.model, bundle.tokenizer)
    prompts = list(task.prompts("eval", tokenizer=bundle.tokenizer, seed=seed))
    result = evaluate_pass_at_k(
        sampler, reward, prompts, samples=eval_samples, ks=eval_ks, seed=seed + 1, progress=progress
    )
    print(f"{checkpoint}: {len(prompts)} held-out problems, {eval_samples} samples each")
    print(format_eval_table({"model": result}))
    return 0
