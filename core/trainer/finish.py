"""The end of a trainer's run, and the held-out evaluation that frames it.

:class:`HeldOut` is pass@k on the task's eval split: the base policy's before
training (once per run: a resumed run keeps it), every ``eval_every`` steps
through the observer, and the final policy's. :func:`finish` evaluates the
final policy, exports it (``RUN/checkpoint``, written beside and swapped in,
so a resumed run replaces an earlier run's; with LoRA also ``RUN/adapter`` in
PEFT's layout), writes ``eval.json`` and the last curves, and prints the
before/after table. Every trainer process calls both; process 0 evaluates and
writes, the others take part in the collectives.
"""

from __future__ import annotations

import functools
import pathlib
from typing import Any

import jax
from flax import nnx

from rlax.core.contracts import Reward, Sampler, Task
from rlax.core.evaluation.evaluate import HeldOutSettings, evaluate_pass_at_k, format_eval_table
from rlax.core.models.bundle import ModelBundle, save_model
from rlax.core.models.lora import LoraParams, merged_state
from rlax.core.models.peft_export import save_peft_adapter
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.parallel import multihost
from rlax.core.rollout.groups import task_prompts
from rlax.core.trainer.loop import TrainingRun
from rlax.core.trainer.observe import heldout_metrics


class HeldOut:
    """The held-out evaluation before and after training: pass@k on the task's eval split."""

    def __init__(
        self,
        task: Task,
        sampler: Sampler,
        reward: Reward,
        tokenizer: Any,
        seed: int,
        held_out: HeldOutSettings | None,
        progress: bool,
    ):
        held_out = held_out or HeldOutSettings()
        split = task_prompts(task, "eval", tokenizer=tokenizer, seed=seed, setting="rlax.run.task")
        prompts = list(split)
        self.sampler = sampler
        self.what = f"{len(prompts)} problems x {held_out.samples} samples"
        self._evaluate = functools.partial(
            evaluate_pass_at_k,
            sampler,
            reward,
            prompts,
            samples=held_out.samples,
            ks=held_out.ks,
            seed=seed + 1,
            progress=progress,
        )

    def now(self) -> dict[str, float]:
        """The current policy's results (process 0; the others wait for them)."""
        return multihost.run_on_lead(self._evaluate)

    def after(self, params, version: int) -> dict[str, float]:
        """The results of ``params`` (whole arrays), loaded into the sampler as ``version``."""

        def evaluate() -> dict[str, float]:
            self.sampler.load_weights(params, version)
            return self._evaluate()

        return multihost.run_on_lead(evaluate)


def _export(path: pathlib.Path, bundle: ModelBundle) -> None:
    """``save_model`` from process 0; with several processes the others take part where needed.

    The rlax format's parameters are an orbax checkpoint, whose save is a
    collective in a multi-process program (every process calls it; process 0
    writes the arrays it was given whole). An HF directory is process 0's alone.
    """
    lead = multihost.is_lead()
    if lead or (jax.process_count() > 1 and isinstance(bundle.tokenizer, CharTokenizer)):
        save_model(path, bundle, checksums=lead)  # process 0 writes checksums.json, once


def finish(
    run: TrainingRun, hook, bundle: ModelBundle, held_out: HeldOut, before: dict[str, float]
) -> None:
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
