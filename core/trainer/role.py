"""The trainer role behind ``rlax run``: :func:`train`, which returns the exit code.

``train`` wires the plugins chosen in gin into the loop of DESIGN.md §2 —
task → sampler → reward → curation → algorithm → optax update → new weights
to the sampler — for ``steps`` steps from ``init_checkpoint``. With
``inline`` (``--role inline``) rollouts are sampled in this process;
otherwise weights go to and groups come from the parameter server
(``settings``). ``task``, ``reward`` and ``sampler`` also serve the held-out
evaluation (``eval_samples`` samples per problem, pass@k for ``eval_ks``)
before and after training. It writes a run directory (``run_dir``, handed
over by ``rlax run``, or a new one under ``run_root`` named after ``run_name``;
:class:`rlax.core.runtime.run_dir.RunDir` names its files)::

    RUN/operative_config.gin           the whole gin config, every role: `rlax run --gin` it
    RUN/trainer_operative_config.gin   every value the trainer used, defaults included
    RUN/metrics.jsonl                  one line per step, with its phase timings and wall clock
    RUN/rollouts.jsonl                 sampled groups every ``trace_every`` steps
    RUN/curves.png                     learning curves, redrawn every ``plot_every`` steps
    RUN/eval.json                      held-out pass@k before, every ``eval_every`` steps, after
    RUN/checkpoint/                    the final policy (a model directory; LoRA: merged)
    RUN/adapter/                       with ``lora``: the adapters in PEFT's layout
    RUN/train_state/                   resumable checkpoints of the whole trainer state (orbax)

A trainer started on a run directory that holds a checkpoint resumes from the
newest good one (DESIGN.md §5): parameters, optimiser state, step, weight
version, the data position (the rollout queue rolls back whatever the lost
trainer consumed after that checkpoint) and the metrics log, truncated to the
steps the checkpoint covers. The whole trainer state is checkpointed every
``checkpoint_every`` steps (0: only on a preemption notice and at the end),
keeping the newest ``keep_checkpoints``. On a preemption notice (from
``preemption_notices``; None: SIGTERM and SIGINT,
:mod:`rlax.core.runtime.preemption`) the trainer finishes its step,
checkpoints and exits with status 75 (``Preempted``). With ``deterministic``
(needs ``max_staleness = 0``; workers set it too) every batch is put in a
fixed order, so a run stopped and resumed ends with the same parameters as one
that never stopped.

With ``lora`` (``@rlax.lora()``, docs/lora.md) the trainer trains low-rank
adapters on a frozen base and pushes only the adapters; workers merge them
into their own copy of the base.

``mesh``, ``trainer_settings`` and ``distributed`` lay the trainer out on
devices and hosts (docs/mesh.md; None: one device). The trainer role may run
as several processes, one per host, over one device mesh
(``rlax.train.distributed``): every one runs ``train`` with the same
configuration and the same ``run_dir`` (on storage they share; without one,
process 0 makes it). Process 0 leads: it makes the run directory, takes each
batch from the parameter server and hands it to every process (each feeds its
own rows to the step), evaluates, writes the files and exports the final
policy from the gathered parameters; every process pushes its shards of each
new version and checkpoints its part.

The run is watched while it runs (docs/observability.md): ``loggers`` get
every step's metrics and the rollout traces; every ``eval_every`` steps (0:
never) the held-out pass@k joins that step's metrics; every ``trace_every``
steps ``trace_groups`` of the batch's groups are written to
``rollouts.jsonl``; ``curves.png`` is redrawn every ``plot_every`` steps and
at a preemption (``curves = False``: never), when ``eval.json`` is written too
(:mod:`rlax.core.trainer.observe`).

An algorithm that distils from a teacher (``needs_teacher``) needs
``teacher``, a model checkpoint with the student's tokenizer, whose logprobs
join every batch as its ``ref_logprobs`` (:mod:`rlax.core.trainer.teacher`).

The loop never branches on which algorithm, reward, sampler or rollout source
it runs; their contracts are the Protocols in ``core/contracts.py``.
"""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import optax
from flax import nnx

from rlax.core.contracts import (
    Algorithm,
    Logger,
    OnlineFilter,
    Reward,
    RolloutSource,
    Sampler,
    Task,
)
from rlax.core.errors import ConfigError, Preempted
from rlax.core.evaluation.evaluate import (
    check_eval_settings,
    checked,
    evaluate_pass_at_k,
    format_eval_table,
    load_policy,
)
from rlax.core.models.bundle import ModelBundle, abstract_model, save_model
from rlax.core.models.lora import LoraConfig, LoraParams, merged_state
from rlax.core.models.lora_wire import wire_tree
from rlax.core.models.peft_export import save_peft_adapter
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.parallel import multihost
from rlax.core.parallel.mesh import MeshConfig, make_mesh
from rlax.core.parallel.multihost import DistributedSettings
from rlax.core.parallel.multihost import initialize as initialize_distributed
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.settings import ServerSettings
from rlax.core.rollout.groups import check_online_filters, task_prompts
from rlax.core.runtime.preemption import Preemption
from rlax.core.runtime.run_dir import RunDir
from rlax.core.runtime.run_files import save_run_config
from rlax.core.trainer.checkpoint import Checkpointer, Restored
from rlax.core.trainer.client import TrainerClient
from rlax.core.trainer.epochs import check_processes
from rlax.core.trainer.loop import TrainingRun, apply_restored, state_tree
from rlax.core.trainer.observe import (
    Observer,
    check_observe_settings,
    heldout_metrics,
)
from rlax.core.trainer.sources import InlineRollouts, RemoteRollouts
from rlax.core.trainer.step import Trainer, TrainerSettings
from rlax.core.trainer.teacher import Teacher, check_teacher
from rlax.core.types import ConfigPath
from rlax.core.wire import WirePlan


class _NoHooks:
    """Stands in for a plugin manager's hook relay when none is given."""

    def __getattr__(self, name: str):
        return lambda **kwargs: []


def _open_run_dir(run_dir: RunDir | pathlib.Path | None, run_root: str, run_name: str) -> RunDir:
    """The run directory ``rlax run`` hands over (made here only for a caller without one);
    process 0 says where it is.

    The config is saved once the checkpoint in it (if any) has been found
    resumable, so a refused resume leaves the run's files as they were.
    """
    if not run_dir:
        run_dir = multihost.run_on_lead(lambda: RunDir.make(run_root, run_name))
    opened = RunDir.of(run_dir).open()
    if multihost.is_lead():
        print(f"run directory: {opened}", flush=True)  # at start: a preempted run resumes there
    return opened


def _check_settings(*, inline: bool, deterministic: bool, max_staleness: int,
                    eval_samples: int, eval_ks: Sequence[int], curation: Sequence[object],
                    **observe: int) -> None:  # fmt: skip
    """ConfigError for settings that cannot work together, before any work."""
    check_online_filters(curation, "rlax.train.curation")
    if deterministic and max_staleness != 0:
        raise ConfigError(f"rlax.train.deterministic needs max_staleness = 0, got {max_staleness}")
    if inline and jax.process_count() > 1:
        raise ConfigError("--role inline runs in one process; several hosts run --role trainer")
    checked(check_eval_settings, "rlax.train", eval_samples=eval_samples, eval_ks=eval_ks)
    checked(check_observe_settings, "rlax.train", **observe)


def _restore(trainer: Trainer, run_dir: RunDir, hook, *, every: int,
             keep: int) -> tuple[Checkpointer, Restored | None]:  # fmt: skip
    """The run's checkpointer and the newest good checkpoint (applied to ``trainer``), if any."""
    on_saved = lambda step, path: hook.rlax_on_checkpoint(step=step, path=path)
    ckpt = Checkpointer(run_dir.train_state, every=every, keep=keep,
                        on_saved=on_saved if multihost.is_lead() else None)  # fmt: skip
    restored = ckpt.restore_latest(state_tree(trainer.state))
    if restored is not None:
        apply_restored(trainer, restored)
    return ckpt, restored


def _rollout_source(inline: bool, preemption: Preemption, trainer: Trainer, *, task, tokenizer,
                    sampler, reward, curation, settings, prompts_per_step, group_size,
                    max_staleness, seed) -> RolloutSource:  # fmt: skip
    """The inline source, or the parameter server's through the trainer's restart-proof client."""
    if inline:
        prompts = task.prompts("train", tokenizer=tokenizer, seed=seed)
        return InlineRollouts(
            prompts, sampler, reward, curation, group_size=group_size,
            prompts_per_step=prompts_per_step, seed=seed,
        )  # fmt: skip
    if settings is None:
        raise ConfigError("rlax.train.settings: the trainer role needs parameter server settings")
    client = TrainerClient(ParamServerClient(settings, retry_s=0.0), preemption)  # it retries
    plan = WirePlan.for_tree(wire_tree(trainer.state.params), settings.wire_dtype)
    return RemoteRollouts(
        client, plan, prompts_per_step=prompts_per_step, max_staleness=max_staleness,
        curation=curation,
    )  # fmt: skip


class _HeldOut:
    """The held-out evaluation before and after training: pass@k on the task's eval split."""

    def __init__(self, task, sampler, reward, tokenizer, *, seed: int, samples: int,
                 ks: Sequence[int], progress: bool):  # fmt: skip
        prompts = list(task_prompts(task, "eval", tokenizer=tokenizer, seed=seed,
                                    setting="rlax.train.task"))  # fmt: skip
        self.sampler, self.what = sampler, f"{len(prompts)} problems x {samples} samples"
        self._evaluate = functools.partial(evaluate_pass_at_k, sampler, reward, prompts,
                                           samples=samples, ks=ks, seed=seed + 1,
                                           progress=progress)  # fmt: skip

    def now(self) -> dict[str, float]:
        """The current policy's results (process 0; the others wait for them)."""
        return multihost.run_on_lead(self._evaluate)

    def after(self, params, version: int) -> dict[str, float]:
        """The results of ``params`` (whole arrays), loaded into the sampler as ``version``."""

        def evaluate() -> dict[str, float]:
            self.sampler.load_weights(params, version)
            return self._evaluate()

        return multihost.run_on_lead(evaluate)


def _make_trainer(bundle: ModelBundle, sampler, algorithm, optimizer, mesh: MeshConfig | None,
                  settings: TrainerSettings | None, lora: LoraConfig | None,
                  inline: bool) -> Trainer:  # fmt: skip
    """Sets the sampler up on the policy and builds the trainer (on ``mesh``'s devices).

    Pushing to the parameter server, nothing holds the weights across a step
    (the push and the held-out evaluation read them between steps), so the
    step donates them; inline, the sampler reads them in-process. The
    bundle's model then keeps the architecture only: its arrays became the
    trainer's, deleted by the first step, and a later reader of them would
    fail ("Array has been deleted"). The sampler's are replaced before use
    (the evaluation before training reads them before any step).
    """
    sampler.setup(bundle.model, bundle.tokenizer)
    trainer = Trainer(bundle.model, algorithm, optimizer, temperature=sampler.temperature,
                      mesh=make_mesh(mesh) if mesh else None, settings=settings,
                      lora=lora, donate_params=not inline)  # fmt: skip
    if trainer.donate_params:
        bundle.model = abstract_model(bundle.config)
    return trainer


def _teacher(path: ConfigPath | None, student: ModelBundle, temperature: float) -> Teacher | None:
    """The distillation teacher ``rlax.train.teacher`` names (None: no teacher)."""
    if path is None:
        return None
    teacher = Teacher(load_policy(path, "rlax.train.teacher").model, temperature=temperature)
    teacher.check_student(student.model)
    return teacher


def _run(run: TrainingRun, held_out: _HeldOut, hook, *, steps: int, progress: bool,
         **step_args) -> dict[str, float]:  # fmt: skip
    """Resumes, evaluates the base policy (once per run), trains; the "before" results.

    Closes the run's preemption watch, source and checkpointer whatever happens.
    """
    try:
        with run.preemption:
            run.resume()
            if run.lead:
                save_run_config(run.run_dir)
            run.eval_before = run.eval_before or held_out.now()
            if run.lead:
                print(f"held-out pass@k of the base policy ({held_out.what})\n"
                      f"{format_eval_table({'before': run.eval_before})}", flush=True)  # fmt: skip
            run.loop(steps, hook, progress, **step_args)
    except Preempted as err:
        err.run_dir = run.run_dir.path  # for the CLI's resume command
        raise
    finally:
        run.source.close()
        run.ckpt.close()
    return run.eval_before


def train(*, hook: Any = None, run_dir: RunDir | pathlib.Path | None = None, inline: bool = False,
          task: Task, reward: Reward, sampler: Sampler, algorithm: Algorithm,
          optimizer: optax.GradientTransformation, init_checkpoint: ConfigPath,
          settings: ServerSettings | None = None, curation: Sequence[OnlineFilter] = (),
          steps: int = 100, prompts_per_step: int = 16, group_size: int = 8,
          max_staleness: int = 0, seed: int = 0, eval_samples: int = 8,
          eval_ks: Sequence[int] = (1, 8), run_root: str = "runs", run_name: str = "run",
          progress: bool = True, checkpoint_every: int = 100, keep_checkpoints: int = 3,
          deterministic: bool = False, preemption_notices: Sequence[Any] | None = None,
          mesh: MeshConfig | None = None, trainer_settings: TrainerSettings | None = None,
          distributed: DistributedSettings | None = None, loggers: Sequence[Logger] = (),
          eval_every: int = 0, trace_every: int = 10, trace_groups: int = 2,
          plot_every: int = 50, curves: bool = True, teacher: ConfigPath | None = None,
          lora: LoraConfig | None = None) -> int:  # fmt: skip
    """The trainer role: RL from ``init_checkpoint`` for ``steps`` steps (see the module doc).

    Raises:
      Preempted: a notice came; the state was checkpointed (exit status 75).
    """
    hook = hook or _NoHooks()
    initialize_distributed(distributed)  # before anything touches a device (the CLI did it first)
    watch = {"eval_every": eval_every, "trace_every": trace_every, "trace_groups": trace_groups,
             "plot_every": plot_every, "curves": curves}  # fmt: skip
    _check_settings(inline=inline, deterministic=deterministic, max_staleness=max_staleness,
                    eval_samples=eval_samples, eval_ks=eval_ks, curation=curation,
                    **watch)  # fmt: skip
    check_teacher(algorithm, teacher)
    check_processes(trainer_settings, jax.process_count())
    bundle = load_policy(init_checkpoint, "rlax.train.init_checkpoint")
    held_out = _HeldOut(task, sampler, reward, bundle.tokenizer, seed=seed, samples=eval_samples,
                        ks=eval_ks, progress=progress)  # fmt: skip
    run_dir = _open_run_dir(run_dir, run_root, run_name)
    trainer = _make_trainer(bundle, sampler, algorithm, optimizer, mesh, trainer_settings, lora,
                            inline)  # fmt: skip
    scorer = _teacher(teacher, bundle, sampler.temperature)
    ckpt, restored = _restore(trainer, run_dir, hook, every=checkpoint_every, keep=keep_checkpoints)
    preemption = Preemption(preemption_notices, role="trainer", hook=hook)
    source = _rollout_source(
        inline, preemption, trainer, task=task, tokenizer=bundle.tokenizer, sampler=sampler,
        reward=reward, curation=curation, settings=settings, prompts_per_step=prompts_per_step,
        group_size=group_size, max_staleness=max_staleness, seed=seed,
    )  # fmt: skip
    run = TrainingRun(run_dir, trainer, source, ckpt, preemption, restored, deterministic, seed)
    run.observer = _observer(run, held_out, loggers, reward, watch)
    try:
        before = _run(run, held_out, hook, steps=steps, progress=progress,
                      group_size=group_size, completion_len=sampler.max_new_tokens,
                      teacher=scorer)  # fmt: skip
        _finish(run, hook, bundle, held_out, before)
    finally:
        run.observer.close()
    return 0


def _observer(run: TrainingRun, held_out: _HeldOut, loggers: Sequence[Logger], reward: Reward,
              watch: dict[str, Any]) -> Observer:  # fmt: skip
    """The run's observer: its loggers, traces, curves, and the held-out evaluation of now."""
    params = lambda: multihost.gather_tree(merged_state(run.trainer.state.params))  # whole
    return Observer(run.run_dir, loggers, reward=reward, lead=multihost.is_lead(),
                    evaluate=lambda: held_out.after(params(), run.version), **watch)  # fmt: skip


def _export(path: pathlib.Path, bundle: ModelBundle) -> None:
    """``save_model`` from process 0; with several processes the others take part where needed.

    The rlax format's parameters are an orbax checkpoint, whose save is a
    collective in a multi-process program (every process calls it; process 0
    writes the arrays it was given whole). An HF directory is process 0's alone.
    """
    lead = multihost.is_lead()
    if lead or (jax.process_count() > 1 and isinstance(bundle.tokenizer, CharTokenizer)):
        save_model(path, bundle, checksums=lead)  # process 0 writes checksums.json, once


def _finish(run: TrainingRun, hook, bundle: ModelBundle, held_out: _HeldOut,
            before: dict[str, float]) -> None:  # fmt: skip
    """Evaluates and exports the final policy, writes the results (process 0; the others help)."""
    params = multihost.gather_tree(merged_state(run.trainer.state.params))  # whole arrays
    results = {"before": before, "after": held_out.after(params, run.trainer.state.step)}
    model = nnx.merge(run.trainer.graphdef, params)
    run_dir, step, log = run.run_dir, run.step, run.log
    lead = multihost.is_lead()
    # Written beside, then swapped in: a resumed run replaces the final policy of an earlier one.
    if lead:
        run_dir.clear_staged_final_policy()
    multihost.barrier("rlax-export")
    _export(
        run_dir.staged_final_policy("new"), ModelBundle(model, bundle.tokenizer, {"step": step})
    )
    multihost.barrier("rlax-exported")
    if not lead:
        return
    run_dir.swap_in_final_policy()
    if isinstance(run.trainer.state.params, LoraParams):  # the adapters alone, as PEFT loads them
        lora_params = multihost.gather_tree(run.trainer.state.params)
        save_peft_adapter(run_dir.adapter, lora_params, model.cfg)
    hook.rlax_on_checkpoint(step=step, path=str(run_dir.final_policy))
    results = run.observer.save_eval(log.rows, results["before"], results["after"])
    run.observer.loggers.call("log_metrics", step, heldout_metrics(results["after"]))
    run.observer.plot(log.rows, results["before"], results["after"])
    table = format_eval_table({k: results[k] for k in ("before", "after")})
    print("\nheld-out pass@k (unbiased estimator)\n" + table)
    print(f"\nrun directory: {run_dir}", flush=True)
