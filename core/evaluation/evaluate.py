"""Held-out evaluation: pass@k of a policy on a task's eval split (``rlax eval``, and the
trainer's before/after table)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from tqdm import tqdm

from rlax.core.constraints import AtLeast
from rlax.core.contracts import Reward, Sampler
from rlax.core.errors import BadSetting, ConfigError
from rlax.core.evaluation.metrics import mean_pass_at_k
from rlax.core.models.bundle import ModelBundle, load_model
from rlax.core.rollout.groups import rollout, task_prompts
from rlax.core.types import Prompt

if TYPE_CHECKING:  # the spec sits above this layer; evaluate reads the value it is handed
    from rlax.core.spec import RunSpec


def load_policy(path: str | pathlib.Path, setting: str) -> ModelBundle:
    try:
        return load_model(path)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"{setting}: {err}") from err


Samples = Annotated[int, AtLeast(1)]  # samples per problem
K = Annotated[int, AtLeast(1)]  # the k of a pass@k


def check_eval_settings(*, eval_samples: int = 8, eval_ks: Sequence[int] = (1, 8), **_) -> None:
    """BadSetting unless every k of pass@k can be estimated from ``eval_samples`` samples.

    The unbiased estimator needs ``1 <= k <= n`` (:func:`rlax.core.evaluation.metrics.pass_at_k`).
    """
    if eval_samples < 1:
        raise BadSetting("eval_samples", f"must be >= 1, got {eval_samples}")
    if not eval_ks:
        raise BadSetting("eval_ks", "needs at least one k")
    bad = [k for k in eval_ks if not 1 <= k <= eval_samples]
    if bad:
        raise BadSetting(
            "eval_ks",
            f"pass@k needs 1 <= k <= the samples per problem ({eval_samples}); got k = "
            f"{', '.join(map(str, bad))}",
        )


@dataclasses.dataclass(frozen=True)
class HeldOutSettings:
    """The trainer's held-out evaluation, before and after RL (``rlax.held_out`` in gin)::

        rlax.held_out.samples = 8     # samples per problem
        rlax.held_out.ks = (1, 8)     # the pass@k reported, each 1 <= k <= samples

    (the run's ``held_out``, ``rlax.run.held_out``: the trainer's evaluation and
    ``rlax eval`` read the same; configs/base/roles.gin binds both from ``EVAL_SAMPLES``
    and ``EVAL_KS``.)
    """

    samples: Samples = 8
    ks: Sequence[K] = (1, 8)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ks", tuple(self.ks))
        try:
            check_eval_settings(eval_samples=self.samples, eval_ks=self.ks)
        except BadSetting as err:
            raise BadSetting(err.parameter.removeprefix("eval_"), str(err)) from None


def evaluate_pass_at_k(
    sampler: Sampler,
    reward: Reward,
    prompts: Sequence[Prompt],
    *,
    samples: int,
    ks: Sequence[int],
    seed: int,
    batch_prompts: int = 64,
    progress: bool = True,
) -> dict[str, float]:
    """pass@k over ``prompts`` from ``samples`` completions each (unbiased estimator)."""
    correct: list[np.ndarray] = []  # bool [G] per prompt
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


def evaluate(
    spec: RunSpec, *, hook: Any = None, checkpoint: pathlib.Path, out: pathlib.Path | None = None
) -> int:
    """Prints the held-out pass@k table of the model in ``checkpoint``; returns 0.

    The run's task, reward and sampler evaluate it, with ``spec.held_out``'s samples
    per problem and pass@k, from ``spec.seed``. With ``out`` (``rlax eval --out FILE``)
    the results are also written there as JSON: ``{"checkpoint", "problems", "samples",
    "seed", "pass_at_k": {"pass@1": ..., ...}}`` (fractions, as in ``eval.json``).

    Raises:
      ConfigError: the checkpoint cannot be loaded, or ``out`` cannot be
        written (checked before the evaluation).
    """
    samples, ks, seed = spec.held_out.samples, spec.held_out.ks, spec.seed
    if out is not None:
        _check_writable(out, "--out")
    bundle = load_policy(checkpoint, "--checkpoint")
    prompts = list(
        task_prompts(
            spec.task, "eval", tokenizer=bundle.tokenizer, seed=seed, setting="rlax.run.task"
        )
    )
    spec.sampler.setup(bundle.model, bundle.tokenizer)
    result = evaluate_pass_at_k(
        spec.sampler,
        spec.reward,
        prompts,
        samples=samples,
        ks=ks,
        seed=seed + 1,
        progress=spec.evaluate.progress,
    )
    print(f"{checkpoint}: {len(prompts)} held-out problems, {samples} samples each")
    print(format_eval_table({"model": result}))
    if out is not None:
        record = {
            "checkpoint": str(checkpoint),
            "problems": len(prompts),
            "samples": samples,
            "seed": seed,
            "pass_at_k": result,
        }
        tmp = out.with_name(out.name + ".tmp")  # a reader never sees half a file
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(out)
        print(f"results written to {out}")
    return 0


def _check_writable(path: pathlib.Path, what: str) -> None:
    if path.is_dir():
        raise ConfigError(f"{what} {path}: is a directory; give a file name")
    if not path.absolute().parent.is_dir():
        raise ConfigError(f"{what} {path}: no such directory {path.absolute().parent}")
