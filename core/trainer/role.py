"""The experiment loop behind ``rlax run`` and ``rlax eval``.

``train`` wires the plugins chosen in gin into the loop of DESIGN.md §2 —
task → sampler → reward → curation → algorithm → optax update → new weights
to the sampler — and writes a run directory::

    RUN/operative_config.gin           the whole gin config, every role: `rlax run --gin` it
    RUN/trainer_operative_config.gin   every value the trainer used, defaults included
    RUN/metrics.jsonl                  one line per step
    RUN/curves.png                     learning curves
    RUN/eval.json                      held-out pass@k before and after
    RUN/checkpoint/                    the final policy (a model directory)
    RUN/train_state/                   resumable checkpoints of the whole trainer state (orbax)

A trainer started on a run directory that holds a checkpoint resumes from the
newest good one (DESIGN.md §5): parameters, optimiser state, step, weight
version, the data position (the rollout queue rolls back whatever the lost
trainer consumed after that checkpoint) and the metrics log, truncated to the
steps the checkpoint covers. On a preemption notice
(:mod:`rlax.core.launch.preemption`) the trainer finishes its step, checkpoints and
exits with status 75. With ``deterministic`` (needs ``max_staleness = 0``;
workers set it too) every batch is put in a fixed order, so a run stopped and
resumed ends with the same parameters as one that never stopped.

The trainer role may run as several processes, one per host, over one device
mesh (``rlax.train.distributed``, docs/mesh.md). Process 0 leads: it makes
the run directory, takes each batch from the parameter server and hands it to
every process (each feeds its own rows to the step), evaluates, writes the
files and exports the final policy from the gathered parameters; every
process pushes its shards of each new version and checkpoints its part.

The loop never branches on which algorithm, reward or sampler it runs; their
contracts are the Protocols in ``core/contracts.py``.
"""

from __future__ import annotations

import functools
import json
import pathlib
import shutil
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from rlax.core.contracts import Algorithm, OnlineFilter, Reward, Sampler, Task
from rlax.core.errors import ConfigError, Preempted
from rlax.core.evaluation.evaluate import (
    check_eval_settings,
    checked,
    evaluate_pass_at_k,
    format_eval_table,
    load_policy,
)
from rlax.core.evaluation.plot import plot_curves
from rlax.core.launch import runs
from rlax.core.launch.preemption import Preemption
from rlax.core.launch.runs import make_run_dir
from rlax.core.models.bundle import ModelBundle, save_model
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.parallel import multihost
from rlax.core.parallel.mesh import MeshConfig, make_mesh
from rlax.core.parallel.multihost import DistributedSettings
from rlax.core.parallel.multihost import initialize as initialize_distributed
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.settings import ServerSettings
from rlax.core.param_server.wire import WirePlan
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.checkpoint import Checkpointer
from rlax.core.trainer.loop import TrainingRun, apply_restored, state_tree
from rlax.core.trainer.sources import InlineRollouts, RemoteRollouts
from rlax.core.trainer.step import Trainer, TrainerSettings, batch_arrays
from rlax.core.types import ConfigPath, Group
from rlax.core.worker.rollout import generated_tokens, task_prompts


class _NoHooks:
    """Stands in for a plugin manager's hook relay when none is given."""

    def __getattr__(self, name: str):
        return lambda **kwargs: []


def _open_run_dir(run_dir: pathlib.Path | None, run_root: str, run_name: str) -> pathlib.Path:
    """The run directory, made if needed; process 0 says where it is.

    The config is saved once the checkpoint in it (if any) has been found
    resumable, so a refused resume leaves the run's files as they were.
    """
    if not run_dir:
        run_dir = multihost.run_on_lead(lambda: make_run_dir(run_root, run_name))
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if multihost.is_lead():
        print(f"run directory: {run_dir}", flush=True)  # at start: a preempted run resumes there
    return run_dir


_CONFIG_HEADER = """\
# The whole configuration of this run: every role's bindings (trainer, workers,
# parameter server, local cluster) from the gin files and --gin bindings, as
# parsed. Run it again with
#
#   rlax run --gin {run_dir}/operative_config.gin
#
# (plugins loaded with -p need -p again). trainer_operative_config.gin lists
# every value the trainer used, its defaults included.

"""


def _save_config(run_dir: pathlib.Path) -> None:
    """Writes the config that reproduces the run, and the trainer's operative values."""
    from rlax.core import config  # the CLI's gin front; library code below never reads gin

    # The operative config alone holds only what this process called (the trainer's
    # bindings): it could not start the other roles.
    header = _CONFIG_HEADER.format(run_dir=run_dir)
    (run_dir / "operative_config.gin").write_text(header + config.config_text())
    (run_dir / "trainer_operative_config.gin").write_text(config.operative_config_text())


def _entry_order(entry) -> tuple:
    """A fixed order for a batch's entries whatever order the workers delivered them in."""
    if isinstance(entry, Group):
        return (0, entry.prompt.id, "")
    return (1, "", np.asarray(entry, np.float32).tobytes().hex())


def _take_batch(source, trainer: Trainer, version: int, *, group_size: int, completion_len: int,
                deterministic: bool):  # fmt: skip
    """Process 0's part of a step: (metrics so far, the TrainBatch or None, generated tokens)."""
    entries, info = source.next_batch(version)
    if deterministic:
        entries = sorted(entries, key=_entry_order)
    rewards = np.concatenate([e.rewards if isinstance(e, Group) else e for e in entries])
    kept = [e for e in entries if isinstance(e, Group)]
    metrics: dict[str, float] = {
        "reward": float(rewards.mean()),
        "pass_rate": float((rewards >= 1.0).mean()),
        "groups_kept": len(kept),
        **info,
    }
    batch = None
    if kept:
        advantages = trainer.algorithm.advantages(np.stack([g.rewards for g in kept]))
        batch = make_batch(
            kept, advantages, row_multiple=8 * group_size, completion_len=completion_len
        )
    return metrics, batch, generated_tokens(kept)


def _own_rows(trainer: Trainer, batch):
    """The rows of the global ``batch`` this process feeds (all of them with one process)."""
    if jax.process_count() == 1:
        return batch
    arrays = batch_arrays(batch)
    rows = multihost.process_rows(trainer.mesh, len(arrays["tokens"]))
    return {name: x[rows] for name, x in arrays.items()}


def _train_step(step: int, source, trainer: Trainer, *, group_size: int, completion_len: int,
                version_offset: int = 0, deterministic: bool = False):  # fmt: skip
    """Takes one batch, updates, publishes the new weights; returns the step's metrics.

    The weight version is the trainer's step plus ``version_offset`` (nonzero
    after a resume that had to skip versions a lost trainer had published).
    With several processes, process 0 takes the batch and every process gets
    it (a notice that stopped process 0 waiting for rollouts stops them all
    here); each trains on its own rows and pushes its part of the weights.
    """
    start = time.perf_counter()
    metrics, batch, tokens = multihost.run_on_lead(
        functools.partial(
            _take_batch, source, trainer, trainer.state.step + version_offset,
            group_size=group_size, completion_len=completion_len, deterministic=deterministic,
        )
    )  # fmt: skip
    metrics = {"step": step, **metrics}
    if batch is not None:
        metrics.update(trainer.step(_own_rows(trainer, batch)))
        metrics.update(source.publish(trainer.state.params, trainer.state.step + version_offset))
    if multihost.is_lead():
        source.done()
    metrics["version"] = trainer.state.step + version_offset
    elapsed = time.perf_counter() - start
    metrics["tokens_per_s"] = tokens / elapsed
    metrics["step_s"] = elapsed
    return metrics


def _rollout_source(inline, *, task, tokenizer, sampler, reward, curation, settings, plan,
                    prompts_per_step, group_size, max_staleness, seed):  # fmt: skip
    if inline:
        prompts = task.prompts("train", tokenizer=tokenizer, seed=seed)
        return InlineRollouts(
            prompts, sampler, reward, curation, group_size=group_size,
            prompts_per_step=prompts_per_step, seed=seed,
        )  # fmt: skip
    if settings is None:
        raise ConfigError("rlax.train.settings: the trainer role needs parameter server settings")
    client = ParamServerClient(settings, retry_s=0.0)  # the trainer's wrapper retries
    return RemoteRollouts(
        client, plan, prompts_per_step=prompts_per_step, max_staleness=max_staleness,
        curation=curation,
    )  # fmt: skip


def train(
    *,
    hook: Any = None,
    run_dir: pathlib.Path | None = None,
    inline: bool = False,
    task: Task,
    reward: Reward,
    sampler: Sampler,
    algorithm: Algorithm,
    optimizer: optax.GradientTransformation,
    init_checkpoint: ConfigPath,
    settings: ServerSettings | None = None,
    curation: Sequence[OnlineFilter] = (),
    steps: int = 100,
    prompts_per_step: int = 16,
    group_size: int = 8,
    max_staleness: int = 0,
    seed: int = 0,
    eval_samples: int = 8,
    eval_ks: Sequence[int] = (1, 8),
    run_root: str = "runs",
    run_name: str = "run",
    progress: bool = True,
    checkpoint_every: int = 100,
    keep_checkpoints: int = 3,
    deterministic: bool = False,
    preemption_notices: Sequence[Any] | None = None,
    mesh: MeshConfig | None = None,
    trainer_settings: TrainerSettings | None = None,
    distributed: DistributedSettings | None = None,
) -> int:
    """The trainer role: RL from ``init_checkpoint`` for ``steps`` steps; returns the exit code.

    With ``inline`` (``--role inline``) rollouts are sampled in this process;
    otherwise weights go to and groups come from the parameter server.
    ``task``, ``reward`` and ``sampler`` also serve the held-out evaluation
    before and after training. The whole trainer state is checkpointed every
    ``checkpoint_every`` steps (0: only on a preemption notice and at the end),
    keeping the newest ``keep_checkpoints``; ``preemption_notices`` are the
    notice sources (None: SIGTERM and SIGINT). ``mesh``, ``trainer_settings``
    and ``distributed`` lay the trainer out on devices and hosts
    (docs/mesh.md; None: one device). With several processes, every one runs
    this function with the same configuration and the same ``run_dir`` (on
    storage they share; without one, process 0 makes it).

    Raises:
      Preempted: a notice came; the state was checkpointed (exit status 75).
    """
    hook = hook or _NoHooks()
    initialize_distributed(distributed)  # before anything touches a device (the CLI did it first)
    if deterministic and max_staleness != 0:
        raise ConfigError(f"rlax.train.deterministic needs max_staleness = 0, got {max_staleness}")
    if inline and jax.process_count() > 1:
        raise ConfigError("--role inline runs in one process; several hosts run --role trainer")
    checked(check_eval_settings, "rlax.train", eval_samples=eval_samples, eval_ks=eval_ks)
    lead = multihost.is_lead()
    finished = runs.finished_message(pathlib.Path(run_dir), steps) if run_dir else None
    if finished:  # re-running a finished run redoes nothing and overwrites nothing
        if lead:
            print(finished, flush=True)
        return 0
    bundle = load_policy(init_checkpoint, "rlax.train.init_checkpoint")
    eval_prompts = list(task_prompts(task, "eval", tokenizer=bundle.tokenizer, seed=seed,
                                     setting="rlax.train.task"))  # fmt: skip
    run_dir = _open_run_dir(run_dir, run_root, run_name)
    sampler.setup(bundle.model, bundle.tokenizer)
    trainer = Trainer(
        bundle.model, algorithm, optimizer, temperature=sampler.temperature,
        mesh=make_mesh(mesh) if mesh else None, settings=trainer_settings,
    )  # fmt: skip
    plan = WirePlan.for_tree(trainer.state.params, settings.wire_dtype if settings else "float32")
    ckpt = Checkpointer(
        run_dir / "train_state", every=checkpoint_every, keep=keep_checkpoints,
        on_saved=(lambda step, path: hook.rlax_on_checkpoint(step=step, path=path)) if lead else None,
    )  # fmt: skip
    restored = ckpt.restore_latest(state_tree(trainer.state))
    if restored is not None:
        apply_restored(trainer, restored)
    source = _rollout_source(
        inline, task=task, tokenizer=bundle.tokenizer, sampler=sampler, reward=reward,
        curation=curation, settings=settings, plan=plan, prompts_per_step=prompts_per_step,
        group_size=group_size, max_staleness=max_staleness, seed=seed,
    )  # fmt: skip
    preemption = Preemption(preemption_notices, role="trainer", hook=hook).start()
    try:
        run = TrainingRun(
            run_dir, trainer, source, ckpt, preemption, restored, deterministic, seed,
            train_step=_train_step,
        )  # fmt: skip
        run.resume()
        if lead:
            _save_config(run_dir)
        evaluate_now = functools.partial(
            evaluate_pass_at_k, sampler, reward, eval_prompts,
            samples=eval_samples, ks=eval_ks, seed=seed + 1, progress=progress,
        )  # fmt: skip
        results = {"before": run.eval_before or multihost.run_on_lead(evaluate_now)}
        run.eval_before = results["before"]
        if lead:
            print(
                f"held-out pass@k of the base policy ({len(eval_prompts)} problems x "
                f"{eval_samples} samples)\n{format_eval_table(results)}",
                flush=True,
            )
        run.loop(
            steps, hook, progress, group_size=group_size, completion_len=sampler.max_new_tokens
        )
    except Preempted as err:
        err.run_dir = run_dir  # for the CLI's resume command
        raise
    finally:
        preemption.close()
        source.close()
        ckpt.close()
    params = multihost.gather_tree(trainer.state.params)  # whole arrays, for one host's use

    def evaluate_after() -> dict[str, float]:
        sampler.load_weights(params, trainer.state.step)
        return evaluate_now()

    results["after"] = multihost.run_on_lead(evaluate_after)  # the others wait for it
    model = nnx.merge(trainer.graphdef, params)
    _finish(run_dir, hook, run.step, model, bundle, run.log, results)
    return 0


def _export(path: pathlib.Path, bundle: ModelBundle) -> None:
    """``save_model`` from process 0; with several processes the others take part where needed.

    The rlax format's parameters are an orbax checkpoint, whose save is a
    collective in a multi-process program (every process calls it; process 0
    writes the arrays it was given whole). An HF directory is process 0's alone.
    """
    lead = multihost.is_lead()
    if lead or (jax.process_count() > 1 and isinstance(bundle.tokenizer, CharTokenizer)):
        save_model(path, bundle, checksums=lead)  # process 0 writes checksums.json, once


def _finish(run_dir, hook, step, model, bundle, log, results) -> None:
    """Exports the final policy and writes the results (process 0; the others help export)."""
    lead = multihost.is_lead()
    # Written beside, then swapped in: a resumed run replaces the final policy of an earlier one.
    final, new, old = (run_dir / n for n in ("checkpoint", "checkpoint.new", "checkpoint.old"))
    if lead:
        for stale in (new, old):
            shutil.rmtree(stale, ignore_errors=True)
    multihost.barrier("rlax-export")
    _export(new, ModelBundle(model, bundle.tokenizer, {"step": step}))
    multihost.barrier("rlax-exported")
    if not lead:
        return
    if final.exists():
        final.rename(old)
    new.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    ckpt = final
    hook.rlax_on_checkpoint(step=step, path=str(ckpt))
    (run_dir / "eval.json").write_text(json.dumps(results, indent=2) + "\n")
    if log.rows:
        plot_curves(log.rows, run_dir / "curves.png", title=run_dir.name)
    print("\nheld-out pass@k (unbiased estimator)\n" + format_eval_table(results))
    print(f"\nrun directory: {run_dir}", flush=True)
