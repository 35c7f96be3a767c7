"""The trainer role behind ``rlax run``: :func:`train`, which returns the exit code.

``train`` takes the run specification (:class:`rlax.core.spec.RunSpec`) and wires the
plugins it names into the loop of docs/architecture.md ("The data flow") — task →
sampler → reward → curation → algorithm → optax update → new weights to the sampler —
for ``spec.train.steps`` steps from ``spec.init_checkpoint``. With ``inline``
(``--role inline``) rollouts are sampled in this process; otherwise weights go to and
groups come from the parameter server (``spec.server``). The run's task, reward and
sampler also serve the held-out evaluation before and after training
(``spec.held_out``: samples per problem and the pass@k reported;
:mod:`rlax.core.trainer.finish`). The trainer's own settings are ``spec.train``
(:class:`rlax.core.trainer.spec.TrainerSpec`, ``rlax.train`` in gin). It writes a run
directory (``run_dir``, handed over by ``rlax run``, or a new one under
``spec.train.run_root`` named after ``run_name``;
:class:`rlax.core.runtime.run_dir.RunDir` names its files)::

    RUN/operative_config.gin           the whole gin config, every role: `rlax run --gin` it
    RUN/trainer_operative_config.gin   every value the trainer used, defaults included
    RUN/metrics.jsonl                  one line per step, with its phase timings and wall clock
    RUN/rollouts.jsonl                 sampled groups every ``watch.trace_every`` steps
    RUN/curves.png                     learning curves, redrawn every ``watch.plot_every`` steps
    RUN/eval.json                      held-out pass@k before, every ``watch.eval_every`` steps, after
    RUN/checkpoint/                    the final policy (a model directory; LoRA: merged)
    RUN/adapter/                       with ``lora``: the adapters in PEFT's layout
    RUN/train_state/                   resumable checkpoints of the whole trainer state (orbax)

A trainer started on a run directory that holds a checkpoint resumes from the
newest good one (docs/preemption.md): parameters, optimiser state, step, weight
version, the data position (the rollout queue rolls back whatever the lost
trainer consumed after that checkpoint) and the metrics log, truncated to the
steps the checkpoint covers. The whole trainer state is checkpointed every
``checkpointing.every`` steps (0: only on a preemption notice and at the end),
keeping the newest ``checkpointing.keep``
(:class:`rlax.core.trainer.checkpoint.CheckpointSettings`). On a preemption notice (from
``preemption_notices``; None: SIGTERM and SIGINT,
:mod:`rlax.core.runtime.preemption`) the trainer finishes its step,
checkpoints and exits with status 75 (``Preempted``). With ``deterministic``
(``spec.deterministic``, needs ``max_staleness = 0``) every batch is put in a
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

The run is watched while it runs as ``watch`` says
(:class:`rlax.core.trainer.observe.WatchSettings`, docs/observability.md): its
loggers get every step's metrics and the rollout traces; every ``eval_every``
steps (0: never) the held-out pass@k joins that step's metrics; every
``trace_every`` steps ``trace_groups`` of the batch's groups are written to
``rollouts.jsonl``; ``curves.png`` is redrawn every ``plot_every`` steps and at
a preemption (``curves = False``: never), when ``eval.json`` is written too.

The groups are frozen settings objects, bound in gin like ``rlax.trainer_settings``
(configs/base/roles.gin binds each once)::

    rlax.checkpointing.every = 100       # rlax.train.checkpointing = @rlax.checkpointing()
    rlax.held_out.samples = 8            # rlax.run.held_out = @rlax.held_out()
    rlax.watch.eval_every = 100          # rlax.train.watch = @rlax.watch()

An algorithm that distils from a teacher (``needs_teacher``) needs
``teacher``, a model checkpoint with the student's tokenizer, whose logprobs
join every batch as its ``teacher_logprobs`` (:mod:`rlax.core.trainer.teacher`);
a KL term's ``ref_logprobs`` stay the frozen starting policy's.

The loop never branches on which algorithm, reward, sampler or rollout source
it runs; their contracts are the Protocols in ``core/contracts.py``.
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Any

import jax

from rlax.core.contracts import Reward, RolloutSource
from rlax.core.errors import ConfigError, Preempted
from rlax.core.evaluation.evaluate import format_eval_table, load_policy
from rlax.core.models.bundle import ModelBundle, abstract_model
from rlax.core.models.lora import merged_state
from rlax.core.models.lora_wire import wire_tree
from rlax.core.parallel import multihost
from rlax.core.parallel.mesh import make_mesh
from rlax.core.parallel.multihost import DistributedSettings
from rlax.core.parallel.multihost import initialize as initialize_distributed
from rlax.core.param_server.client import ParamServerClient
from rlax.core.rollout.probe import trainer_probe
from rlax.core.runtime import compile_cache, recovery
from rlax.core.runtime.preemption import Preemption
from rlax.core.runtime.run_dir import RunDir
from rlax.core.runtime.run_files import save_run_config
from rlax.core.trainer.checkpoint import Checkpointer, CheckpointSettings, Restored
from rlax.core.trainer.client import TrainerClient
from rlax.core.trainer.epochs import check_processes
from rlax.core.trainer.finish import HeldOut, finish
from rlax.core.trainer.in_process import InProcessPlacement, SamplerHost, in_process_placement
from rlax.core.trainer.loop import TrainingRun, apply_restored, state_tree
from rlax.core.trainer.observe import Observer, WatchSettings
from rlax.core.trainer.optimizer import build_optimizer
from rlax.core.trainer.sources import InlineRollouts, RemoteRollouts
from rlax.core.trainer.spec import check_teacher
from rlax.core.trainer.step import Trainer, TrainerSettings
from rlax.core.trainer.teacher import Teacher
from rlax.core.types import ConfigPath
from rlax.core.wire import WirePlan

if TYPE_CHECKING:  # the spec sits above the roles; a role reads the value it is handed
    from rlax.core.spec import RunSpec


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
    compile_cache.start_in_run(opened)  # if it waited for the run directory
    if multihost.is_lead():
        print(f"run directory: {opened}", flush=True)  # at start: a preempted run resumes there
    return opened


def _start_process(distributed: DistributedSettings | None) -> None:
    """Joins the trainer's processes before any device work, then starts the recovery clock."""
    initialize_distributed(distributed)
    recovery.begin("trainer").init_backend()


def _check_settings(inline: bool, trainer_settings: TrainerSettings | None) -> None:
    """ConfigError for settings this trainer's processes cannot run, before any work (the
    rules between settings were checked with the whole run: :mod:`rlax.core.spec.checks`)."""
    if inline and jax.process_count() > 1:
        raise ConfigError("--role inline runs in one process; several hosts run --role trainer")
    check_processes(trainer_settings, jax.process_count())


def _restore(
    trainer: Trainer, run_dir: RunDir, hook, checkpointing: CheckpointSettings
) -> tuple[Checkpointer, Restored | None]:
    """The run's checkpointer and the newest good checkpoint (applied to ``trainer``), if any."""
    recovery.mark("load")  # a restarted trainer's way back: all before the restore
    trainer.prefetch_programs()  # read while the checkpoint is restored and rollouts come
    on_saved = lambda step, path: hook.rlax_on_checkpoint(step=step, path=path)
    ckpt = Checkpointer(
        run_dir.train_state,
        every=checkpointing.every,
        keep=checkpointing.keep,
        on_saved=on_saved if multihost.is_lead() else None,
    )
    restored = ckpt.restore_latest(state_tree(trainer.state), start_over=run_dir.start_over)
    if restored is not None:
        apply_restored(trainer, restored)
    return ckpt, restored


def _rollout_source(
    spec: RunSpec, tokenizer: Any, inline: bool, preemption: Preemption, trainer: Trainer
) -> RolloutSource:
    """The inline source, or the parameter server's through the trainer's restart-proof client."""
    if inline:
        prompts = spec.task.prompts("train", tokenizer=tokenizer, seed=spec.seed)
        return InlineRollouts(
            prompts,
            spec.sampler,
            spec.reward,
            spec.curation,
            group_size=spec.group_size,
            prompts_per_step=spec.prompts_per_step,
            seed=spec.seed,
        )
    client = TrainerClient(ParamServerClient(spec.server, retry_s=0.0), preemption)  # it retries
    plan = WirePlan.for_tree(wire_tree(trainer.state.params), spec.server.wire_dtype)
    check = spec.worker.probe_check  # the workers' weight-load check needs each version's probe
    return RemoteRollouts(
        client,
        plan,
        prompts_per_step=spec.prompts_per_step,
        max_staleness=spec.max_staleness,
        curation=spec.curation,
        probe=trainer_probe(trainer.graphdef, spec.server.wire_dtype) if check else None,
    )


def _make_trainer(
    bundle: ModelBundle, spec: RunSpec, inline: bool, where: InProcessPlacement | None = None
) -> Trainer:
    """Sets the sampler up on the policy and builds the trainer (on ``spec.train.mesh``'s
    devices; hosting the sampler, the mesh is over the trainer's devices of ``where``).

    Pushing to the parameter server, nothing holds the weights across a step
    (the push and the held-out evaluation read them between steps), so the
    step donates them; inline, the sampler reads them in-process. The
    bundle's model then keeps the architecture only: its arrays became the
    trainer's, deleted by the first step, and a later reader of them would
    fail ("Array has been deleted"). The sampler's are replaced before use
    (the evaluation before training reads them before any step).
    """
    t = spec.train
    if t.algorithm is None or t.optimizer is None:
        missing = "algorithm" if t.algorithm is None else "optimizer"
        raise ConfigError(f"rlax.train.{missing}: not set (e.g. include 'algorithms/grpo.gin')")
    spec.sampler.setup(bundle.model, bundle.tokenizer)
    trainer = Trainer(
        bundle.model,
        t.algorithm,
        build_optimizer(t.optimizer),
        temperature=spec.sampler.temperature,
        mesh=make_mesh(t.mesh, where.trainer) if where else make_mesh(t.mesh) if t.mesh else None,
        settings=t.trainer_settings,
        lora=t.lora,
        donate_params=not inline,
    )
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


def _run(
    run: TrainingRun, held_out: HeldOut, hook, spec: RunSpec, teacher: Teacher | None
) -> dict[str, float]:
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
                print(
                    f"held-out pass@k of the base policy ({held_out.what})\n"
                    f"{format_eval_table({'before': run.eval_before})}",
                    flush=True,
                )
            completion_len = spec.sampler.max_new_tokens
            step_args = {"group_size": spec.group_size, "completion_len": completion_len}
            run.loop(spec.train.steps, hook, spec.train.progress, **step_args, teacher=teacher)
    except Preempted as err:
        err.run_dir = run.run_dir.path  # for the CLI's resume command
        raise
    finally:
        run.source.close()
        run.ckpt.close()
    return run.eval_before


def train(
    spec: RunSpec,
    *,
    hook: Any = None,
    run_dir: RunDir | pathlib.Path | None = None,
    inline: bool = False,
) -> int:
    """The trainer role: RL from ``spec.init_checkpoint`` for ``spec.train.steps`` steps
    (see the module doc).

    Args:
      spec: the run (:class:`rlax.core.spec.RunSpec`); the trainer's own part is
        ``spec.train``.
      hook: the plugin manager's hook relay (lifecycle hooks); None: no hooks.
      run_dir: the run directory ``rlax run`` made or resumes (None: a new one).
      inline: sample in this process (``--role inline``) instead of taking groups from
        the parameter server.

    Raises:
      Preempted: a notice came; the state was checkpointed (exit status 75).
    """
    t = spec.train
    _start_process(t.distributed)
    _check_settings(inline, t.trainer_settings)
    check_teacher(t.algorithm, t.teacher)
    bundle = load_policy(spec.init_checkpoint, "rlax.run.init_checkpoint")
    evaluation = HeldOut(
        spec.task, spec.sampler, spec.reward, bundle.tokenizer, spec.seed, spec.held_out, t.progress
    )
    run_dir, hook = _open_run_dir(run_dir, t.run_root, t.run_name), hook or _NoHooks()
    where = in_process_placement(spec.placement, inline=inline)  # None: workers elsewhere
    host = SamplerHost(spec, where) if where else None  # its sampler copies: before setup
    trainer = _make_trainer(bundle, spec, inline, where)
    scorer = _teacher(t.teacher, bundle, spec.sampler.temperature)
    ckpt, restored = _restore(trainer, run_dir, hook, t.checkpointing)
    preemption = Preemption(t.preemption_notices, role="trainer", hook=hook)
    source = _rollout_source(spec, bundle.tokenizer, inline, preemption, trainer)
    if host is not None:  # one process, two meshes (rlax.core.trainer.in_process)
        source = host.source(source, trainer)
        host.start(bundle.config, bundle.tokenizer, preemption)
    run = TrainingRun(
        run_dir, trainer, source, ckpt, preemption, restored, spec.deterministic, spec.seed
    )
    run.observer = _observer(run, evaluation, t.watch, spec.reward)
    try:
        before = _run(run, evaluation, hook, spec, scorer)
        finish(run, hook, bundle, evaluation, before)
    finally:
        run.observer.close()
        if host is not None:
            host.close()
    return 0


def _observer(
    run: TrainingRun, held_out: HeldOut, watch: WatchSettings, reward: Reward
) -> Observer:
    """The run's observer: its loggers, traces, curves, and the held-out evaluation of now."""
    params = lambda: multihost.gather_tree(merged_state(run.trainer.state.params))  # whole
    return Observer(
        run.run_dir,
        watch.loggers,
        reward=reward,
        lead=multihost.is_lead(),
        evaluate=lambda: held_out.after(params(), run.version),
        **watch.schedule(),
    )
