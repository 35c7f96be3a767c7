"""``rlax show RUN``: a run's state and its latest rollout traces, readable in a terminal.

It reads only the run directory (``metrics.jsonl``, ``eval.json``,
``rollouts.jsonl``, ``recovery.jsonl``, ``train_state/``, ``checkpoint/``), so it works on a run
that is going on, was preempted, or is finished, from any machine that sees
the directory.
"""

from __future__ import annotations

import json
import pathlib
import textwrap
import time
from collections.abc import Iterator, Sequence
from typing import Any

from rlax.core.evaluation import traces
from rlax.core.evaluation.plot import HELDOUT, PHASE_NAMES
from rlax.core.runtime.recovery import PARTS, read_rows
from rlax.core.runtime.run_dir import RunDir

#: The metrics shown first in "last metrics", when a row has them.
MAIN = (
    "reward",
    "pass_rate",
    "loss",
    "kl_old",
    "entropy",
    "groups_kept",
    "queue_depth",
    "tokens_per_s",
)


def _rows(path: pathlib.Path) -> list[dict[str, Any]]:
    return traces.read(path)  # the same JSON-lines reading: a torn last line is skipped


def checkpoint_meta(run_dir: RunDir) -> dict[str, Any] | None:
    """The metadata of the newest complete checkpoint under ``RUN/train_state``, if any."""
    states = run_dir.train_state
    steps = (
        sorted((int(p.name) for p in states.iterdir() if p.name.isdigit()), reverse=True)
        if states.is_dir()
        else []
    )
    for step in steps:
        meta = states / str(step) / "meta" / "metadata"
        if (states / str(step) / "commit_success.txt").is_file() and meta.is_file():
            try:
                return {"step": step, **json.loads(meta.read_text())}
            except (OSError, json.JSONDecodeError):
                continue
    return None


def state_lines(run_dir: RunDir, rows: Sequence[dict], meta: dict | None) -> Iterator[str]:
    done = rows[-1]["step"] if rows else 0
    finished = run_dir.finished()
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rows[-1]["time"]))
        if rows and "time" in rows[-1]
        else "-"
    )
    if finished is not None and finished >= done:
        policy = f"{run_dir.FINAL_POLICY}/"
        yield f"state: finished after step {finished} (its final policy is in {policy})"
    else:
        saved = f"step {meta['step']}" if meta else "none yet"
        yield f"state: {done} steps done, last at {when}; newest checkpoint: {saved}"
    if finished is None and meta is not None:
        role = "inline" if "drawn" in (meta.get("data") or {}) else "all"
        command = run_dir.resume_command([str(run_dir.operative_config)], [], [], role)
        yield f"resume with: {command}  (add -p for plugins loaded with -p)"


def metric_lines(rows: Sequence[dict]) -> Iterator[str]:
    if not rows:
        yield "last metrics: none (no step finished yet)"
        return
    last = rows[-1]
    shown = [k for k in MAIN if k in last]
    yield f"last metrics (step {last['step']}): " + "  ".join(f"{k} {last[k]:.4g}" for k in shown)
    if "mismatch_abs_logp" in last or "mismatch_coverage" in last:
        yield alignment_line(last)
    phases = [f"{p} {last[f'{p}_s']:.2f}" for p in PHASE_NAMES if last.get(f"{p}_s")]
    if "step_s" in last:
        yield f"  step {last['step_s']:.2f} s: " + ", ".join(phases)


def alignment_line(row: dict) -> str:
    """The train/rollout mismatch of one step's metrics, as ``rlax show`` prints it (with the
    measured share of the tokens when not all were: :mod:`rlax.core.trainer.mismatch`)."""
    if "mismatch_abs_logp" not in row:
        return "  train/rollout mismatch: not measured (no token of a version the trainer holds)"
    parts = [f"|dlogp| mean {row['mismatch_abs_logp']:.2e}"]
    if "mismatch_abs_logp_p99" in row:
        parts.append(f"p99 {row['mismatch_abs_logp_p99']:.2e}")
    if "ratio_out_of_band" in row:
        parts.append(f"ratio out of band {100 * row['ratio_out_of_band']:.1f}%")
    if row.get("mismatch_coverage", 1.0) < 1.0:
        parts.append(f"on {100 * row['mismatch_coverage']:.0f}% of the tokens")
    return "  train/rollout mismatch: " + ", ".join(parts)


def eval_lines(run_dir: RunDir, rows: Sequence[dict]) -> Iterator[str]:
    results = run_dir.read_eval()
    history: list[tuple[str, dict]] = []
    if results.get("before"):
        history.append(("before", results["before"]))
    for r in rows:
        found = {
            f"pass@{n.removeprefix(HELDOUT)}": v for n, v in r.items() if n.startswith(HELDOUT)
        }
        if found:
            history.append((f"step {r['step']}", found))
    if results.get("after"):
        history.append(("after", results["after"]))
    if not history:
        yield "held-out pass@k: not measured yet"
        return
    ks = sorted({k for _, r in history for k in r}, key=lambda k: int(k.removeprefix("pass@")))
    yield "held-out pass@k:" + "".join(f"{k:>9}" for k in ks)
    for name, r in history:
        cells = "".join(f"{100 * r[k]:>8.1f}%" if k in r else f"{'-':>9}" for k in ks)
        yield f"  {name:<14}" + cells


def trace_lines(rows: Sequence[dict], count: int, width: int = 100) -> Iterator[str]:
    if not rows:
        yield "rollout traces: none yet (rlax.watch.trace_every)"
        return
    step = rows[-1]["step"]
    latest = [r for r in rows if r["step"] == step][:count]
    yield f"rollout traces of step {step} ({len(latest)} groups):"
    for t in latest:
        yield (
            f"  prompt {t['prompt']!r}  answer {t['answer']!r}  policy v{t['policy_version']}  "
            f"mean reward {t['reward_mean']:.2f}"
        )
        for c in t["completions"]:
            text = textwrap.shorten(c["text"].replace("\n", " ") or "(empty)", width)
            yield (
                f"    {c['reward']:>6.2f}  {c['finish_reason']:<6} {c['length']:>4} tok  "
                f"v{c['policy_version']}  {text!r}  {c['reason']}"
            ).rstrip()


def recovery_lines(rows: Sequence[dict]) -> Iterator[str]:
    """The run's preemptions and restarts: when, which role, how long until it was useful
    again (:mod:`rlax.core.runtime.recovery`), its largest parts and the work redone."""
    if not rows:
        return
    total = sum(r["total_s"] for r in rows)
    yield f"preemptions and restarts: {len(rows)}, {total:.1f} s until useful again in all"
    for r in rows:
        when = time.strftime("%H:%M:%S", time.localtime(r["time"]))
        parts = sorted(((r.get(f"{p}_s", 0.0), p) for p in PARTS), reverse=True)
        shown = ", ".join(f"{p} {s:.1f}" for s, p in parts[:3] if s >= 0.05)
        redone = f"; {r['redone_steps']:.0f} steps redone" if r.get("redone_steps") else ""
        compiled = f"; compiled {r['compile_misses']}" if r.get("compile_misses") else ""
        yield (
            f"  {when}  {r['role']:<12} {r['cause']:<9} useful again after {r['total_s']:.1f} s"
            f" ({shown}){redone}{compiled}"
        )


def show_run(run_dir: RunDir | pathlib.Path, *, traces_shown: int = 2) -> str:
    """The report of ``run_dir`` as text (see the module doc)."""
    run_dir = RunDir.of(run_dir)
    rows = _rows(run_dir.metrics)
    meta = checkpoint_meta(run_dir)
    lines = [
        f"run: {run_dir}",
        *state_lines(run_dir, rows, meta),
        *metric_lines(rows),
        *eval_lines(run_dir, rows),
        *recovery_lines(read_rows(run_dir)),
        *trace_lines(_rows(run_dir.rollouts), traces_shown),
    ]
    return "\n".join(lines)
